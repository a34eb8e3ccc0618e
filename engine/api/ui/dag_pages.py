"""The DAG pages: the list (schedule, next run, paused, last run states), one DAG's runs
grid (runs x tasks), and the actions pause / unpause (each ``GET`` its confirmation, the
``POST`` the action; op and admin, CSRF-checked); the trigger form and its confirmation are
``trigger_page``'s. The list says how many DAG files fail to parse, with a link to
``/import-errors``.

Reads through ``engine.views`` (what ``GET /api/v1/dags`` answers); actions through the
functions the REST API and the CLI call (``queries.dags.set_paused``).
"""

from functools import partial
from typing import Annotated, Any, Final

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from engine.api.deps import DatabaseDep
from engine.api.security import UiOperatorDep, UiReaderDep
from engine.api.ui.confirming import confirm_page, done
from engine.api.ui.grid import grid_rows
from engine.api.ui.rendering import (
    PAGE_SIZE,
    can_operate,
    dag_url,
    not_found,
    page,
)
from engine.db.models import utcnow
from engine.db.queries import dags as dags_sql
from engine.states import DagRunState
from engine.views import dags as dags_view
from engine.views import parse_errors as parse_errors_view
from engine.views import runs as runs_view
from engine.views.common import MAX_OFFSET
from engine.views.common import Page as ViewPage

#: Runs shown in the grid (the newest; older ones are on the pages of the runs list).
GRID_RUNS: Final = 25
#: How often a DAG page with a run going on reloads itself.
REFRESH_S: Final = 3
_ACTIVE: Final = frozenset({DagRunState.QUEUED, DagRunState.RUNNING})

router = APIRouter(include_in_schema=False)


@router.get("/")
async def start_page(_principal: UiReaderDep) -> Response:
    return RedirectResponse("/dags", status_code=303)


@router.get("/dags", response_class=HTMLResponse)
async def dag_list(
    request: Request,
    _principal: UiReaderDep,
    database: DatabaseDep,
    search: Annotated[str | None, Query(max_length=250)] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> HTMLResponse:
    def read(session: Any) -> tuple[ViewPage[dags_view.DagItem], int]:
        listed = dags_view.list_dags(session, search=search or None, limit=PAGE_SIZE, offset=offset)
        return listed, parse_errors_view.parse_error_count(session)

    found, broken_files = await database.read(read)
    return page(
        request,
        "dag_list.html",
        "/dags",
        dags=found,
        search=search,
        broken_files=broken_files,
        can_operate=can_operate(request),
    )


async def _dag_page(
    request: Request, database: DatabaseDep, dag_id: str, **extra: Any
) -> HTMLResponse:
    def read(session: Any) -> tuple[dags_view.DagDetails | None, ViewPage[runs_view.RunItem]]:
        shown = dags_view.show_dag(session, dag_id)
        runs = runs_view.list_runs(session, now=utcnow(), dag_id=dag_id, limit=GRID_RUNS)
        return shown, runs

    dag, runs = await database.read(read)
    if dag is None:
        raise not_found(f"no DAG {dag_id!r}; the DAG list shows the DAGs")
    shown = list(reversed(runs["items"]))  # oldest left, as time reads
    rows = grid_rows([t["task_id"] for t in dag["tasks"]], shown)
    going_on = any(run["state"] in _ACTIVE for run in shown)
    return page(
        request,
        "dag_grid.html",
        "/dags",
        dag=dag,
        runs=shown,
        rows=rows,
        total_runs=runs["total"],
        can_operate=can_operate(request),
        refresh_s=REFRESH_S if going_on else None,
        **extra,
    )


@router.get("/dags/{dag_id}", response_class=HTMLResponse)
async def dag_grid(
    request: Request, dag_id: str, _principal: UiReaderDep, database: DatabaseDep
) -> HTMLResponse:
    return await _dag_page(request, database, dag_id)


async def _set_paused(database: DatabaseDep, dag_id: str, *, paused: bool) -> None:
    if not await database.run(partial(dags_sql.set_paused, dag_id=dag_id, paused=paused)):
        raise not_found(f"no DAG {dag_id!r}; the DAG list shows the DAGs")


_PAUSE_SAYS: Final = {
    True: "the scheduler creates no run of it from its schedule and starts nothing of its "
    "runs (a run triggered by hand waits in the queue) until it is unpaused; tasks already "
    "running finish.",
    False: "the scheduler starts its waiting runs and creates its runs from its schedule again.",
}


async def _confirm_pause(
    request: Request, database: DatabaseDep, dag_id: str, *, paused: bool
) -> HTMLResponse:
    dag = await database.read(partial(dags_view.show_dag, dag_id=dag_id))
    if dag is None:
        raise not_found(f"no DAG {dag_id!r}; the DAG list shows the DAGs")
    verb = "Pause" if paused else "Unpause"
    already = dag["paused"] == paused
    return confirm_page(
        request,
        title=f"{verb} {dag_id}?",
        explanation=f"{verb} DAG {dag_id}: {_PAUSE_SAYS[paused]}",
        action=f"{dag_url(dag_id)}/{verb.lower()}",
        fields={"next": dag_url(dag_id)},
        back=dag_url(dag_id),
        button=f"{verb} {dag_id}",
        nothing=f"Nothing to do: {dag_id} is already {'paused' if paused else 'active'}."
        if already
        else None,
    )


@router.get("/dags/{dag_id}/pause", response_class=HTMLResponse)
async def confirm_pause(
    request: Request, dag_id: str, _principal: UiOperatorDep, database: DatabaseDep
) -> HTMLResponse:
    return await _confirm_pause(request, database, dag_id, paused=True)


@router.get("/dags/{dag_id}/unpause", response_class=HTMLResponse)
async def confirm_unpause(
    request: Request, dag_id: str, _principal: UiOperatorDep, database: DatabaseDep
) -> HTMLResponse:
    return await _confirm_pause(request, database, dag_id, paused=False)


@router.post("/dags/{dag_id}/pause")
async def pause(
    request: Request,
    dag_id: str,
    _principal: UiOperatorDep,
    database: DatabaseDep,
    next: Annotated[str, Form(max_length=2000)] = "/dags",
) -> Response:
    await _set_paused(database, dag_id, paused=True)
    return done(request, next, f"Paused {dag_id}: the scheduler starts nothing of it.")


@router.post("/dags/{dag_id}/unpause")
async def unpause(
    request: Request,
    dag_id: str,
    _principal: UiOperatorDep,
    database: DatabaseDep,
    next: Annotated[str, Form(max_length=2000)] = "/dags",
) -> Response:
    await _set_paused(database, dag_id, paused=False)
    return done(request, next, f"Unpaused {dag_id}: the scheduler runs it again.")
