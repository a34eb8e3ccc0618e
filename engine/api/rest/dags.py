"""DAGs: list, show, pause / unpause, trigger a manual run (the CLI's ``sluice dags``).

- ``GET /dags``: a page of DAGs (``?paused=&active=&tag=&search=``): schedule in words,
  next time run, tags, the states of the last runs and the runs per state;
- ``GET /dags/{dag_id}``: one DAG with its tasks, the watchers of its assets, its last runs;
- ``POST /dags/{dag_id}/pause``, ``POST /dags/{dag_id}/unpause`` (op);
- ``POST /dags/{dag_id}/runs`` (op): a manual run with ``conf`` (a JSON object) at
  ``logical_date`` (default: now).
"""

from datetime import UTC
from functools import partial
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from engine.api.deps import DatabaseDep
from engine.api.rest.common import (
    BoundedDate,
    Limit,
    Offset,
    Page,
    RequestBody,
    Search,
    act,
    found,
    not_found,
    read,
)
from engine.api.security import OperatorDep, ReaderDep
from engine.db.models import utcnow
from engine.db.queries import dags as dags_sql
from engine.views import dags as dags_view
from engine.views import operations
from engine.views.common import Page as ViewPage
from triggers.base import MAX_PARTITION_KEY_LENGTH

router = APIRouter(tags=["dags"])


class DagItem(BaseModel):
    dag_id: str
    display_name: str
    description: str | None
    fileloc: str
    paused: bool
    active: bool
    schedule: str = Field(description="The schedule in words: time schedule and/or assets")
    asset_condition: Any = Field(description="The asset condition as stored (JSON), if any")
    timetable: str | None = Field(description="The time schedule's summary, if any")
    timezone: str
    start_date: str | None
    end_date: str | None
    catchup: bool
    max_active_runs: int
    tags: list[str]
    next_run: str = Field(description="The next time run's logical date, or why there is none")
    next_dagrun: str | None
    next_dagrun_data_interval: list[str | None] | None
    next_dagrun_create_after: str | None
    last_run_states: list[str] = Field(description="States of the last runs, newest first")
    run_counts: dict[str, int] = Field(description="Runs per state")


class DagTaskItem(BaseModel):
    task_id: str
    operator: str
    downstream: list[str]
    retries: int
    start_from_trigger: bool
    outlets: list[str]
    inlets: list[str]
    mapped: str | None
    role: str | None = Field(
        default=None, description="setup, teardown, or 'teardown, fails run' (none: a task)"
    )
    edge_labels: dict[str, str] = Field(
        default_factory=dict, description="Downstream task id -> the Label of the edge to it"
    )


class DagWatcher(BaseModel):
    asset: str
    name: str
    trigger_id: int
    classpath: str
    triggerer_id: int | None
    last_error: str | None


class DagLastRun(BaseModel):
    run_id: str
    run_type: str
    state: str
    logical_date: str | None
    partition_key: str | None
    queued_at: str
    end_date: str | None


class Timetable(BaseModel):
    summary: str | None
    description: str | None
    serialized: Any


class DagDetail(BaseModel):
    dag_id: str
    fileloc: str
    description: str | None
    paused: bool
    active: bool
    last_parsed: str | None
    schedule: Any = Field(description="The asset condition as stored (JSON), if any")
    schedule_text: str
    assets: list[str] = Field(description="The assets the schedule names")
    timetable: Timetable | None
    timezone: str
    start_date: str | None
    end_date: str | None
    catchup: bool
    max_active_runs: int
    tags: list[str]
    next_run: str
    next_dagrun: str | None
    next_dagrun_data_interval: list[str | None] | None
    next_dagrun_create_after: str | None
    tasks: list[DagTaskItem]
    watchers: list[DagWatcher]
    last_runs: list[DagLastRun]
    run_counts: dict[str, int]


class Paused(BaseModel):
    dag_id: str
    paused: bool


class TriggerRequest(RequestBody):
    conf: dict[str, Any] | None = Field(
        default=None, description="A JSON object given to the run (params, dag_run.conf)"
    )
    logical_date: BoundedDate | None = Field(
        default=None,
        description="The run's logical date, with its offset (default: now); years 1900 to 2199",
    )
    partition_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PARTITION_KEY_LENGTH,
        description="The slice the run processes (any DAG; at most 250 characters)",
    )


class TriggeredRun(BaseModel):
    dag_id: str
    run_id: str
    logical_date: str
    partition_key: str | None = None


@router.get("/dags", response_model=Page[DagItem], summary="DAGs, with schedule and last runs")
async def list_dags(
    _: ReaderDep,
    database: DatabaseDep,
    paused: bool | None = None,
    active: bool | None = None,
    tag: str | None = None,
    search: Search = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> ViewPage[dags_view.DagItem]:
    query = partial(
        dags_view.list_dags,
        paused=paused,
        active=active,
        tag=tag,
        search=search,
        limit=limit,
        offset=offset,
    )
    return await read(database, query)


@router.get("/dags/{dag_id}", response_model=DagDetail, summary="One DAG")
async def show_dag(_: ReaderDep, database: DatabaseDep, dag_id: str) -> dags_view.DagDetails:
    shown = await read(database, partial(dags_view.show_dag, dag_id=dag_id))
    return found(shown, f"no DAG {dag_id!r}")


async def _set_paused(database: DatabaseDep, dag_id: str, *, paused: bool) -> Paused:
    if not await act(database, partial(dags_sql.set_paused, dag_id=dag_id, paused=paused)):
        not_found(f"no DAG {dag_id!r}")
    return Paused(dag_id=dag_id, paused=paused)


@router.post("/dags/{dag_id}/pause", response_model=Paused, summary="Pause a DAG")
async def pause_dag(_: OperatorDep, database: DatabaseDep, dag_id: str) -> Paused:
    return await _set_paused(database, dag_id, paused=True)


@router.post("/dags/{dag_id}/unpause", response_model=Paused, summary="Unpause a DAG")
async def unpause_dag(_: OperatorDep, database: DatabaseDep, dag_id: str) -> Paused:
    return await _set_paused(database, dag_id, paused=False)


@router.post(
    "/dags/{dag_id}/runs",
    response_model=TriggeredRun,
    status_code=201,
    summary="Trigger a manual run",
    responses={409: {"description": "The DAG already has a run at that logical date"}},
)
async def trigger_dag(
    _: OperatorDep, database: DatabaseDep, dag_id: str, request: TriggerRequest | None = None
) -> operations.TriggeredRun:
    body = request or TriggerRequest()
    logical = None if body.logical_date is None else body.logical_date.astimezone(UTC)
    trigger = partial(
        operations.trigger_dag,
        dag_id=dag_id,
        conf=body.conf,
        logical_date=logical,
        now=utcnow(),
        date_option="logical_date",
        partition_key=body.partition_key,
    )
    return await act(database, trigger)
