"""Retries with a delay, the pure parts: the operator's arguments, how long a failed try
waits (Airflow's ``retry_delay`` / ``retry_exponential_backoff`` / ``max_retry_delay``), and
the outcome and log line of a try that will be retried."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.authoring.baseoperator import DEFAULT_RETRY_DELAY, BaseOperator
from engine.authoring.dag import DAG, take_registered_dags
from engine.authoring.errors import DagDefinitionError
from engine.dag_processing.parsing import describe_dag
from engine.db.queries.tasks import TaskRun
from engine.execution.protocol import TaskResult
from engine.executor.outcomes import (
    Decision,
    Outcome,
    decide_outcome,
    outcome_line,
)
from engine.states import TaskState
from engine.task_retries import MAX_BACKOFF_S, retry_wait_s

if TYPE_CHECKING:
    from collections.abc import Iterator

START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
NOW = START + timedelta(seconds=10)


class Noop(BaseOperator):
    def execute(self, context: dict[str, Any]) -> None:
        return None


@pytest.fixture(autouse=True)
def _no_registered_dags() -> Iterator[None]:
    yield
    take_registered_dags()


def _run(**changes: Any) -> TaskRun:
    values: dict[str, Any] = {
        "ti_id": 7,
        "dag_id": "d",
        "run_id": "r1",
        "task_id": "t",
        "fileloc": "/dags/d.py",
        "try_number": 1,
        "max_tries": 3,
        "try_started_at": START,
        "next_method": None,
        "next_kwargs": None,
        "deferral_count": 0,
        "execution_timeout_s": None,
    }
    values.update(changes)
    return TaskRun(**values)


def _fail(run: TaskRun, result: TaskResult | None = None, **kwargs: Any) -> Outcome:
    options: dict[str, Any] = {
        "returncode": 1,
        "interrupted": False,
        "killed_for_timeout": False,
        "wall_s": 1.5,
        "now": NOW,
    }
    options.update(kwargs)
    return decide_outcome(result, run, **options)


def _wait(
    try_number: int, *, delay_s: float = 10.0, max_s: float | None = None, key: str = "k"
) -> float:
    return retry_wait_s(
        delay_s=delay_s,
        exponential_backoff=True,
        max_delay_s=max_s,
        try_number=try_number,
        key=f"{key}#{try_number}",
    )


# --- the operator's arguments -------------------------------------------------------------


def test_a_task_waits_five_minutes_by_default_as_in_airflow() -> None:
    op = Noop(task_id="t")
    assert op.retry_delay == DEFAULT_RETRY_DELAY == timedelta(seconds=300)
    assert (op.retry_exponential_backoff, op.max_retry_delay) == (False, None)


def test_delays_take_a_timedelta_or_a_number_of_seconds_like_airflow() -> None:
    op = Noop(
        task_id="t",
        retry_delay=2.5,
        retry_exponential_backoff=True,
        max_retry_delay=timedelta(minutes=1),
    )
    assert (op.retry_delay, op.max_retry_delay) == (timedelta(seconds=2.5), timedelta(minutes=1))
    assert Noop(task_id="u", retry_delay=timedelta(0), max_retry_delay=30).max_retry_delay == (
        timedelta(seconds=30)
    )


def test_default_args_fill_the_retry_arguments() -> None:
    defaults = {"retry_delay": 7, "retry_exponential_backoff": True, "max_retry_delay": 60.0}
    with DAG("d", default_args=defaults, auto_register=False):
        filled = Noop(task_id="filled")
        own = Noop(task_id="own", retry_delay=timedelta(seconds=1))
    assert (filled.retry_delay, filled.retry_exponential_backoff) == (timedelta(seconds=7), True)
    assert filled.max_retry_delay == timedelta(minutes=1)
    assert (own.retry_delay, own.retry_exponential_backoff) == (timedelta(seconds=1), True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"retry_delay": -1}, "retry_delay must not be negative, got -1"),
        ({"retry_delay": timedelta(seconds=-1)}, "retry_delay must not be negative"),
        ({"retry_delay": "5m"}, "retry_delay must be a timedelta or a number of seconds"),
        ({"retry_delay": True}, "retry_delay must be a timedelta or a number of seconds"),
        ({"max_retry_delay": float("inf")}, "max_retry_delay must be a timedelta or a number"),
        ({"max_retry_delay": float("nan")}, "max_retry_delay must be a timedelta or a number"),
        ({"retry_exponential_backoff": "yes"}, "retry_exponential_backoff"),
    ],
)
def test_bad_retry_arguments_are_refused_naming_the_task(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(DagDefinitionError, match=message) as raised:
        Noop(task_id="t", **kwargs)
    assert "task 't'" in str(raised.value)


def test_the_parsed_task_carries_its_retry_settings() -> None:
    with DAG("d", auto_register=False) as dag:
        Noop(task_id="plain")
        Noop(
            task_id="backoff",
            retry_delay=timedelta(seconds=1.5),
            retry_exponential_backoff=True,
            max_retry_delay=timedelta(hours=1),
        )
    tasks = {t.task_id: t for t in describe_dag(dag).tasks}
    plain, backoff = tasks["plain"], tasks["backoff"]
    assert (plain.retry_delay_s, plain.retry_exponential_backoff, plain.max_retry_delay_s) == (
        300.0,
        False,
        None,
    )
    assert (backoff.retry_delay_s, backoff.retry_exponential_backoff) == (1.5, True)
    assert backoff.max_retry_delay_s == 3600.0


# --- how long a failed try waits ----------------------------------------------------------


def test_without_backoff_every_try_waits_retry_delay_and_max_retry_delay_does_not_apply() -> None:
    for try_number in (1, 2, 10):
        wait = retry_wait_s(
            delay_s=300.0,
            exponential_backoff=False,
            max_delay_s=60.0,  # Airflow caps only the exponential backoff
            try_number=try_number,
            key="k",
        )
        assert wait == 300.0


@pytest.mark.parametrize("try_number", [1, 2, 3, 4, 5])
def test_exponential_backoff_doubles_with_a_jitter_below_the_next_doubling(
    try_number: int,
) -> None:
    base = 10 * 2 ** (try_number - 1)  # 10, 20, 40, 80, 160 s
    waits = {_wait(try_number, key=f"task-{i}") for i in range(50)}
    assert all(base <= w < 2 * base for w in waits)
    assert len(waits) > 1  # tasks failing together do not all come back at once


def test_the_jitter_is_fixed_by_the_task_instance_and_try() -> None:
    assert _wait(3, key="a") == _wait(3, key="a")
    assert len({_wait(3, key=k) for k in "abcdefgh"}) > 1


def test_a_short_delay_backs_off_from_at_least_a_second() -> None:
    for delay_s in (0.0, 0.3):
        assert 1 <= _wait(1, delay_s=delay_s) < 2
    assert _wait(3, delay_s=0.3) == 2  # ceil(0.3 * 4) = 2, jitter in [0, 2) whole seconds
    assert float(_wait(1, delay_s=0.3)).is_integer()


def test_backoff_stops_at_max_retry_delay_and_at_a_day() -> None:
    assert _wait(6, max_s=30.0) == 30.0  # 320 s and more, capped
    assert _wait(1, max_s=30.0) < 20  # under the cap: unchanged
    assert _wait(20) == MAX_BACKOFF_S == 86400
    assert _wait(20, max_s=7 * 86400.0) == 86400  # max_retry_delay does not lift the cap


def test_a_huge_try_number_does_not_overflow() -> None:
    assert _wait(10**6) == MAX_BACKOFF_S
    assert _wait(10**6, delay_s=1e-9) == MAX_BACKOFF_S


@given(
    delay_s=st.floats(min_value=0, max_value=1e7),
    try_number=st.integers(min_value=1, max_value=200),
    max_s=st.none() | st.floats(min_value=0, max_value=1e7),
    key=st.text(max_size=20),
)
def test_a_backoff_wait_is_bounded_by_its_doubling_and_its_caps(
    delay_s: float, try_number: int, max_s: float | None, key: str
) -> None:
    wait = retry_wait_s(
        delay_s=delay_s,
        exponential_backoff=True,
        max_delay_s=max_s,
        try_number=try_number,
        key=key,
    )
    cap = MAX_BACKOFF_S if max_s is None else min(MAX_BACKOFF_S, max_s)
    base = max(delay_s * 2.0 ** min(try_number - 1, 64), 1.0)
    assert 0 <= wait <= cap
    assert wait >= min(base, cap) or wait == cap


# --- the outcome of a failed try ----------------------------------------------------------


def test_a_failed_try_with_tries_left_waits_until_now_plus_its_delay() -> None:
    outcome = _fail(
        _run(retry_delay_s=300.0), TaskResult(TaskState.FAILED, 0.2, error="ValueError: no")
    )
    assert outcome.decision is Decision.RETRY
    assert (outcome.retry_at, outcome.retry_wait_s) == (NOW + timedelta(minutes=5), 300.0)
    assert outcome.describe() == (
        "task failed: ValueError: no; it will be retried at 2030-01-01T12:05:10.000+00:00 "
        "(in 0:05:00)"
    )


def test_every_way_a_try_can_fail_gets_the_delay() -> None:
    run = _run(retry_delay_s=1.5, execution_timeout_s=5)
    dead = _fail(run, returncode=-9)
    timed_out = _fail(run, returncode=-9, killed_for_timeout=True)
    for outcome in (dead, timed_out):
        assert outcome.decision is Decision.RETRY
        assert outcome.retry_at == NOW + timedelta(seconds=1.5)
    assert "it will be retried at 2030-01-01T12:00:11.500+00:00 (in 1.5s)" in dead.describe()


def test_the_last_try_fails_without_a_retry_time() -> None:
    outcome = _fail(_run(try_number=4, max_tries=3), TaskResult(TaskState.FAILED, 0.2, error="E"))
    assert (outcome.decision, outcome.retry_at) == (Decision.FAIL, None)
    no_retry = TaskResult(TaskState.FAILED, 0.2, error="E", no_retry=True)  # AirflowFailException
    assert _fail(_run(), no_retry).retry_at is None


def test_the_backoff_uses_the_try_that_failed() -> None:
    run = _run(try_number=3, retry_delay_s=10.0, retry_exponential_backoff=True)
    outcome = _fail(run, TaskResult(TaskState.FAILED, 0.2, error="E"))
    expected = retry_wait_s(
        delay_s=10.0, exponential_backoff=True, max_delay_s=None, try_number=3, key="d#t#r1#3"
    )
    assert 40 <= outcome.retry_wait_s == expected < 80
    assert outcome.retry_at == NOW + timedelta(seconds=expected)


def test_a_delay_beyond_the_calendar_waits_as_long_as_a_datetime_goes() -> None:
    outcome = _fail(_run(retry_delay_s=timedelta.max.total_seconds()))
    assert outcome.retry_at == datetime.max.replace(tzinfo=UTC)


def test_the_log_says_when_the_task_is_retried() -> None:
    run = _run(retry_delay_s=0.0)
    outcome = _fail(run, TaskResult(TaskState.FAILED, 0.2, error="RuntimeError: down"))
    line = outcome_line(outcome, run, now=NOW)
    assert line == (
        "=== 2030-01-01T12:00:10.000+00:00 try 1: task failed: RuntimeError: down; it will be "
        "retried at 2030-01-01T12:00:10.000+00:00 (in 0s) ===\n"
    )
