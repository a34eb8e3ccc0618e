"""BaseSensorOperator's waiting rules on a fake clock: reschedule mode (defer between pokes,
timeout from the first poke), exponential backoff, max_wait, soft_fail / never_fail, and
PokeReturnValue results."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engine import BaseSensorOperator, PokeReturnValue, TaskDeferred
from engine.authoring.context import DEFAULT_DEFERRABLE_KEY
from engine.authoring.errors import SensorTimeout
from engine.authoring.sensor_base import RESCHEDULE_METHOD, next_poke_interval
from engine.exceptions import AirflowFailException, AirflowSkipException
from triggers.serde import dumps, loads

START = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
POKING = {DEFAULT_DEFERRABLE_KEY: False}


class Clock:
    def __init__(self) -> None:
        self.now = START
        self.monotonic_s = 0.0
        self.sleeps: list[float] = []


class ScriptSensor(BaseSensorOperator):
    """Pokes through a script of outcomes (values or exceptions) on a shared fake clock."""

    def __init__(self, *, script: list[Any], clock: Clock, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.script = script  # shared by the fresh instances of one "task"
        self.clock = clock

    def poke(self, context: dict[str, Any]) -> Any:
        outcome = self.script.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _utcnow(self) -> datetime:
        return self.clock.now

    def _monotonic(self) -> float:
        return self.clock.monotonic_s

    def _sleep(self, seconds: float) -> None:
        self.clock.sleeps.append(seconds)
        self.clock.monotonic_s += seconds
        self.clock.now += timedelta(seconds=seconds)


def resume(sensor_kwargs: dict[str, Any], deferred: TaskDeferred, clock: Clock) -> Any:
    """What the executor does once the time trigger fired: a fresh instance resumes with the
    stored kwargs (through tagged JSON, as they are stored) and the trigger's event."""
    clock.now = deferred.trigger_kwargs["moment"]
    kwargs = loads(dumps(deferred.kwargs))
    fresh = ScriptSensor(**sensor_kwargs)
    return fresh.resume_execution(
        deferred.method_name, {**kwargs, "event": deferred.trigger_kwargs["moment"]}, POKING
    )


def defers_again(sensor_kwargs: dict[str, Any], deferred: TaskDeferred, clock: Clock) -> Any:
    """Resume after ``deferred`` fired; the next deferral it raises."""
    with pytest.raises(TaskDeferred) as again:
        resume(sensor_kwargs, deferred, clock)
    return again.value


def test_reschedule_mode_defers_between_pokes_and_returns_the_poke_result() -> None:
    clock = Clock()
    script: list[Any] = [False, False, PokeReturnValue(True, {"rows": 3})]
    args = {"task_id": "r", "script": script, "clock": clock, "mode": "reschedule"}
    args |= {"poke_interval": 30, "timeout": 600}
    with pytest.raises(TaskDeferred) as first:
        ScriptSensor(**args).execute(POKING)
    assert first.value.classpath == "triggers.temporal.DateTimeTrigger"
    assert first.value.method_name == RESCHEDULE_METHOD
    assert first.value.trigger_kwargs["moment"] == START + timedelta(seconds=30)
    assert first.value.kwargs == {"first_poke_at": START, "poke_count": 2}
    with pytest.raises(TaskDeferred) as second:
        resume(args, first.value, clock)
    assert second.value.kwargs == {"first_poke_at": START, "poke_count": 3}  # kept
    assert second.value.trigger_kwargs["moment"] == START + timedelta(seconds=60)
    assert resume(args, second.value, clock) == {"rows": 3}
    assert script == [] and clock.sleeps == []  # never slept in the slot


@pytest.mark.parametrize("soft_fail", [False, True])
def test_reschedule_timeout_counts_from_the_first_poke(soft_fail: bool) -> None:
    clock = Clock()
    args = {"task_id": "r", "script": [False] * 5, "clock": clock, "mode": "reschedule"}
    args |= {"poke_interval": 40, "timeout": 100, "soft_fail": soft_fail}
    with pytest.raises(TaskDeferred) as first:
        ScriptSensor(**args).execute(POKING)
    step = defers_again(args, first.value, clock)  # t=40
    step = defers_again(args, step, clock)  # t=80: the last wait is cut to the timeout
    assert step.trigger_kwargs["moment"] == START + timedelta(seconds=100)
    expected = AirflowSkipException if soft_fail else SensorTimeout
    with pytest.raises(expected, match="did not succeed within 100 s"):
        resume(args, step, clock)  # t=100: timed out, counted from the first poke


def test_a_deferral_timeout_of_a_sensor_is_a_sensor_timeout() -> None:
    clock = Clock()
    sensor = ScriptSensor(task_id="d", script=[], clock=clock)
    with pytest.raises(SensorTimeout, match="deferral timed out"):
        sensor.resume_execution("__fail__", {"error": "trigger timeout"}, POKING)


def test_poke_mode_returns_the_xcom_value_of_a_poke_return_value() -> None:
    clock = Clock()
    script: list[Any] = [PokeReturnValue(False, "ignored"), PokeReturnValue(True, [1, 2])]
    sensor = ScriptSensor(task_id="p", script=script, clock=clock, poke_interval=5)
    assert sensor.execute(POKING) == [1, 2]
    assert clock.sleeps == [5]


