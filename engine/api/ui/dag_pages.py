"""The DAG pages: the list (schedule, next run, paused, last run states), one DAG's runs
grid (runs x tasks), and the actions pause / unpause / trigger (op and admin, CSRF-checked).

Reads through ``engine.views`` (what ``GET /api/v1/dags`` answers); actions through the
functions the REST API and the CLI call (``queries.dags.set_paused``,
``engine.views.operations.trigger_dag``).
"""

from functools import partial
from typing import Annotated, Any, Final

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from engine.api.deps import DatabaseDep
from engine.api.security import UiOperatorDep, UiReaderDep
from engine.api.ui.grid import grid_rows
from engine.api.ui.rendering import (
    PAGE_SIZE,
    can_operate,
    json_object_field,
    not_found,
    page,
    redirect_back,
    run_url,
)
from engine.db.models import utcnow
from engine.db.queries import dags as dags_sql
from engine.exceptions import NotFoundError, OperatorActionError
from engine.states import DagRunState
from engine.views import dags as dags_view
from engine.views import operations
from engine.views import runs as runs_view
from engine.views.common import MAX_OFFSET
from engine.views.common import Page as ViewPage

#: Runs shown in the grid (the newest; older ones are on the pages of the runs list).
GRID_RUNS: Final = 25
#: How often a DAG page with a run going on reloads itself.
REFRESH_S: Final = 3
MAX_CONF_CHARS: Final = 65_536
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
    found = await database.read(
        partial(dags_view.list_dags, search=search or None, limit=PAGE_SIZE, offset=offset)
    )
    return page(
        request,
        "dag_list.html",
        "/dags",
        dags=found,
        search=search,
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


@router.post("/dags/{dag_id}/pause")
async def pause(
    dag_id: str,
    _principal: UiOperatorDep,
    database: DatabaseDep,
    next: Annotated[str, Form()] = "/dags",
) -> Response:
    await _set_paused(database, dag_id, paused=True)
    return redirect_back(next)


@router.post("/dags/{dag_id}/unpause")
async def unpause(
    dag_id: str,
    _principal: UiOperatorDep,
    database: DatabaseDep,
    next: Annotated[str, Form()] = "/dags",
) -> Response:
    await _set_paused(database, dag_id, paused=False)
    return redirect_back(next)


@router.post("/dags/{dag_id}/trigger", response_model=None)
async def trigger(
    request: Request,
    dag_id: str,
    _principal: UiOperatorDep,
    database: DatabaseDep,
    conf: Annotated[str, Form(max_length=MAX_CONF_CHARS)] = "",
) -> Response:
    """A manual run now; then its page. Bad conf: the DAG page again, saying why (422)."""
    try:
        parsed = json_object_field(conf, "conf")
        made = await database.run(
            partial(
                operations.trigger_dag, dag_id=dag_id, conf=parsed, logical_date=None, now=utcnow()
            )
        )
    except NotFoundError as exc:
        raise not_found(str(exc)) from exc
    except (ValueError, OperatorActionError) as exc:  # bad conf, a run at that date already
        return await _dag_page(
            request, database, dag_id, problem=str(exc), conf_text=conf, status_code=422
        )
    return RedirectResponse(run_url(dag_id, made["run_id"]), status_code=303)
