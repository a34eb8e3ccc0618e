"""Engine parts and their heartbeats (the CLI's ``sluice jobs list``), and the Celery queues.

- ``GET /jobs``: a page of jobs by type then id (``?job_type=&include_ended=``): host, pid,
  state, heartbeat age, alive?, load (triggers or tasks held), capacity, a Celery worker's
  queues and, for an executor job, the tries it runs now;
- ``GET /queues``: per Celery queue, the tries queued and running and the live workers that
  consume it (what ``sluice_celery_queue_tries`` counts).
"""

from functools import partial

from fastapi import APIRouter
from pydantic import BaseModel, Field

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.rest.common import Limit, Offset, Page, read
from engine.api.security import ReaderDep
from engine.db.models import utcnow
from engine.views import jobs as jobs_view
from engine.views.common import Page as ViewPage

router = APIRouter(tags=["jobs"])


class RunningTry(BaseModel):
    dag_id: str
    run_id: str
    task_id: str
    map_index: int = Field(description="The copy of a mapped task (-1: an unmapped task)")
    try_number: int
    started: str | None


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
    ended: str | None = None
    running_tries: list[RunningTry] | None = Field(
        default=None,
        description="An executor's (local or Celery worker) tries running now, oldest first "
        "(at most 100; `load` counts them all)",
    )


class QueueItem(BaseModel):
    queue: str
    queued: int = Field(description="Tries sent to the queue that no worker started yet")
    running: int
    workers: list[int] = Field(description="Ids of the live worker jobs that consume it")


class Queues(BaseModel):
    executor_kind: str = Field(description="[executor] kind: local or celery")
    items: list[QueueItem]


@router.get("/jobs", response_model=Page[JobItem], summary="Engine parts and their heartbeats")
async def list_jobs(
    _: ReaderDep,
    database: DatabaseDep,
    config: ConfigDep,
    job_type: str | None = None,
    include_ended: bool = False,
    limit: Limit = 50,
    offset: Offset = 0,
) -> ViewPage[jobs_view.JobItem]:
    query = partial(
        jobs_view.list_jobs,
        now=utcnow(),
        config=config,
        include_ended=include_ended,
        job_type=job_type,
        limit=limit,
        offset=offset,
    )
    return await read(database, query)


@router.get("/queues", response_model=Queues, summary="Celery queues: tries and workers")
async def list_queues(_: ReaderDep, database: DatabaseDep, config: ConfigDep) -> jobs_view.Queues:
    return await read(database, partial(jobs_view.list_queues, now=utcnow(), config=config))
