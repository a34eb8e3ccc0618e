"""Pure decisions of the executor: outcomes, exit reasons, deadlines, log lines, the spec."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.authoring.deferral import Deferral, TaskDeferred
from engine.db.queries.deferrals import deferral_deadline
from engine.db.queries.tasks import TaskRun
from engine.execution.protocol import TaskResult, TaskSpec
from engine.executor.outcomes import (
    Decision,
    Outcome,
    decide_outcome,
    exit_reason,
    header_line,
    kill_after_s,
    outcome_line,
    read_result,
)
from engine.executor.task_specs import build_spec
from engine.states import TaskState
from triggers.file import FileTrigger
from triggers.serde import loads
from triggers.temporal import TimeDeltaTrigger

START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def _run(**changes: object) -> TaskRun:
    values: dict[str, object] = {
        "ti_id": 7,
        "dag_id": "d",
        "run_id": "r1",
        "task_id": "t",
        "fileloc": "/dags/d.py",
        "try_number": 1,
        "max_tries": 0,
        "try_started_at": START,
        "next_method": None,
        "next_kwargs": None,
        "deferral_count": 0,
        "execution_timeout_s": None,
    }
    values.update(changes)
    return TaskRun(**values)  # type: ignore[arg-type]


def _decide(result: TaskResult | None, run: TaskRun | None = None, **kwargs: object):
    options: dict[str, object] = {
        "returncode": 0,
        "interrupted": False,
        "killed_for_timeout": False,
        "wall_s": 1.5,
        "now": START + timedelta(seconds=10),
    }
    options.update(kwargs)
    return decide_outcome(result, run or _run(), **options)  # type: ignore[arg-type]


DEFERRAL = Deferral("triggers.temporal.DateTimeTrigger", '{"moment":1}', "done", "{}", 30.0)


def test_success_keeps_the_return_value_as_the_return_value_xcom() -> None:
    outcome = _decide(
        TaskResult(TaskState.SUCCESS, 0.5, return_value=[1, 2], has_return_value=True)
    )
    assert outcome.decision is Decision.SUCCEED
    assert (outcome.xcoms, outcome.elapsed_s) == ({"return_value": [1, 2]}, 0.5)
    assert _decide(TaskResult(TaskState.SUCCESS, 0.5)).xcoms is None


@pytest.mark.parametrize(
    ("try_number", "max_tries", "decision"),
    [(1, 0, Decision.FAIL), (1, 1, Decision.RETRY), (2, 1, Decision.FAIL), (2, 3, Decision.RETRY)],
)
def test_a_failure_is_retried_while_tries_remain(
    try_number: int, max_tries: int, decision: Decision
) -> None:
    run = _run(try_number=try_number, max_tries=max_tries)
    outcome = _decide(TaskResult(TaskState.FAILED, 0.1, error="ValueError: no"), run)
    assert (outcome.decision, outcome.reason) == (decision, "ValueError: no")


def test_a_deferral_times_out_at_the_earlier_of_its_timeout_and_the_execution_deadline() -> None:
    now = START + timedelta(seconds=10)
    result = TaskResult(TaskState.DEFERRED, 0.2, execution_timeout_s=25.0, deferral=DEFERRAL)
    outcome = _decide(result, now=now)
    assert outcome.decision is Decision.DEFER and outcome.deferral == DEFERRAL
    assert outcome.trigger_timeout == START + timedelta(seconds=25)  # before now + 30 s
    # Without the task's exact timeout, the DB's rounded value is used.
    rounded = _decide(
        TaskResult(TaskState.DEFERRED, 0.2, deferral=DEFERRAL), _run(execution_timeout_s=100)
    )
    assert rounded.trigger_timeout == now + timedelta(seconds=30)


def test_a_result_wins_over_how_the_process_ended() -> None:
    outcome = _decide(TaskResult(TaskState.SUCCESS, 0.1), returncode=-15, interrupted=True)
    assert outcome.decision is Decision.SUCCEED


def test_an_interrupted_step_without_result_is_requeued() -> None:
    outcome = _decide(None, returncode=-15, interrupted=True)
    assert (outcome.decision, outcome.elapsed_s) == (Decision.REQUEUE, 1.5)


def test_a_dead_process_fails_with_its_exit_reason() -> None:
    outcome = _decide(None, returncode=-9)
    assert outcome.decision is Decision.FAIL
    assert outcome.reason == "task process exited with code -9 (signal SIGKILL)"
    retried = _decide(None, _run(max_tries=1), returncode=1)
    assert retried.decision is Decision.RETRY
    assert retried.reason == "task process exited with code 1 without reporting an outcome"


def test_a_process_killed_past_its_deadline_fails_with_the_timeout() -> None:
    run = _run(execution_timeout_s=5, deferral_count=2)
    outcome = _decide(None, run, returncode=-9, killed_for_timeout=True)
    assert outcome.reason is not None
    assert outcome.reason.startswith("execution_timeout (5s) exceeded after 10.0s across 2 ")
    assert "its process was killed" in outcome.reason


@pytest.mark.parametrize(
    ("returncode", "text"),
    [
        (None, "task process did not report an outcome"),
        (-6, "task process exited with code -6 (signal SIGABRT)"),
        (-250, "task process exited with code -250 (signal 250)"),
        (2, "task process exited with code 2 without reporting an outcome"),
    ],
)
def test_exit_reason(returncode: int | None, text: str) -> None:
    assert exit_reason(returncode) == text


@given(
    try_number=st.integers(1, 20),
    max_tries=st.integers(0, 20),
    returncode=st.one_of(st.none(), st.integers(-64, 255)),
    reported=st.booleans(),
)
def test_failures_retry_exactly_while_try_number_is_within_max_tries(
    try_number: int, max_tries: int, returncode: int | None, reported: bool
) -> None:
    result = TaskResult(TaskState.FAILED, 0.1, error="E") if reported else None
    outcome = _decide(
        result, _run(try_number=try_number, max_tries=max_tries), returncode=returncode
    )
    expected = Decision.RETRY if try_number <= max_tries else Decision.FAIL
    assert outcome.decision is expected and outcome.reason


def test_deferral_deadline() -> None:
    now = START + timedelta(seconds=3)
    assert deferral_deadline(now, None, START, None) is None
    assert deferral_deadline(now, 60, START, None) == now + timedelta(seconds=60)
    assert deferral_deadline(now, None, START, 10) == START + timedelta(seconds=10)
    assert deferral_deadline(now, 2, START, 10) == now + timedelta(seconds=2)
    assert deferral_deadline(now, None, None, 10) == now + timedelta(seconds=10)


def test_kill_after_leaves_a_grace_past_the_deadline_and_never_less() -> None:
    run = _run(execution_timeout_s=60)
    assert kill_after_s(_run(), now=START, grace_s=5) is None
    assert kill_after_s(run, now=START + timedelta(seconds=20), grace_s=5) == 45
    assert kill_after_s(run, now=START + timedelta(hours=1), grace_s=5) == 5


def test_read_result() -> None:
    result = TaskResult(TaskState.SUCCESS, 0.25, return_value={"a": 1}, has_return_value=True)
    assert read_result(result.to_json().encode()) == (result, None)
    assert read_result(b"") == (None, None)
    missing, problem = read_result(b'{"outcome": "sure"}')
    assert missing is None and problem and "malformed task result" in problem


def test_log_lines_say_which_step_runs_and_how_it_ended() -> None:
    now = START + timedelta(seconds=1)
    first = header_line(_run(max_tries=2), pid=42, hostname="h", now=now)
    assert "d.t run r1 try 1 of 3: starting on h (pid 42)" in first and first.endswith("===\n")
    resumed = header_line(_run(next_method="done", deferral_count=2), pid=1, hostname="h", now=now)
    assert "resuming at done() after 2 deferral(s)" in resumed
    timed_out = _run(next_method="__fail__", next_kwargs='{"error":"trigger timeout"}')
    failing = header_line(timed_out, pid=1, hostname="h", now=now)
    assert "resuming to fail: its deferral ended with 'trigger timeout'" in failing
    unknown = header_line(
        _run(next_method="__fail__", next_kwargs="{"), pid=1, hostname="h", now=now
    )
    assert "'unknown error'" in unknown
    deferred = _decide(TaskResult(TaskState.DEFERRED, 0.2, deferral=DEFERRAL))
    line = outcome_line(deferred, _run(), now=now)
    assert "task deferred to triggers.temporal.DateTimeTrigger, resuming at done()" in line
    assert '"moment"' not in line  # trigger kwargs never reach logs


def test_the_deferral_line_names_the_trigger_class_the_task_used() -> None:
    """A TimeDeltaTrigger is stored as the DateTimeTrigger it serializes as; the line names
    both, the one the task used first."""
    deferred = TaskDeferred(trigger=TimeDeltaTrigger(timedelta(minutes=5)), method_name="done")
    deferral = Deferral.from_exception(deferred)
    assert deferral.trigger_class == "triggers.temporal.TimeDeltaTrigger"
    assert deferral.classpath == "triggers.temporal.DateTimeTrigger"
    line = outcome_line(
        _decide(TaskResult(TaskState.DEFERRED, 0.2, deferral=deferral)), _run(), now=START
    )
    assert (
        "task deferred to triggers.temporal.TimeDeltaTrigger (stored as "
        "triggers.temporal.DateTimeTrigger), resuming at done()"
    ) in line
    assert str(deferred).startswith("deferred to triggers.temporal.TimeDeltaTrigger (stored as")
    # through the child's result (JSON) and back
    result = TaskResult.from_json(TaskResult(TaskState.DEFERRED, 0.2, deferral=deferral).to_json())
    assert result.deferral == deferral
    same = Deferral.from_exception(TaskDeferred(trigger=FileTrigger("/x"), method_name="done"))
    assert same.described == "triggers.file.FileTrigger"


def test_spec_carries_the_context_and_round_trips() -> None:
    run = _run(next_method="done", next_kwargs='{"x":1}', deferral_count=1)
    spec = build_spec(run, dags_folder=Path("/dags"), plugins_folder=None, default_deferrable=True)
    assert TaskSpec.from_json(spec.to_json()) == spec
    assert (spec.next_method, spec.next_kwargs, spec.deferral_count) == ("done", '{"x":1}', 1)
    assert datetime.fromisoformat(spec.try_started_at) == START
    context = loads(spec.context)
    assert isinstance(context, dict)
    assert context["default_deferrable"] is True and context["try_number"] == 1
    # no triggering events: the task's process reads them when it needs them
    assert "triggering_asset_events" not in context


def test_redacted_passes_only_the_reason_through_the_redactor() -> None:
    retry_at = datetime(2026, 1, 1, tzinfo=UTC)
    outcome = Outcome(Decision.RETRY, 1.5, reason="boom pw-123", retry_at=retry_at)
    redacted = outcome.redacted(lambda text: text.replace("pw-123", "***"))
    assert redacted == Outcome(Decision.RETRY, 1.5, reason="boom ***", retry_at=retry_at)
    assert "pw-123" not in redacted.describe()
    plain = Outcome(Decision.SUCCEED)
    assert plain.redacted(lambda text: "changed") is plain
