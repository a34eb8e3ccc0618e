"""A run's actions (op and admin): cancel it while it is queued or running (Airflow's "mark
run as failed", as ``sluice runs cancel`` and ``POST .../cancel``) and clear it (all its
task instances, or only the failed ones, as ``sluice tasks clear DAG --run RUN [-f]``).

``GET`` on an action's URL is its confirmation (the task instances it would change); its
form ``POST``s to the same URL (CSRF-checked) and the run page shows what changed.
"""

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, Response

from engine.api.deps import DatabaseDep
from engine.api.security import UiOperatorDep
from engine.api.ui.confirming import confirm_page, counted, done, instances, refused
from engine.api.ui.rendering import run_url
from engine.api.ui.task_actions import clear_now, confirm_clear_page
from engine.db.models import utcnow
from engine.db.queries import actions, run_ends
from engine.exceptions import InvalidStateError, OperatorActionError
from engine.states import TaskState

router = APIRouter(include_in_schema=False)

_RUN = "/dags/{dag_id}/runs/{run_id}"
_ENDS = (TaskState.FAILED, TaskState.SKIPPED)


@router.get(f"{_RUN}/cancel", response_class=HTMLResponse)
async def confirm_cancel(
    request: Request, dag_id: str, run_id: str, _principal: UiOperatorDep, database: DatabaseDep
) -> HTMLResponse:
    """What cancelling the run would change, and the form that does it; a run that already
    ended says so, with no form."""
    back = run_url(dag_id, run_id)
    try:
        changes = await database.read(
            partial(run_ends.cancel_preview, dag_id=dag_id, run_id=run_id)
        )
    except InvalidStateError as exc:
        return confirm_page(
            request,
            title=f"Cancel run {run_id}?",
            explanation="",
            action="",
            fields={},
            back=back,
            nothing=f"Nothing to cancel: the {exc}.",
        )
    except OperatorActionError as exc:
        raise refused(exc) from exc
    return confirm_page(
        request,
        title=f"Cancel run {run_id}?",
        explanation=(
            f"Mark run {run_id} of {dag_id} failed now. Its running and deferred task "
            "instances become failed (their processes and triggers stop), those not started "
            "yet or waiting for a retry become skipped."
        ),
        action=f"{back}/cancel",
        fields={},
        back=back,
        changes=changes,
        dag_id=dag_id,
        button=f"Cancel the run ({instances(len(changes))})",
        # a run whose tasks all ended can still be cancelled (it is then failed)
        nothing=None,
    )


@router.post(f"{_RUN}/cancel")
async def cancel(
    request: Request, dag_id: str, run_id: str, _principal: UiOperatorDep, database: DatabaseDep
) -> Response:
    """Mark the run failed, as ``sluice runs cancel``; back to its page, saying what ended."""
    act = partial(run_ends.cancel_run, dag_id=dag_id, run_id=run_id, now=utcnow())
    back = run_url(dag_id, run_id)
    try:
        ended: run_ends.EndedRun = await database.run(act)
    except InvalidStateError as exc:  # someone ended it since the confirmation
        return done(request, back, f"Nothing cancelled: the {exc}.")
    except OperatorActionError as exc:
        raise refused(exc) from exc
    groups = {state: [c for c in ended.tasks if c.new_state == state] for state in _ENDS}
    said = "; ".join(counted(g, dag_id, state) for state, g in groups.items() if g)
    return done(
        request, back, f"Cancelled run {run_id}: it is failed." + (f" {said}." if said else "")
    )


# --- clear the run -------------------------------------------------------------------------


def _select(dag_id: str, run_id: str, only_failed: bool) -> partial[list[actions.TaskChange]]:
    return partial(
        actions.select_task_instances, dag_id=dag_id, run_id=run_id, only_failed=only_failed
    )


@router.get(f"{_RUN}/clear", response_class=HTMLResponse)
async def confirm_clear_run(
    request: Request,
    dag_id: str,
    run_id: str,
    _principal: UiOperatorDep,
    database: DatabaseDep,
    only_failed: Annotated[bool, Query()] = False,
) -> HTMLResponse:
    """What clearing the run (only its failed task instances, if asked) would clear."""
    back = run_url(dag_id, run_id)
    return await confirm_clear_page(
        request,
        database,
        select=_select(dag_id, run_id, only_failed),
        what=f"{'the failed tasks of ' if only_failed else ''}run {run_id}",
        action=f"{back}/clear",
        fields={"only_failed": only_failed},
        back=back,
        dag_id=dag_id,
    )


@router.post(f"{_RUN}/clear")
async def clear_run(
    request: Request,
    dag_id: str,
    run_id: str,
    _principal: UiOperatorDep,
    database: DatabaseDep,
    only_failed: Annotated[bool, Form()] = False,
) -> Response:
    """Clear the run's task instances (only the failed ones, if asked): they run again."""
    select = _select(dag_id, run_id, only_failed)
    return await clear_now(request, database, select, run_url(dag_id, run_id))
