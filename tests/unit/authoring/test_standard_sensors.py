"""PythonSensor / @task.sensor, BashSensor, TimeSensor, DayOfWeekSensor: their pokes, with
the context a task gets (hydrate_context) and fake clocks where time matters."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from engine import DAG, DagDefinitionError, PokeReturnValue, TaskDeferred, task
from engine.authoring.arguments import forget_warnings
from engine.authoring.context import DEFAULT_DEFERRABLE_KEY
from engine.exceptions import AirflowFailException
from engine.execution.context import hydrate_context
from engine.sensors import (
    BashSensor,
    DayOfWeekSensor,
    PythonSensor,
    TimeSensor,
    TimeSensorAsync,
    WeekDay,
)

MONDAY = datetime(2026, 3, 2, 6, 0, tzinfo=UTC)  # a Monday


def context_for(op: Any, *, logical_date: datetime | None = MONDAY, **run: Any) -> dict[str, Any]:
    raw = {
        "dag_id": op.dag.dag_id,
        "run_id": "r1",
        "task_id": op.task_id,
        "try_number": 1,
        "run": {"run_id": "r1", "logical_date": logical_date, "run_after": logical_date, **run},
        DEFAULT_DEFERRABLE_KEY: False,
    }
    return hydrate_context(raw, op)


def test_python_sensor_passes_args_and_context_and_wraps_bools() -> None:
    seen: list[Any] = []

    def ready(limit, *, ds, templates_dict, flag=None):
        seen.append((limit, ds, templates_dict, flag))
        return len(seen) >= 2

    with DAG("py"):
        sensor = PythonSensor(
            task_id="s",
            python_callable=ready,
            op_args=[5],
            op_kwargs={"flag": "on"},
            templates_dict={"k": "v"},
            poke_interval=0,
        )
    assert sensor.execute(context_for(sensor)) is None
    assert seen == [(5, "2026-03-02", {"k": "v"}, "on")] * 2
    assert sensor.poke(context_for(sensor)).is_done  # a bool result is wrapped


def test_python_sensor_result_is_the_xcom_value() -> None:
    answers = iter([PokeReturnValue(False), PokeReturnValue(True, xcom_value={"n": 2})])
    with DAG("py"):
        sensor = PythonSensor(task_id="s", python_callable=lambda: next(answers), poke_interval=0)
    assert sensor.execute(context_for(sensor)) == {"n": 2}


def test_task_sensor_decorator_builds_a_sensor_with_upstream_results() -> None:
    with DAG("deco") as dag:

        @task
        def size() -> int:
            return 3

        @task.sensor(poke_interval=7, timeout=30, mode="reschedule", soft_fail=True)
        def big_enough(n, ti):
            return PokeReturnValue(is_done=n >= 3, xcom_value=n * 10)

        waits = big_enough(size())
    assert dag.task_dict["big_enough"] is waits
    assert (waits.poke_interval, waits.timeout, waits.mode, waits.soft_fail) == (
        7,
        30,
        "reschedule",
        True,
    )
    assert waits.upstream_task_ids == {"size"}
    raw = {
        "dag_id": "deco",
        "run_id": "r1",
        "task_id": "big_enough",
        "run": {"run_id": "r1", "logical_date": MONDAY},
        "xcoms": {"size": {"return_value": 3}},
        DEFAULT_DEFERRABLE_KEY: False,
    }
    assert waits.execute(hydrate_context(raw, waits)) == 30


def test_bash_sensor_exit_codes(tmp_path) -> None:
    with DAG("bash"):
        done = BashSensor(task_id="done", bash_command="exit 0")
        later = BashSensor(task_id="later", bash_command="exit 3")
        coded = BashSensor(
            task_id="coded", bash_command="exit $CODE", env={"CODE": "7"}, retry_exit_code=7
        )
        broken = BashSensor(task_id="broken", bash_command="exit 2", retry_exit_code=7)
        here = BashSensor(
            task_id="here",
            bash_command='test "$PWD" = "$WANT"',
            cwd=str(tmp_path),
            env={"WANT": str(tmp_path)},
        )
    assert done.poke(context_for(done)) is True
    assert later.poke(context_for(later)) is False  # no retry_exit_code: any code means not yet
    assert coded.poke(context_for(coded)) is False
    with pytest.raises(AirflowFailException, match="exited with code 2"):
        broken.poke(context_for(broken))
    assert here.poke(context_for(here)) is True
    with pytest.raises(DagDefinitionError, match="retry_exit_code"):
        BashSensor(task_id="bad", bash_command="true", retry_exit_code="7")  # type: ignore[arg-type]


def test_bash_sensor_logs_the_command_output(caplog) -> None:
    with DAG("bash"):
        sensor = BashSensor(task_id="echo", bash_command="echo checking; exit 1", retry_exit_code=1)
    with caplog.at_level(logging.INFO, logger="engine.authoring.bash"):
        assert sensor.poke(context_for(sensor)) is False
    assert "checking" in caplog.messages


class FixedTimeSensor(TimeSensor):
    now = MONDAY

    def _utcnow(self) -> datetime:
        return self.now


def test_time_sensor_targets_the_runs_day_in_the_dag_time_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    with DAG("t", start_date=datetime(2026, 1, 1, tzinfo=berlin)):
        sensor = FixedTimeSensor(task_id="six", target_time=time(18, 0))
    run_after = datetime(2026, 3, 2, 23, 30, tzinfo=UTC)  # already March 3rd in Berlin
    context = context_for(sensor, logical_date=None, run_after=run_after)
    assert sensor.target_datetime(context) == datetime(2026, 3, 3, 17, 0, tzinfo=UTC)
    sensor.now = datetime(2026, 3, 3, 16, 59, tzinfo=UTC)
    assert not sensor.poke(context)
    sensor.now = datetime(2026, 3, 3, 17, 0, tzinfo=UTC)
    assert sensor.poke(context)


def test_time_sensor_deferrable_defers_to_a_date_time_trigger() -> None:
    with DAG("t"):
        sensor = TimeSensor(task_id="noon", target_time=time(12, 0), deferrable=True, timeout=900)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute(context_for(sensor))
    assert info.value.classpath == "triggers.temporal.DateTimeTrigger"
    assert info.value.trigger_kwargs == {
        "moment": datetime(2026, 3, 2, 12, 0, tzinfo=UTC),
        "end_from_trigger": False,
    }
    assert info.value.timeout == timedelta(seconds=900)


def test_time_sensor_async_is_a_deferrable_time_sensor(caplog) -> None:
    forget_warnings()
    with caplog.at_level(logging.WARNING, logger="engine.authoring.arguments"), DAG("t"):
        sensor = TimeSensorAsync(task_id="a", target_time=time(1, 0))
    assert sensor.deferrable is True
    assert any("deprecated" in message for message in caplog.messages)
    with pytest.raises(DagDefinitionError, match=r"datetime\.time"):
        TimeSensor(task_id="bad", target_time="12:00")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("week_day", "expected"),
    [
        ("Monday", True),
        ("TUESDAY", False),
        ({"Saturday", "Sunday"}, False),
        ({WeekDay.MONDAY, WeekDay.FRIDAY}, True),
        (WeekDay.MONDAY, True),
    ],
)
def test_day_of_week_sensor_on_the_logical_date(week_day: Any, expected: bool) -> None:
    with DAG("w"):
        sensor = DayOfWeekSensor(task_id="d", week_day=week_day, use_task_logical_date=True)
    assert sensor.poke(context_for(sensor)) is expected


def test_day_of_week_sensor_uses_today_unless_asked_for_the_logical_date() -> None:
    class Sunday(DayOfWeekSensor):
        def _utcnow(self) -> datetime:
            return datetime(2026, 3, 8, 12, tzinfo=UTC)

    with DAG("w"):
        sensor = Sunday(task_id="d", week_day="sunday")
    assert sensor.poke(context_for(sensor)) is True  # the logical date is a Monday
    with pytest.raises(DagDefinitionError, match="not a day of the week"):
        DayOfWeekSensor(task_id="bad", week_day="Funday")


# The standard provider's sensor example DAG as Airflow 3 writes it; only the imports changed
# (``airflow.providers.standard.sensors.<module>`` and ``airflow.sdk`` -> ``engine.sensors``).
PORTED_SENSOR_DAG = """
import datetime

