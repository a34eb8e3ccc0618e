"""DAG runs: list, show, cancel (the CLI's ``sluice runs``).

- ``GET /runs``: a page of runs of every DAG, newest first (``?dag_id=&state=&run_type=
  &since=&partition_key=``);
- ``GET /dags/{dag_id}/runs``: the same for one DAG (404 for an unknown DAG);
- ``GET /dags/{dag_id}/runs/{run_id}``: one run with its ``conf``, the asset events that
  triggered it and its task instances;
- ``POST /dags/{dag_id}/runs/{run_id}/cancel`` (op): mark a queued or running run failed
  (409 when it already ended).
"""

from functools import partial
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from engine.api.deps import DatabaseDep
from engine.api.rest.common import (
    FilterDate,
    Limit,
    Offset,
    Page,
    PartitionKey,
    act,
    found,
    not_found,
    read,
)
from engine.api.rest.tasks import TaskChangeItem, TaskInstanceItem
from engine.api.security import OperatorDep, ReaderDep
from engine.db.models import utcnow
from engine.db.queries import dags as dags_sql
from engine.db.queries import run_ends
from engine.states import DagRunState
from engine.views import runs as runs_view
from engine.views.common import Page as ViewPage

router = APIRouter(tags=["runs"])

RunStateName = Literal["queued", "running", "success", "failed"]
RunTypeName = Literal["manual", "scheduled", "asset_triggered", "backfill"]


class RunItem(BaseModel):
    dag_id: str
    run_id: str
    run_type: str
    state: str
    logical_date: str | None
    data_interval_start: str | None
    data_interval_end: str | None
    run_after: str | None
    backfill_id: int | None
    partition_key: str | None = Field(description="The slice it processes (None: unpartitioned)")
    queued_at: str
    start_date: str | None
    end_date: str | None
    duration_s: float | None = Field(description="Seconds run so far (to the end when ended)")
    asset_events: list[int] = Field(description="Ids of the asset events that triggered it")
    tasks: dict[str, str] = Field(description="Task (``task[i]``: a mapped copy) -> state")


class TriggeringEvent(BaseModel):
    id: int
    asset: str
    source: str | None
    timestamp: str
    partition_key: str | None


class RunDetail(RunItem):
    conf: Any
    triggering_events: list[TriggeringEvent]
    task_instances: list[TaskInstanceItem]


class CancelledRun(BaseModel):
    dag_id: str
    run_id: str
    state: str = Field(description="The state it had")
    new_state: str
    tasks: list[TaskChangeItem]


async def _runs(
    database: DatabaseDep,
    *,
    dag_id: str | None,
    state: RunStateName | None,
    run_type: RunTypeName | None,
    since: FilterDate | None,
    partition_key: str | None,
    limit: int,
    offset: int,
) -> ViewPage[runs_view.RunItem]:
    query = partial(
        runs_view.list_runs,
        now=utcnow(),
        dag_id=dag_id,
        state=state,
        run_type=run_type,
        since=since,
        partition_key=partition_key,
        limit=limit,
        offset=offset,
    )
    return await read(database, query)


@router.get("/runs", response_model=Page[RunItem], summary="Runs of every DAG, newest first")
async def list_runs(
    _: ReaderDep,
    database: DatabaseDep,
    dag_id: str | None = None,
    state: RunStateName | None = None,
    run_type: RunTypeName | None = None,
    since: FilterDate | None = None,
    partition_key: PartitionKey = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> ViewPage[runs_view.RunItem]:
    return await _runs(
        database,
        dag_id=dag_id,
        state=state,
        run_type=run_type,
        since=since,
        partition_key=partition_key,
        limit=limit,
        offset=offset,
    )


@router.get("/dags/{dag_id}/runs", response_model=Page[RunItem], summary="Runs of one DAG")
async def list_dag_runs(
    _: ReaderDep,
    database: DatabaseDep,
    dag_id: str,
    state: RunStateName | None = None,
    run_type: RunTypeName | None = None,
    since: FilterDate | None = None,
    partition_key: PartitionKey = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> ViewPage[runs_view.RunItem]:
    if not await read(database, partial(dags_sql.dag_exists, dag_id=dag_id)):
        not_found(f"no DAG {dag_id!r}")
    return await _runs(
        database,
        dag_id=dag_id,
        state=state,
        run_type=run_type,
        since=since,
        partition_key=partition_key,
        limit=limit,
        offset=offset,
    )


@router.get("/dags/{dag_id}/runs/{run_id}", response_model=RunDetail, summary="One run")
async def show_run(
    _: ReaderDep, database: DatabaseDep, dag_id: str, run_id: str
) -> runs_view.RunDetails:
    shown = await read(
        database, partial(runs_view.show_run, dag_id=dag_id, run_id=run_id, now=utcnow())
    )
    return found(shown, f"DAG {dag_id!r} has no run {run_id!r}")


@router.post(
    "/dags/{dag_id}/runs/{run_id}/cancel",
    response_model=CancelledRun,
    summary="Mark a queued or running run failed",
    responses={409: {"description": "The run already ended"}},
)
async def cancel_run(
    _: OperatorDep, database: DatabaseDep, dag_id: str, run_id: str
) -> dict[str, Any]:
    cancel = partial(run_ends.cancel_run, dag_id=dag_id, run_id=run_id, now=utcnow())
    ended: run_ends.EndedRun = await act(database, cancel)
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "state": ended.old_state,
        "new_state": DagRunState.FAILED,
        "tasks": [c.as_dict() for c in ended.tasks],
    }
