"""A run's Gantt chart (each task instance's wait and run as bars on one time axis, drawn
as SVG on the server, the page following the run while it goes on) and a task instance's
results (its XComs, each as formatted JSON in a bounded box).

Reads through ``engine.views.runs.show_run`` and ``engine.views.tasks.task_results`` (what
``GET /api/v1/dags/{dag_id}/dagRuns/...`` answers); the chart is ``gantt``'s.
"""

import json
from functools import partial
from typing import Annotated, Any, Final

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from engine.api.deps import DatabaseDep
from engine.api.security import UiReaderDep
from engine.api.ui.gantt import chart
from engine.api.ui.rendering import not_found, page, task_not_found, task_url
from engine.db.models import utcnow
from engine.states import DagRunState
from engine.views import runs as runs_view
from engine.views import tasks as tasks_view

#: How often a Gantt chart of a run going on reloads itself.
REFRESH_S: Final = 2
#: The most of one result shown (as JSON text); the page says where the rest is.
MAX_RESULT_CHARS: Final = 100_000
#: The largest map index asked for (a task maps over at most this many items in practice;
#: SQLite's integers end at 2**63).
MAX_MAP_INDEX: Final = 1 << 31
_ACTIVE: Final = frozenset({DagRunState.QUEUED, DagRunState.RUNNING})

router = APIRouter(include_in_schema=False)


def _name(ti: Any) -> str:
    return str(ti["task_id"]) if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]"


@router.get("/dags/{dag_id}/runs/{run_id}/gantt", response_class=HTMLResponse)
async def gantt_page(
    request: Request, dag_id: str, run_id: str, _principal: UiReaderDep, database: DatabaseDep
) -> HTMLResponse:
    now = utcnow()
    run = await database.read(partial(runs_view.show_run, dag_id=dag_id, run_id=run_id, now=now))
    if run is None:
        raise not_found(f"DAG {dag_id!r} has no run {run_id!r}")
    instances = run["task_instances"]
    links = {
        _name(ti): task_url(dag_id, run_id, ti["task_id"], ti["map_index"]) for ti in instances
    }
    return page(
        request,
        "gantt.html",
        "/dags",
        dag_id=dag_id,
        run=run,
        gantt=chart(instances, now=now, href=links),
        refresh_s=REFRESH_S if run["state"] in _ACTIVE else None,
    )


def shown_json(value: Any) -> tuple[str, bool]:
    """A result as indented JSON text, cut at ``MAX_RESULT_CHARS`` (and whether it was)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
    if len(text) <= MAX_RESULT_CHARS:
        return text, False
    return text[:MAX_RESULT_CHARS], True


@router.get("/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/results", response_class=HTMLResponse)
async def results_page(
    request: Request,
    dag_id: str,
    run_id: str,
    task_id: str,
    _principal: UiReaderDep,
    database: DatabaseDep,
    map_index: Annotated[int, Query(ge=-1, le=MAX_MAP_INDEX)] = -1,
) -> HTMLResponse:
    found = await database.read(
        partial(
            tasks_view.task_results,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=map_index,
        )
    )
    if found is None:
        raise await task_not_found(database, dag_id, run_id, task_id, map_index)
    results = [(key, *shown_json(value)) for key, value in found["results"].items()]
    return page(request, "results.html", "/dags", found=found, results=results)
