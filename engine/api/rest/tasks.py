"""Task instances: list, show, logs by try, results, clear, set state (the CLI's ``sluice
tasks``). Under ``/dags/{dag_id}/runs/{run_id}/tasks``:

- ``GET .../tasks``: a page of the run's task instances in task order (``?state=&task_id=``);
- ``GET .../tasks/{task_id}?map_index=``: one, with the tries that have a log;
- ``GET .../tasks/{task_id}/logs?try_number=&map_index=&offset=``: the log of a try (the
  latest by default) from byte ``offset``, with ``next_offset`` to follow a running try;
  only files inside ``[logging] task_log_folder`` are read (404 otherwise);
- ``GET .../tasks/{task_id}/results?map_index=``: the results (XComs) it stored;
- ``POST .../tasks/{task_id}/clear`` (op): clear it (and its relatives) so it runs again;
- ``POST .../tasks/{task_id}/state`` (op): mark it success, failed or skipped;

and ``POST /dags/{dag_id}/clear`` (op): clear by runs, dates, task regex and state, as
``sluice tasks clear`` does (``dry_run``: only say what it would clear).
"""

import re
from functools import partial
from typing import Annotated, Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Query
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.rest.common import (
    FilterDate,
    Limit,
    MapIndex,
    Offset,
    Page,
    RequestBody,
    TryNumber,
    act,
    found,
    not_found,
    read,
)
from engine.api.security import OperatorDep, ReaderDep
from engine.db.models import utcnow
from engine.db.queries import actions
from engine.task_log_files import TaskLogNotFoundError
from engine.views import tasks as tasks_view
from engine.views.common import MAX_INT32, MAX_OFFSET
from engine.views.common import Page as ViewPage

router = APIRouter(tags=["task instances"])

TaskStateName = Literal[
    "none",
    "scheduled",
    "queued",
    "running",
    "deferred",
    "success",
    "failed",
    "skipped",
    "upstream_failed",
    "up_for_retry",
    "restarting",
]
SettableState = Literal["success", "failed", "skipped"]
_TASK = "/dags/{dag_id}/runs/{run_id}/tasks/{task_id}"


class TaskInstanceItem(BaseModel):
    dag_id: str
    run_id: str
    task_id: str
    map_index: int = Field(description="-1 for an unmapped task; 0..N-1 for mapped copies")
    rendered_map_index: str | None = Field(
        default=None,
        description="What the copy's map_index_template rendered to when it ran (its name)",
    )
    operator: str | None
    state: str
    try_number: int
    max_tries: int
    queued_at: str | None
    start_date: str | None
    end_date: str | None
    duration_s: float | None = Field(description="Seconds from start to end (or to now)")
    runtime_s: float = Field(description="Seconds spent running, across deferrals")
    hostname: str | None
    pid: int | None
    pool: str | None
    pool_slots: int | None
    trigger_id: int | None
    trigger_timeout: str | None
    next_retry_at: str | None


class TaskInstanceDetail(TaskInstanceItem):
    map_indexes: list[int] = Field(description="The map indexes of the task's copies")
    rendered_map_indexes: list[str | None] = Field(
        default_factory=list,
        description="Each copy's rendered map_index_template (null: none), as map_indexes",
    )
    logged_tries: list[int] = Field(description="The tries that have a log")


class TaskLog(BaseModel):
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    tries: list[int] = Field(description="The tries that have a log")
    offset: int
    next_offset: int = Field(description="Where to read on (the try may write more)")
    size: int = Field(description="Bytes in the log now")
    content: str


class TaskResults(BaseModel):
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    state: str
    try_number: int
    results: dict[str, Any] = Field(description="Key -> value; return_value first")


class TaskChangeItem(BaseModel):
    dag_id: str
    run_id: str
    task_id: str = Field(description="``task[i]`` for a copy of a mapped task")
    map_index: int
    state: str = Field(description="The state it had")
    new_state: str


class ActionResult(BaseModel):
    tasks: list[TaskChangeItem]
    runs: dict[str, str] = Field(description="Run id -> its new state, for runs that changed")
    dry_run: bool = False


class ClearTask(RequestBody):
    downstream: bool = False
    upstream: bool = False
    map_index: int | None = Field(
        default=None, ge=-1, le=MAX_INT32, description="Only this copy (mapped task)"
    )
    dry_run: bool = Field(default=False, description="Only say what would be cleared")


class ClearRequest(ClearTask):
    run_id: str | None = Field(default=None, description="Only this run (default: every run)")
    start_date: FilterDate | None = Field(default=None, description="Runs from this date")
    end_date: FilterDate | None = Field(default=None, description="Runs up to this date")
    task_regex: str | None = Field(default=None, description="Tasks whose id matches")
    only_failed: bool = False
    only_running: bool = False


class SetState(RequestBody):
    state: SettableState
    downstream: bool = False
    upstream: bool = False
    map_index: int | None = Field(
        default=None, ge=-1, le=MAX_INT32, description="Only this copy (mapped task)"
    )


