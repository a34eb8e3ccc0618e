"""A DAG's graph page (its tasks and edges as SVG drawn on the server, ``Label``s on the
edges, task groups folded on request, each task coloured by its state in the newest run or
the one asked for) and its code page (the DAG file's source as last parsed well, with line
numbers, and its ``doc_md``).

Reads through ``engine.views.dag_graph`` and ``engine.views.dag_docs``; the drawing is
``task_graph`` on ``graph_layout`` / ``drawing``, the asset graph's layout. ``doc_md`` is
shown as preformatted text: no Markdown library is a dependency, and escaped text cannot
inject anything.
"""

from functools import partial
from typing import Annotated, Any, Final
from urllib.parse import urlencode

import anyio.to_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.security import UiReaderDep
from engine.api.ui.rendering import dag_url, not_found, page, task_url
from engine.api.ui.task_graph import GraphTask, build, group_state
from engine.crypto import KwargsCipher
from engine.db.models import utcnow
from engine.states import DagRunState
from engine.views import dag_docs, dag_graph

#: How often the graph page reloads itself while the run shown goes on.
REFRESH_S: Final = 2
#: Groups one request may fold (more is no graph anyone reads).
MAX_FOLDED: Final = 200
_ACTIVE: Final = frozenset({DagRunState.QUEUED, DagRunState.RUNNING})

router = APIRouter(include_in_schema=False)


def graph_url(dag_id: str, *, run_id: str | None, folded: frozenset[str]) -> str:
    """The graph page with ``run_id`` shown and the groups of ``folded`` folded."""
    query = [("run_id", run_id)] if run_id else []
    query += [("fold", group) for group in sorted(folded)]
    return f"{dag_url(dag_id)}/graph" + (f"?{urlencode(query)}" if query else "")


def task_states(instances: list[Any]) -> dict[str, str]:
    """Task id -> its state in the run; a mapped task's copies summed up as a group's."""
    by_task: dict[str, list[str | None]] = {}
    for ti in instances:
        by_task.setdefault(ti["task_id"], []).append(ti["state"])
    states = {}
    for task_id, found in by_task.items():
        state = found[0] if len(found) == 1 else group_state(found)
        if state is not None:
            states[task_id] = state
    return states


def _task_href(dag_id: str, run: Any, mapped: set[str], task_id: str) -> str | None:
    if run is None:
        return None
    return task_url(dag_id, run["run_id"], task_id, 0 if task_id in mapped else -1)


def _draw(shown: dag_graph.DagGraphShown, folded: frozenset[str]) -> Any:
    dag_id, run = shown["dag_id"], shown["run"]
    instances = run["task_instances"] if run else []
    mapped = {ti["task_id"] for ti in instances if ti["map_index"] >= 0}
    run_id = run["run_id"] if run else None
    tasks = [
        GraphTask(t["task_id"], t["operator"], tuple(t["downstream"]), t["edge_labels"])
        for t in shown["tasks"]
    ]
    return build(
        tasks,
        folded=folded,
        states=task_states(instances),
        task_href=partial(_task_href, dag_id, run, mapped),
        group_href=lambda group: graph_url(dag_id, run_id=run_id, folded=folded - {group}),
    )


@router.get("/dags/{dag_id}/graph", response_class=HTMLResponse)
async def graph_page(
    request: Request,
    dag_id: str,
    _principal: UiReaderDep,
    database: DatabaseDep,
    run_id: Annotated[str | None, Query(max_length=250)] = None,
    fold: Annotated[list[str] | None, Query(max_length=MAX_FOLDED)] = None,
) -> HTMLResponse:
    shown = await database.read(
        partial(dag_graph.dag_graph, dag_id=dag_id, run_id=run_id or None, now=utcnow())
    )
    if shown is None:
        raise not_found(f"no DAG {dag_id!r}; the DAG list shows the DAGs")
    if run_id and shown["run"] is None:
        raise not_found(f"DAG {dag_id!r} has no run {run_id!r}")
    folded = frozenset(fold or ())
    # Laying out a big graph takes CPU time: not on the event loop the engine shares.
    graph = await anyio.to_thread.run_sync(lambda: _draw(shown, folded))
    run = shown["run"]
    shown_run_id = run["run_id"] if run else None
    return page(
        request,
        "dag_graph.html",
        "/dags",
        dag_id=dag_id,
        run=run,
        runs=shown["runs"],
        graph=graph,
        folded=folded,
        toggle_url=lambda group: graph_url(dag_id, run_id=shown_run_id, folded=folded ^ {group}),
        run_choice_url=lambda chosen: graph_url(dag_id, run_id=chosen, folded=folded),
        refresh_s=REFRESH_S if run and run["state"] in _ACTIVE else None,
    )


def _read_code(config: Any, session: Any, dag_id: str) -> dag_docs.DagCodeShown | None:
    cipher = KwargsCipher.from_config(config.core.fernet_key, config.home)
    return dag_docs.dag_code(session, dag_id, cipher=cipher)


@router.get("/dags/{dag_id}/code", response_class=HTMLResponse)
async def code_page(
    request: Request,
    dag_id: str,
    _principal: UiReaderDep,
    database: DatabaseDep,
    config: ConfigDep,
) -> HTMLResponse:
    code = await database.read(partial(_read_code, config, dag_id=dag_id))
    if code is None:
        raise not_found(f"no DAG {dag_id!r}; the DAG list shows the DAGs")
    lines = code["source"].splitlines() if code["source"] is not None else []
    return page(request, "dag_code.html", "/dags", dag_id=dag_id, code=code, lines=lines)
