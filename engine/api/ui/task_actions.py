"""A task instance's actions (op and admin): mark it success / failed (with its downstream /
upstream tasks, as ``sluice tasks set-state``) and clear it (with its downstream / upstream
tasks, only the failed ones, as ``sluice tasks clear``).

``GET`` on an action's URL is its confirmation (the task instances it would change); the
confirmation's form ``POST``s to the same URL (CSRF-checked), which acts through the
functions the CLI and the REST API call (``queries.actions.set_task_state``,
``select_task_instances`` + ``clear_task_instances``) and redirects back with a message of
what changed.
"""

import re
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, Response

from engine.api.deps import DatabaseDep
from engine.api.security import UiOperatorDep
from engine.api.ui.confirming import (
    MAX_MAP_INDEX,
    confirm_page,
    counted,
    done,
    instances,
    refused,
    runs_again,
)
from engine.api.ui.login import safe_next
from engine.api.ui.rendering import run_url, task_url
from engine.db.models import utcnow
from engine.db.queries import actions, task_graph
from engine.exceptions import NotFoundError, OperatorActionError
from engine.states import TaskState

router = APIRouter(include_in_schema=False)

_TASK = "/dags/{dag_id}/runs/{run_id}/tasks/{task_id}"
Mark = Literal["success", "failed"]
MapIndexQuery = Annotated[int, Query(ge=-1, le=MAX_MAP_INDEX)]
MapIndexForm = Annotated[int, Form(ge=-1, le=MAX_MAP_INDEX)]
NextField = Annotated[str | None, Form(max_length=2000)]
NextQuery = Annotated[str | None, Query(max_length=2000)]


def _relatives(downstream: bool, upstream: bool, only_failed: bool = False) -> str:
    said = [
        w
        for w, on in (("downstream", downstream), ("upstream", upstream), ("failed", only_failed))
        if on
    ]
    return f" ({', '.join(said)})" if said else ""


def _copy(map_index: int) -> int | None:
    return None if map_index < 0 else map_index


# --- mark success / failed ----------------------------------------------------------------


@router.get(f"{_TASK}/mark", response_class=HTMLResponse)
async def confirm_mark(
    request: Request,
    dag_id: str,
    run_id: str,
    task_id: str,
    _principal: UiOperatorDep,
    database: DatabaseDep,
    state: Annotated[Mark, Query()],
    downstream: bool = False,
    upstream: bool = False,
    map_index: MapIndexQuery = -1,
    next: NextQuery = None,
) -> HTMLResponse:
    """What marking the task ``state`` would change, and the form that does it."""
    which = {"downstream": downstream, "upstream": upstream, "map_index": _copy(map_index)}
    look = partial(actions.state_targets, dag_id=dag_id, run_id=run_id, task_id=task_id)
    try:
        found = await database.read(partial(look, state=state, **which))
    except OperatorActionError as exc:
        raise refused(exc) from exc
    back = safe_next(next or task_url(dag_id, run_id, task_id, map_index))
    explanation = (
        f"Mark {task_id}{_relatives(downstream, upstream)} {state} in run {run_id}. "
        "What still runs for these task instances is stopped."
    )
    if state == "success":
        explanation += (
            " No asset event is recorded for their outlets (the tasks did not run); the failed"
            " tasks below them are cleared so that they run again."
        )
    return confirm_page(
        request,
        title=f"Mark {task_id} {state}?",
        explanation=explanation,
        action=f"{task_url(dag_id, run_id, task_id)}/mark",
        fields={"state": state, "downstream": downstream, "upstream": upstream, "next": back}
        | ({"map_index": map_index} if map_index >= 0 else {}),
        back=back,
        changes=[*found.marked, *found.failed_below],
        dag_id=dag_id,
        button=f"Mark {instances(len(found.marked))} {state}",
        nothing=f"Nothing to change: every task instance this selects is already {state}.",
    )


@router.post(f"{_TASK}/mark")
async def mark(
    request: Request,
    dag_id: str,
    run_id: str,
    task_id: str,
    _principal: UiOperatorDep,
    database: DatabaseDep,
    state: Annotated[Mark, Form()],
    downstream: Annotated[bool, Form()] = False,
    upstream: Annotated[bool, Form()] = False,
    map_index: MapIndexForm = -1,
    next: NextField = None,
) -> Response:
    """Mark the task (and its relatives if asked) ``state``, as ``sluice tasks set-state``."""
    act = partial(
        actions.set_task_state,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        state=state,
        downstream=downstream,
        upstream=upstream,
        map_index=_copy(map_index),
        now=utcnow(),
    )
    try:
        result = await database.run(act)
    except OperatorActionError as exc:
        raise refused(exc) from exc
    marked = [c for c in result.tasks if c.new_state == state]
    cleared = [c for c in result.tasks if c.new_state != state]
    if marked:
        message = f"Marked {counted(marked, dag_id, state)}."
    else:
        message = f"Nothing changed: the task instances were already {state}."
    if cleared:
        message += f" Cleared {counted(cleared, dag_id)} below them, to run again."
    target = next or task_url(dag_id, run_id, task_id, map_index)
    return done(request, target, message + runs_again(result.runs))