@router.get(
    "/dags/{dag_id}/runs/{run_id}/tasks",
    response_model=Page[TaskInstanceItem],
    summary="A run's task instances",
)
async def list_task_instances(
    _: ReaderDep,
    database: DatabaseDep,
    dag_id: str,
    run_id: str,
    state: TaskStateName | None = None,
    task_id: str | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> ViewPage[tasks_view.TaskInstanceItem]:
    query = partial(
        tasks_view.list_task_instances,
        dag_id=dag_id,
        run_id=run_id,
        now=utcnow(),
        state=state,
        task_id=task_id,
        limit=limit,
        offset=offset,
    )
    return found(await read(database, query), f"DAG {dag_id!r} has no run {run_id!r}")


async def _missing(
    database: DatabaseDep, dag_id: str, run_id: str, task_id: str, map_index: int
) -> str:
    why = partial(
        tasks_view.missing_task_instance,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        map_index=map_index,
        map_option="map_index",
    )
    message: str = await read(database, why)
    return message


@router.get(_TASK, response_model=TaskInstanceDetail, summary="One task instance")
async def show_task_instance(
    _: ReaderDep,
    database: DatabaseDep,
    config: ConfigDep,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: MapIndex = -1,
) -> tasks_view.TaskInstanceDetails:
    query = partial(
        tasks_view.show_task_instance,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        map_index=map_index,
        now=utcnow(),
        log_folder=config.logging.task_log_folder,
    )
    shown = await read(database, query)
    if shown is None:
        not_found(await _missing(database, dag_id, run_id, task_id, map_index))
    return shown


@router.get(
    f"{_TASK}/logs",
    response_model=TaskLog,
    summary="The log of a try",
    responses={404: {"description": "No such task instance, or no log for that try"}},
)
async def task_log(
    _: ReaderDep,
    database: DatabaseDep,
    config: ConfigDep,
    dag_id: str,
    run_id: str,
    task_id: str,
    try_number: TryNumber = None,
    map_index: MapIndex = -1,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="From this byte")] = 0,
) -> tasks_view.TaskLogChunk:
    exists = partial(
        tasks_view.show_task_instance,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        map_index=map_index,
        now=utcnow(),
    )
    if await read(database, exists) is None:
        not_found(await _missing(database, dag_id, run_id, task_id, map_index))
    folder = config.logging.task_log_folder
    try:
        text = await anyio.to_thread.run_sync(
            partial(
                tasks_view.task_log,
                folder,
                dag_id,
                run_id,
                task_id,
                try_number,
                map_index=map_index,
                offset=offset,
            )
        )
    except TaskLogNotFoundError:
        # the message would show the server's paths: say only what is missing
        tried = "the latest try" if try_number is None else f"try {try_number}"
        not_found(f"no log for {tried} of task {task_id!r} in run {run_id!r} of {dag_id!r}")
    return text


@router.get(f"{_TASK}/results", response_model=TaskResults, summary="The results (XComs)")
async def task_results(
    _: ReaderDep,
    database: DatabaseDep,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: MapIndex = -1,
) -> tasks_view.TaskResultsShown:
    query = partial(
        tasks_view.task_results, dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index
    )
    shown = await read(database, query)
    if shown is None:
        not_found(await _missing(database, dag_id, run_id, task_id, map_index))
    return shown


def _result(result: actions.ActionResult, *, dry_run: bool = False) -> dict[str, Any]:
    return {"tasks": [c.as_dict() for c in result.tasks], "runs": result.runs, "dry_run": dry_run}


async def _clear(database: DatabaseDep, dag_id: str, body: ClearRequest) -> dict[str, Any]:
    select = partial(
        actions.select_task_instances,
        dag_id=dag_id,
        run_id=body.run_id,
        start_date=body.start_date,
        end_date=body.end_date,
        task_regex=body.task_regex,
        downstream=body.downstream,
        upstream=body.upstream,
        only_failed=body.only_failed,
        only_running=body.only_running,
        map_index=body.map_index,
    )
    if body.dry_run:
        chosen: list[actions.TaskChange] = await read(database, select)
        return _result(actions.ActionResult(tuple(chosen), {}), dry_run=True)

    def clear(session: Session) -> actions.ActionResult:
        return actions.clear_task_instances(session, select(session), now=utcnow())

    return _result(await act(database, clear))


@router.post(
    "/dags/{dag_id}/clear",
    response_model=ActionResult,
    summary="Clear task instances so that they run again",
)
async def clear_dag(
    _: OperatorDep, database: DatabaseDep, dag_id: str, body: ClearRequest
) -> dict[str, Any]:
    return await _clear(database, dag_id, body)


@router.post(f"{_TASK}/clear", response_model=ActionResult, summary="Clear a task instance")
async def clear_task(
    _: OperatorDep,
    database: DatabaseDep,
    dag_id: str,
    run_id: str,
    task_id: str,
    body: ClearTask | None = None,
) -> dict[str, Any]:
    given = body or ClearTask()
    exact = f"^{re.escape(task_id)}$"
    request = ClearRequest(**given.model_dump(), run_id=run_id, task_regex=exact)
    if not await read(database, partial(_has_task, dag_id=dag_id, run_id=run_id, task_id=task_id)):
        not_found(f"no task {task_id!r} in run {run_id!r} of DAG {dag_id!r}")
    return await _clear(database, dag_id, request)


def _has_task(session: Session, *, dag_id: str, run_id: str, task_id: str) -> bool:
    listed = tasks_view.list_task_instances(
        session, dag_id, run_id, now=utcnow(), task_id=task_id, limit=1
    )
    return listed is not None and listed["total"] > 0


@router.post(
    f"{_TASK}/state",
    response_model=ActionResult,
    summary="Mark a task instance success, failed or skipped",
)
async def set_task_state(
    _: OperatorDep,
    database: DatabaseDep,
    dag_id: str,
    run_id: str,
    task_id: str,
    body: SetState,
) -> dict[str, Any]:
    mark = partial(
        actions.set_task_state,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        state=body.state,
        downstream=body.downstream,
        upstream=body.upstream,
        map_index=body.map_index,
        now=utcnow(),
    )
    return _result(await act(database, mark))
