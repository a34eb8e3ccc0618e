"""The UI actions' pure pieces: how a refused action is answered, how the message after an
action names what changed, what a confirmation says clearing or ending a run makes of each
task instance."""

from __future__ import annotations

import pytest

from engine.api.ui.confirming import counted, refused, runs_again, task_name
from engine.api.ui.flash import MAX_NAMES, names
from engine.api.ui.task_actions import cleared_states
from engine.db.queries.actions import TaskChange
from engine.db.queries.run_ends import ending_changes
from engine.exceptions import InvalidStateError, NotFoundError, OperatorActionError


def change(task_id: str, state: str, *, dag_id: str = "etl", map_index: int = -1) -> TaskChange:
    return TaskChange(1, dag_id, "r1", task_id, state, state, map_index)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (NotFoundError("no DAG 'x'"), 404),
        (InvalidStateError("run 'r' already ended: success"), 409),
        (OperatorActionError("the marker chain is deeper than 3"), 422),
    ],
)
def test_a_refused_action_is_answered_as_the_rest_api_does(
    error: OperatorActionError, status: int
) -> None:
    answer = refused(error)
    assert (answer.status_code, answer.detail) == (status, str(error))


def test_the_message_names_copies_other_dags_and_cuts_long_lists() -> None:
    assert task_name(change("load", "none", map_index=2), "etl") == "load[2]"
    assert task_name(change("sink", "none", dag_id="other"), "etl") == "other.sink"
    three = [change(t, "success") for t in ("c", "a", "b")]
    assert counted(three, "etl", "success") == "3 task instances success: a, b, c"
    assert counted(three[:1], "etl") == "1 task instance: c"
    many = [f"t{i:02}" for i in range(MAX_NAMES + 3)]
    assert names(many).endswith(f"t{MAX_NAMES - 1:02} and 3 more")
    assert runs_again({"r2": "queued", "r1": "queued"}) == (
        " Run r1 is queued again. Run r2 is queued again."
    )


def test_clearing_makes_a_running_task_restarting_and_the_others_none() -> None:
    cleared = cleared_states([change("a", "running"), change("b", "failed")])
    assert [(c.task_id, c.old_state, c.new_state) for c in cleared] == [
        ("a", "running", "restarting"),
        ("b", "failed", "none"),
    ]


def test_ending_a_run_fails_active_tasks_and_skips_pending_ones() -> None:
    tis = [change(t, s) for t, s in (("a", "running"), ("b", "deferred"), ("c", "up_for_retry"))]
    ended = ending_changes(tis, active_to="failed", pending_to="skipped")
    assert [(c.task_id, c.new_state) for c in ended] == [
        ("a", "failed"),
        ("b", "failed"),
        ("c", "skipped"),
    ]