import pendulum

from engine import DAG, task
from engine.sensors import (
    BashSensor,
    DayOfWeekSensor,
    ExternalTaskSensor,
    FileSensor,
    PokeReturnValue,
    PythonSensor,
    TimeDeltaSensor,
    TimeSensor,
    WeekDay,
)


def success_callable():
    return True


with DAG(
    dag_id="example_sensors",
    schedule=None,
    start_date=pendulum.datetime(2021, 1, 1, tz="UTC"),
    catchup=False,
    tags=["example"],
):
    t0 = TimeDeltaSensor(task_id="wait_some_seconds", delta=datetime.timedelta(seconds=2))
    t1 = TimeSensor(
        task_id="fire_immediately",
        target_time=datetime.datetime.now(tz=datetime.timezone.utc).time(),
    )
    t2 = BashSensor(task_id="Sensor_succeeds", bash_command="exit 0")
    t3 = BashSensor(task_id="Sensor_fails_after_3_seconds", timeout=3, soft_fail=True,
                    bash_command="exit 1")
    t4 = FileSensor(task_id="wait_for_file", filepath="/tmp/temporary_file_for_testing")
    t5 = PythonSensor(task_id="success_sensor_python", python_callable=success_callable)
    t6 = DayOfWeekSensor(task_id="week_day_sensor_failing_on_timeout", timeout=3,
                         soft_fail=True, week_day=WeekDay.MONDAY)
    t7 = ExternalTaskSensor(task_id="wait_upstream", external_dag_id="other", external_task_id="t",
                            allowed_states=["success"], failed_states=["failed", "skipped"],
                            mode="reschedule")

    @task.sensor(poke_interval=60, timeout=3600, mode="reschedule")
    def wait_for_upstream() -> PokeReturnValue:
        return PokeReturnValue(is_done=True, xcom_value="xcom_value")

    [t0, t1, t2, t3, t4, t5, t6, t7] >> wait_for_upstream()
"""


def test_a_ported_sensor_dag_parses_without_warnings(tmp_path, caplog) -> None:
    from engine.authoring.dag import take_registered_dags
    from engine.authoring.dag_files import collect_dags, import_dag_file

    take_registered_dags()
    forget_warnings()
    path = tmp_path / "example_sensors.py"
    path.write_text(PORTED_SENSOR_DAG)
    with caplog.at_level(logging.WARNING):
        (parsed,) = collect_dags(import_dag_file(path), str(path))
    assert len(parsed.task_ids) == 9
    assert parsed.get_task("wait_for_upstream").upstream_task_ids == set(parsed.task_ids) - {
        "wait_for_upstream"
    }
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
