"""Engine parts and their heartbeats (the CLI's ``sluice jobs list``).

- ``GET /jobs``: a page of jobs by type then id (``?job_type=&include_ended=``): host, pid,
  state, heartbeat age, alive?, load (triggers or tasks held) and capacity.
"""

from functools import partial
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.rest.common import Limit, Offset, Page, read
from engine.api.security import ReaderDep
from engine.db.models import utcnow
from engine.db.views import ops as ops_view

router = APIRouter(tags=["jobs"])


class JobItem(BaseModel):
    id: int
    type: str = Field(description="dag_processor, scheduler, executor, triggerer, api")
    hostname: str | None
    pid: int | None
    state: str
    heartbeat_age_s: float | None
    alive: bool
    load: int | None = Field(description="Triggers (triggerer) or tasks (executor) it holds")
    capacity: int | None
    queues: list[str] | None = Field(
        default=None, description="The Celery queues it consumes (a `sluice celery worker`)"
    )
    started: str


@router.get("/jobs", response_model=Page[JobItem], summary="Engine parts and their heartbeats")
async def list_jobs(
    _: ReaderDep,
    database: DatabaseDep,
    config: ConfigDep,
    job_type: str | None = None,
    include_ended: bool = False,
    limit: Limit = 50,
    offset: Offset = 0,
) -> dict[str, Any]:
    query = partial(
        ops_view.list_jobs,
        now=utcnow(),
        config=config,
        include_ended=include_ended,
        job_type=job_type,
        limit=limit,
        offset=offset,
    )
    return await read(database, query)
