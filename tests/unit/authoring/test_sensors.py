"""Sensors defer or poke according to resolve_deferrable; poke mode on a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engine import BaseSensorOperator, DagDefinitionError, TaskDeferred, resolve_deferrable
from engine.authoring.context import DEFAULT_DEFERRABLE_KEY
from engine.authoring.errors import SensorTimeout
from engine.authoring.sensors import DateTimeSensor, FileSensor, TimeDeltaSensor
from triggers.temporal import TimeDeltaTrigger


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0
        self.sleeps: list[float] = []


class CountingSensor(BaseSensorOperator):
    """Succeeds on the n-th poke; never defers; time is a fake clock."""

    def __init__(self, *, succeed_on: int | None, clock: FakeClock, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.succeed_on = succeed_on
        self.pokes = 0
        self.clock = clock

    def poke(self, context: dict[str, Any]) -> bool:
        self.pokes += 1
        return self.succeed_on is not None and self.pokes >= self.succeed_on

    def _monotonic(self) -> float:
        return self.clock.now_s

    def _sleep(self, seconds: float) -> None:
        self.clock.sleeps.append(seconds)
        self.clock.now_s += seconds


def context(default_deferrable: bool) -> dict[str, Any]:
    return {DEFAULT_DEFERRABLE_KEY: default_deferrable}


@pytest.mark.parametrize(
    ("own", "default", "expected"),
    [
        (None, False, False),
        (None, True, True),
        (True, False, True),
        (False, True, False),
        (True, True, True),
        (False, False, False),
    ],
)
def test_resolve_deferrable(own: bool | None, default: bool, expected: bool) -> None:
    sensor = TimeDeltaSensor(task_id="t", delta=timedelta(0), deferrable=own)
    assert resolve_deferrable(sensor, default) is expected


def test_objects_without_the_attribute_follow_the_default() -> None:
    assert resolve_deferrable(object(), True) is True
    assert resolve_deferrable(object(), False) is False


@pytest.mark.parametrize(("own", "default"), [(True, False), (None, True)])
def test_time_delta_sensor_defers_when_deferrable(own: bool | None, default: bool) -> None:
    sensor = TimeDeltaSensor(task_id="t", delta=timedelta(hours=1), deferrable=own, timeout=600)
    before = datetime.now(UTC)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute(context(default))
    deferred = info.value
    assert deferred.classpath == "triggers.temporal.DateTimeTrigger"
    assert deferred.trigger_kwargs["moment"] >= before + timedelta(hours=1)
    assert deferred.method_name == "execute_complete"
    assert deferred.timeout == timedelta(seconds=600)
    assert sensor.resume_execution("execute_complete", {"event": "x"}, {}) is None


@pytest.mark.parametrize(("own", "default"), [(False, True), (None, False)])
def test_time_delta_sensor_pokes_when_not_deferrable(own: bool | None, default: bool) -> None:
    sensor = TimeDeltaSensor(task_id="t", delta=timedelta(0), deferrable=own)
    assert sensor.execute(context(default)) is None


def test_date_time_sensor() -> None:
    past = datetime(2000, 1, 1, tzinfo=UTC)
    future = datetime.now(UTC) + timedelta(days=1)
    assert DateTimeSensor(task_id="p", target_time=past).execute(context(False)) is None
    with pytest.raises(TaskDeferred) as info:
        DateTimeSensor(task_id="f", target_time=future, end_from_trigger=True).execute(
            context(True)
        )
    assert info.value.trigger_kwargs == {"moment": future, "end_from_trigger": True}
    with pytest.raises(DagDefinitionError, match="timezone-aware"):
        DateTimeSensor(task_id="n", target_time=datetime(2030, 1, 1))


def test_file_sensor_pokes_or_defers_to_a_file_trigger(tmp_path) -> None:
    target = tmp_path / "ready.csv"
    target.write_text("x")
    assert FileSensor(task_id="f", filepath=str(target)).execute(context(False)) is None
    pattern = str(tmp_path / "later*.csv")
    sensor = FileSensor(task_id="g", filepath=pattern, poke_interval=2, deferrable=True)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute(context(False))
    assert info.value.classpath == "triggers.file.FileTrigger"
    assert info.value.trigger_kwargs == {
        "filepath": pattern,
        "recursive": False,
        "poke_interval": 2.0,
    }
    assert not sensor.poke({})
    (tmp_path / "later1.csv").write_text("x")
    assert sensor.poke({})


def test_poke_loop_sleeps_between_pokes_until_success() -> None:
    clock = FakeClock()
    sensor = CountingSensor(task_id="c", succeed_on=3, clock=clock, poke_interval=10)
    sensor.execute(context(True))  # no deferral trigger: pokes even when deferrable
    assert sensor.pokes == 3
    assert clock.sleeps == [10, 10]


class AsyncCountingSensor(CountingSensor):
    """An ``async def poke``: awaited each time, never taken for a truthy coroutine."""

    async def poke(self, context: dict[str, Any]) -> bool:  # type: ignore[override]
        return super().poke(context)


class AsyncDeferringSensor(BaseSensorOperator):
    async def deferral_trigger(self, context: dict[str, Any]) -> Any:  # type: ignore[override]
        return TimeDeltaTrigger(timedelta(hours=1))


def test_an_async_poke_is_awaited_at_each_poke() -> None:
    clock = FakeClock()
    sensor = AsyncCountingSensor(task_id="c", succeed_on=3, clock=clock, poke_interval=10)
    sensor.execute(context(False))
    assert sensor.pokes == 3
    assert clock.sleeps == [10, 10]


def test_an_async_poke_that_never_succeeds_times_out() -> None:
    clock = FakeClock()
    sensor = AsyncCountingSensor(
        task_id="c", succeed_on=None, clock=clock, poke_interval=4, timeout=10
    )
    with pytest.raises(SensorTimeout):
        sensor.execute(context(False))
    assert sensor.pokes == 4


def test_an_async_deferral_trigger_is_awaited() -> None:
    sensor = AsyncDeferringSensor(task_id="d", deferrable=True)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute(context(False))
    assert info.value.classpath == "triggers.temporal.DateTimeTrigger"


def test_poke_loop_times_out() -> None:
    clock = FakeClock()
    sensor = CountingSensor(
        task_id="c", succeed_on=None, clock=clock, poke_interval=timedelta(seconds=4), timeout=10
    )
    with pytest.raises(SensorTimeout, match="'c' did not succeed within 10 s"):
        sensor.execute(context(False))
    assert clock.sleeps == [4, 4, 2]  # the last sleep is cut to the timeout
    assert sensor.pokes == 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"poke_interval": -1}, "poke_interval"),
        ({"timeout": -1}, "timeout"),
        ({"poke_interval": "5"}, "poke_interval"),
        ({"deferrable": "yes"}, "deferrable"),
    ],
)
def test_sensor_arguments_are_checked(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(DagDefinitionError, match=match):
        TimeDeltaSensor(task_id="t", delta=timedelta(0), **kwargs)


def test_context_default_must_be_a_bool() -> None:
    sensor = TimeDeltaSensor(task_id="t", delta=timedelta(0))
    with pytest.raises(TypeError, match="default_deferrable"):
        sensor.execute({DEFAULT_DEFERRABLE_KEY: "true"})