def test_poke_mode_with_exponential_backoff_waits_longer_each_time() -> None:
    clock = Clock()
    sensor = ScriptSensor(
        task_id="b",
        script=[False] * 6 + [True],
        clock=clock,
        poke_interval=10,
        exponential_backoff=True,
        max_wait=timedelta(seconds=70),
    )
    sensor.execute(POKING)
    sleeps = clock.sleeps
    assert len(sleeps) == 6
    for count, wait in enumerate(sleeps[:3], start=1):
        low = 10 * 2 ** (count - 2)
        assert low <= wait < 2 * low
    assert sleeps[4:] == [70, 70]  # capped by max_wait


def test_backoff_intervals() -> None:
    def wait(count: int, *, backoff: bool = True, key: str = "k", **caps: Any) -> float:
        limits = {"max_wait_s": None, "remaining_s": 1e9, **caps}
        return next_poke_interval(60, count, exponential_backoff=backoff, jitter_key=key, **limits)

    assert wait(7, backoff=False) == 60
    waits = [wait(n) for n in range(1, 6)]
    assert waits == [wait(n) for n in range(1, 6)]  # deterministic per task and first poke
    assert all(60 * 2 ** (n - 2) <= w < 60 * 2 ** (n - 1) for n, w in enumerate(waits, 1))
    assert [wait(n, key="other") for n in range(1, 6)] != waits  # sensors spread out
    assert wait(5, max_wait_s=100.0, remaining_s=50.0) == 50
    assert wait(5, max_wait_s=100.0) == 100


def test_reschedule_mode_with_backoff_uses_the_stored_poke_count() -> None:
    clock = Clock()
    args = {"task_id": "rb", "script": [False] * 4, "clock": clock, "mode": "reschedule"}
    args |= {"poke_interval": 8, "exponential_backoff": True, "timeout": 10_000}
    with pytest.raises(TaskDeferred) as first:
        ScriptSensor(**args).execute(POKING)
    step = first.value
    waits = []
    for _ in range(3):
        waits.append((step.trigger_kwargs["moment"] - clock.now).total_seconds())
        step = defers_again(args, step, clock)
    for count, wait in enumerate(waits, start=1):
        low = 8 * 2 ** (count - 2)
        assert low <= wait < 2 * low


@pytest.mark.parametrize(
    ("flags", "error", "outcome"),
    [
        ({}, AirflowFailException("no"), AirflowFailException),
        ({"soft_fail": True}, AirflowFailException("no"), AirflowSkipException),
        ({"soft_fail": True}, ValueError("bug"), ValueError),
        ({"never_fail": True}, ValueError("bug"), AirflowSkipException),
        ({"never_fail": True}, AirflowFailException("no"), AirflowSkipException),
        ({"silent_fail": True}, AirflowFailException("no"), AirflowFailException),
    ],
)
def test_what_an_error_of_poke_becomes(
    flags: dict[str, bool], error: BaseException, outcome: type[BaseException]
) -> None:
    sensor = ScriptSensor(task_id="e", script=[error], clock=Clock(), **flags)
    with pytest.raises(outcome):
        sensor.execute(POKING)


def test_never_fail_also_covers_a_poke_after_a_reschedule() -> None:
    clock = Clock()
    args = {"task_id": "n", "script": [False, OSError("gone")], "clock": clock}
    args |= {"mode": "reschedule", "never_fail": True}
    with pytest.raises(TaskDeferred) as step:
        ScriptSensor(**args).execute(POKING)
    with pytest.raises(AirflowSkipException, match="never_fail"):
        resume(args, step.value, clock)


def test_time_delta_sensor_counts_its_delta_from_the_first_poke_across_reschedules() -> None:
    from engine.sensors import TimeDeltaSensor

    clock = Clock()

    class Delta(TimeDeltaSensor):
        def _utcnow(self) -> datetime:
            return clock.now

    args = {"task_id": "td", "delta": timedelta(seconds=50), "mode": "reschedule"}
    args |= {"poke_interval": 20}
    with pytest.raises(TaskDeferred) as first:
        Delta(**args).execute(POKING)
    step = first.value
    for _ in range(2):  # t=20, t=40: not yet
        clock.now = step.trigger_kwargs["moment"]
        with pytest.raises(TaskDeferred) as again:
            Delta(**args).resume_execution(step.method_name, loads(dumps(step.kwargs)), POKING)
        step = again.value
    clock.now = step.trigger_kwargs["moment"]  # t=60: a fresh instance, same first poke
    assert (
        Delta(**args).resume_execution(step.method_name, loads(dumps(step.kwargs)), POKING) is None
    )


@pytest.mark.parametrize(
    ("flag", "outcome"), [("soft_fail", AirflowSkipException), ("never_fail", SensorTimeout)]
)
def test_a_poke_timeout_skips_with_soft_fail_only(flag: str, outcome: type) -> None:
    """As Airflow 3: never_fail covers errors of poke, not the sensor timing out."""
    sensor = ScriptSensor(
        task_id="t", script=[False] * 3, clock=Clock(), poke_interval=5, timeout=10, **{flag: True}
    )
    with pytest.raises(outcome):
        sensor.execute(POKING)
