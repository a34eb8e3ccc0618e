"""A run's page (its tasks, the asset events that triggered it) and a task instance's page
(its log by try, streamed while the try runs). Their actions (clear, mark, cancel) are
``task_actions`` and ``run_actions``.

Reads through ``engine.views.runs`` / ``tasks`` (what ``GET /api/v1/dags/{dag_id}/
dagRuns/...`` answers), including the log reader that never leaves the log folder.
"""

from functools import partial
from typing import Annotated, Any, Final

import anyio.to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.security import UiReaderDep
from engine.api.ui.rendering import can_operate, not_found, page, task_not_found
from engine.db.models import utcnow
from engine.states import DagRunState, TaskState
from engine.task_log_files import TaskLogNotFoundError
from engine.views import runs as runs_view
from engine.views import tasks as tasks_view
from engine.views.common import MAX_INT32, MAX_OFFSET
from engine.views.tasks import TaskInstanceItem, TaskLogChunk

#: A run page reloads itself this often while the run goes on.
REFRESH_S: Final = 2
#: The most of a log shown at once; the page says where the rest is.
LOG_PAGE_BYTES: Final = 512 * 1024
LOG_TAIL_BYTES: Final = 64 * 1024
#: Task states whose try can still write to its log (or whose first try is still to come):
#: the page follows the log, and reloads when the try is over.
_WRITING: Final = frozenset(
    {
        TaskState.NONE,
        TaskState.SCHEDULED,
        TaskState.QUEUED,
        TaskState.RUNNING,
        TaskState.DEFERRED,
        TaskState.UP_FOR_RETRY,
        TaskState.RESTARTING,
    }
)
_RUN_ACTIVE: Final = frozenset({DagRunState.QUEUED, DagRunState.RUNNING})

router = APIRouter(include_in_schema=False)


@router.get("/dags/{dag_id}/runs/{run_id}", response_class=HTMLResponse)
async def run_page(
    request: Request, dag_id: str, run_id: str, _principal: UiReaderDep, database: DatabaseDep
) -> HTMLResponse:
    run = await database.read(
        partial(runs_view.show_run, dag_id=dag_id, run_id=run_id, now=utcnow())
    )
    if run is None:
        raise not_found(f"DAG {dag_id!r} has no run {run_id!r}")
    going_on = run["state"] in _RUN_ACTIVE
    return page(
        request,
        "run.html",
        "/dags",
        run=run,
        dag_id=dag_id,
        can_operate=can_operate(request),
        run_active=going_on,
        refresh_s=REFRESH_S if going_on else None,
    )


def _read_log_now(
    folder: Any, ti: TaskInstanceItem, try_number: int | None, offset: int, max_bytes: int
) -> TaskLogChunk | None:
    try:
        return tasks_view.task_log(
            folder,
            ti["dag_id"],
            ti["run_id"],
            ti["task_id"],
            try_number,
            map_index=ti["map_index"],
            offset=offset,
            max_bytes=max_bytes,
        )
    except TaskLogNotFoundError:
        return None


async def _read_log(
    folder: Any, ti: TaskInstanceItem, try_number: int | None, offset: int, max_bytes: int
) -> TaskLogChunk | None:
    """A piece of a try's log, read in a worker thread: file IO never blocks the event loop
    (under ``sluice run`` the engine's other parts share it)."""
    read = partial(_read_log_now, folder, ti, try_number, offset, max_bytes)
    return await anyio.to_thread.run_sync(read)


@router.get("/dags/{dag_id}/runs/{run_id}/tasks/{task_id}", response_class=HTMLResponse)
async def task_page(
    request: Request,
    dag_id: str,
    run_id: str,
    task_id: str,
    _principal: UiReaderDep,
    database: DatabaseDep,
    config: ConfigDep,
    map_index: Annotated[int, Query(ge=-1, le=MAX_INT32)] = -1,
    try_: Annotated[int | None, Query(alias="try", ge=1, le=MAX_INT32)] = None,
) -> HTMLResponse:
    folder = config.logging.task_log_folder
    show = partial(
        tasks_view.show_task_instance,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        map_index=map_index,
        now=utcnow(),
        log_folder=folder,
    )
    ti = await database.read(show)
    if ti is None:
        raise await task_not_found(database, dag_id, run_id, task_id, map_index)
    tries = ti.get("logged_tries") or []
    shown_try = try_ if try_ is not None else (tries[-1] if tries else None)
    log = None
    if shown_try is not None:
        size_hint = await _read_log(folder, ti, shown_try, 0, 0)
        start = 0 if size_hint is None else max(size_hint["size"] - LOG_PAGE_BYTES, 0)
        log = await _read_log(folder, ti, shown_try, start, LOG_PAGE_BYTES)
    is_last_try = shown_try is not None and (not tries or shown_try == tries[-1])
    tailing = log is not None and is_last_try and ti["state"] in _WRITING
    return page(
        request,
        "task.html",
        "/dags",
        ti=ti,
        tries=tries,
        shown_try=shown_try,
        log=log,
        tailing=tailing or (log is None and ti["state"] in _WRITING),
        can_operate=can_operate(request),
    )


@router.get("/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/log")
async def log_tail(
    dag_id: str,
    run_id: str,
    task_id: str,
    _principal: UiReaderDep,
    database: DatabaseDep,
    config: ConfigDep,
    map_index: Annotated[int, Query(ge=-1, le=MAX_INT32)] = -1,
    try_: Annotated[int | None, Query(alias="try", ge=1, le=MAX_INT32)] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> JSONResponse:
    """What the try wrote after ``offset`` (``text``, the next ``offset``), whether it is
    over (``finished``) and the task's ``state``: what ``static/log-tail.js`` polls."""
    ti = await database.read(
        partial(
            tasks_view.show_task_instance,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=map_index,
            now=utcnow(),
        )
    )
    if ti is None:
        raise not_found(f"no task {task_id!r} in run {run_id!r} of DAG {dag_id!r}")
    log = await _read_log(config.logging.task_log_folder, ti, try_, offset, LOG_TAIL_BYTES)
    text = "" if log is None else log["content"]
    next_offset = offset if log is None else log["next_offset"]
    newer_try = log is not None and try_ is not None and log["tries"][-1:] != [try_]
    finished = (ti["state"] not in _WRITING or newer_try) and (
        log is None or next_offset >= log["size"]
    )
    return JSONResponse(
        {"text": text, "offset": next_offset, "finished": finished, "state": ti["state"]}
    )
