"""Triggers and who runs them (the CLI's ``sluice triggers list``).

- ``GET /triggers``: a page of trigger rows by id (``?kind=task|watcher&triggerer_id=``):
  class path, what it serves, its triggerer (host, alive?, claimed at), failures and last
  error. Never the kwargs: they are stored encrypted and hold secrets.
"""

from functools import partial
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.rest.common import IdFilter, Limit, Offset, Page, read
from engine.api.security import ReaderDep
from engine.db.models import utcnow
from engine.views import triggers as triggers_view
from engine.views.common import Page as ViewPage

router = APIRouter(tags=["triggers"])


class TriggerItem(BaseModel):
    id: int
    classpath: str
    kind: str = Field(description="task (a deferred task) or watcher (an asset watcher)")
    serves: str | None = Field(description="The deferred task(s) or watcher(s) it serves")
    triggerer_id: int | None = Field(description="The triggerer job running it")
    owner_hostname: str | None
    owner_alive: bool | None
    claimed_at: str | None
    created_date: str
    age_s: float | None
    failures: int
    last_failure_age_s: float | None
    load_failed: bool = Field(description="Its class or kwargs could not be loaded")
    last_error: str | None


@router.get("/triggers", response_model=Page[TriggerItem], summary="Triggers and their owners")
async def list_triggers(
    _: ReaderDep,
    database: DatabaseDep,
    config: ConfigDep,
    kind: Literal["task", "watcher"] | None = None,
    triggerer_id: IdFilter = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> ViewPage[triggers_view.TriggerItem]:
    query = partial(
        triggers_view.list_triggers,
        now=utcnow(),
        config=config,
        kind=kind,
        triggerer_id=triggerer_id,
        limit=limit,
        offset=offset,
    )
    return await read(database, query)
