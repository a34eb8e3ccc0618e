"""What the UI's actions share: the confirmation page (``GET`` on an action's URL lists
exactly the task instances it would change, and its form ``POST``s to the same URL), and
the one-time message of what changed (``engine.api.ui.flash``) on the redirect after it.

The confirmation reads what the action would change now, in a read-only transaction; the
action reads it again in its own writing transaction (states move on meanwhile), and the
message says what it actually changed.
"""

from collections.abc import Sequence
from typing import Any, Final

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse, Response

from engine.api.ui.flash import names, set_flash
from engine.api.ui.rendering import page, redirect_back
from engine.db.queries.actions import TaskChange
from engine.exceptions import InvalidStateError, NotFoundError, OperatorActionError

#: The largest map index a form may name (the database's 32-bit integer).
MAX_MAP_INDEX: Final = 2**31 - 1
#: The task instances a confirmation lists one by one (a run of thousands of mapped copies
#: says how many more there are).
MAX_LISTED: Final = 500


def refused(exc: OperatorActionError) -> HTTPException:
    """The answer to an action ``engine.db`` refused, as the REST API's: 404 for an unknown
    DAG, run or task, 409 for a state that does not allow it, 422 otherwise (an
    ``ExternalTaskMarker`` chain deeper than its ``recursion_depth``, say)."""
    if isinstance(exc, NotFoundError):
        return HTTPException(404, str(exc))
    return HTTPException(409 if isinstance(exc, InvalidStateError) else 422, str(exc))


def task_name(change: TaskChange, dag_id: str) -> str:
    """``task`` or ``task[2]``; a task of another DAG (an ``ExternalTaskMarker``'s) with
    its DAG: ``other_dag.task``."""
    shown = str(change.as_dict()["task_id"])
    return shown if change.dag_id == dag_id else f"{change.dag_id}.{shown}"


def instances(count: int) -> str:
    return f"{count} task instance{'' if count == 1 else 's'}"


def confirm_page(
    request: Request,
    *,
    title: str,
    explanation: str,
    action: str,
    fields: dict[str, Any],
    back: str,
    changes: Sequence[TaskChange] = (),
    dag_id: str = "",
    button: str = "Confirm",
    nothing: str | None = None,
) -> HTMLResponse:
    """The confirmation of an action: what it does (``explanation``), the task instances it
    would change (``changes``, each with its state now and after), and a form that posts
    ``fields`` to ``action``. ``nothing``: said instead of the form when there is nothing to
    change. ``back`` is where "Cancel" (and the action, once done) leads."""
    rows = [
        {"name": task_name(c, dag_id), "run_id": c.run_id, "old": c.old_state, "new": c.new_state}
        for c in changes[:MAX_LISTED]
    ]
    return page(
        request,
        "confirm.html",
        "/dags",
        title=title,
        explanation=explanation,
        action=action,
        fields={k: v for k, v in fields.items() if v is not None},
        back=back,
        rows=rows,
        unlisted=max(len(changes) - MAX_LISTED, 0),
        several_runs=len({(c.dag_id, c.run_id) for c in changes}) > 1,
        button=button,
        nothing=nothing if not changes else None,
    )


def done(request: Request, target: str, message: str) -> Response:
    """The redirect after an action, carrying ``message`` to the page it leads to."""
    response = redirect_back(target)
    set_flash(request, response, message)
    return response


def counted(changes: Sequence[TaskChange], dag_id: str, state: str = "") -> str:
    """``3 task instances success: a, b, c`` (the first few names and ``and N more``)."""
    listed = names(sorted(task_name(c, dag_id) for c in changes))
    return f"{instances(len(changes))}{' ' + state if state else ''}: {listed}"


def runs_again(runs: dict[str, str]) -> str:
    """`` Run R is queued again.`` for each finished run an action sent back to the queue."""
    return "".join(f" Run {run_id} is {state} again." for run_id, state in sorted(runs.items()))
