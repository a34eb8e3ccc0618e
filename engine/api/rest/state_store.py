"""The state stores, read (the CLI's ``sluice tasks state`` / ``sluice assets state``):

- ``GET /dags/{dag_id}/runs/{run_id}/tasks/{task_id}/state-store?map_index=``: what the task
  instance keeps in its task state store, by key (404 for no such task instance);
- ``GET /asset-state-store/{name}``: what the asset keeps in its asset state store, by key (404
  for no such asset).
"""

from datetime import datetime
from functools import partial
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict

from engine.api.deps import DatabaseDep
from engine.api.rest.common import MapIndex, not_found, read
from engine.api.security import ReaderDep
from engine.db.queries import state_store as state_sql
from engine.views import tasks as tasks_view

router = APIRouter(tags=["state stores"])


class StateEntryItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    value: Any
    updated_at: datetime
    #: when ``sluice db clean`` may delete it; None: never (asset entries never expire)
    expires_at: datetime | None


class StateEntries(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entries: list[StateEntryItem]


def _shown(entries: list[state_sql.StateEntry]) -> StateEntries:
    return StateEntries(
        entries=[
            StateEntryItem(
                key=e.key, value=e.value, updated_at=e.updated_at, expires_at=e.expires_at
            )
            for e in entries
        ]
    )


@router.get(
    "/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/state-store",
    response_model=StateEntries,
    summary="A task instance's task state store",
)
async def task_state(
    _: ReaderDep,
    database: DatabaseDep,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: MapIndex = -1,
) -> StateEntries:
    entries = await read(
        database,
        partial(
            state_sql.task_state_entries,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=map_index,
        ),
    )
    if entries is None:
        missing = partial(
            tasks_view.missing_task_instance,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=map_index,
        )
        not_found(await read(database, missing))
    return _shown(entries)


@router.get(
    "/asset-state-store/{name:path}", response_model=StateEntries, summary="An asset's state store"
)
async def asset_state(_: ReaderDep, database: DatabaseDep, name: str) -> StateEntries:
    entries = await read(database, partial(state_sql.asset_state_entries, asset=name))
    if entries is None:
        not_found(f"no asset named {name!r}")
    return _shown(entries)