# --- clear ----------------------------------------------------------------------------------


def _clear_selection(
    session: Any,
    *,
    dag_id: str,
    run_id: str,
    task_id: str | None,
    downstream: bool,
    upstream: bool,
    only_failed: bool,
    map_index: int,
) -> list[actions.TaskChange]:
    """What ``sluice tasks clear DAG --run RUN [-t ^TASK$] [-d] [-u] [-f]`` selects; an
    unknown task is an error (a regex that matches nothing would select nothing)."""
    if task_id is not None and task_id not in task_graph.dag_graph(session, dag_id):
        raise NotFoundError(f"DAG {dag_id!r} has no task {task_id!r}")
    return actions.select_task_instances(
        session,
        dag_id,
        run_id=run_id,
        task_regex=None if task_id is None else f"^{re.escape(task_id)}$",
        downstream=downstream,
        upstream=upstream,
        only_failed=only_failed,
        map_index=_copy(map_index),
    )


def cleared_states(selected: list[actions.TaskChange]) -> list[actions.TaskChange]:
    """What clearing ``selected`` makes of each: ``none`` (to run again), or ``restarting``
    for a running one until its process has stopped (``clear_task_instances``)."""
    return [
        actions.with_state(
            c, TaskState.RESTARTING if c.old_state == TaskState.RUNNING else TaskState.NONE
        )
        for c in selected
    ]


async def confirm_clear_page(
    request: Request,
    database: DatabaseDep,
    *,
    select: Any,
    what: str,
    action: str,
    fields: dict[str, Any],
    back: str,
    dag_id: str,
) -> HTMLResponse:
    """The confirmation of a clear (of a task or a run) that ``select`` selects."""
    try:
        selected = await database.read(select)
    except OperatorActionError as exc:
        raise refused(exc) from exc
    return confirm_page(
        request,
        title=f"Clear {what}?",
        explanation=(
            f"Clear {what}: the scheduler runs these task instances again, each with its "
            "retries again. A running one is stopped first; a finished run goes back to "
            "the queue."
        ),
        action=action,
        fields={**fields, "next": back},
        back=back,
        changes=cleared_states(selected),
        dag_id=dag_id,
        button=f"Clear {instances(len(selected))}",
        nothing="Nothing to clear: no task instance matches.",
    )


async def clear_now(request: Request, database: DatabaseDep, select: Any, target: str) -> Response:
    """Clear what ``select`` selects (read again in the writing transaction); back to
    ``target`` with what changed."""

    def clear_them(session: Any) -> actions.ActionResult:
        return actions.clear_task_instances(session, select(session), now=utcnow())

    try:
        result = await database.run(clear_them)
    except OperatorActionError as exc:
        raise refused(exc) from exc
    dag_id = str(request.path_params["dag_id"])
    if result.tasks:
        message = f"Cleared {counted(result.tasks, dag_id)}; they run again."
    else:
        message = "Nothing cleared: no task instance matched any more."
    return done(request, target, message + runs_again(result.runs))


@router.get(f"{_TASK}/clear", response_class=HTMLResponse)
async def confirm_clear(
    request: Request,
    dag_id: str,
    run_id: str,
    task_id: str,
    _principal: UiOperatorDep,
    database: DatabaseDep,
    downstream: bool = False,
    upstream: bool = False,
    only_failed: bool = False,
    map_index: MapIndexQuery = -1,
    next: NextQuery = None,
) -> HTMLResponse:
    """What clearing the task (with the options) would clear, and the form that does it."""
    options = {"downstream": downstream, "upstream": upstream, "only_failed": only_failed}
    select = partial(
        _clear_selection, dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index
    )
    return await confirm_clear_page(
        request,
        database,
        select=partial(select, **options),
        what=f"{task_id}{_relatives(downstream, upstream, only_failed)} in run {run_id}",
        action=f"{task_url(dag_id, run_id, task_id)}/clear",
        fields={**options, **({"map_index": map_index} if map_index >= 0 else {})},
        back=safe_next(next or task_url(dag_id, run_id, task_id, map_index)),
        dag_id=dag_id,
    )


@router.post(f"{_TASK}/clear")
async def clear(
    request: Request,
    dag_id: str,
    run_id: str,
    task_id: str,
    _principal: UiOperatorDep,
    database: DatabaseDep,
    map_index: MapIndexForm = -1,
    downstream: Annotated[bool, Form()] = False,
    upstream: Annotated[bool, Form()] = False,
    only_failed: Annotated[bool, Form()] = False,
    next: NextField = None,
) -> Response:
    """Clear one task instance (and its downstream / upstream tasks, only the failed ones,
    if asked): the scheduler runs them again, as ``sluice tasks clear`` and ``POST
    .../clearTaskInstances`` do."""
    select = partial(
        _clear_selection,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        downstream=downstream,
        upstream=upstream,
        only_failed=only_failed,
        map_index=map_index,
    )
    return await clear_now(request, database, select, next or run_url(dag_id, run_id))
