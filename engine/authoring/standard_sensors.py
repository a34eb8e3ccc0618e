"""The standard sensors of Airflow's standard provider: ``PythonSensor`` (and ``@task.sensor``),
``BashSensor``, ``TimeSensor`` (``TimeSensorAsync``) and ``DayOfWeekSensor`` (``WeekDay``).

::

    PythonSensor(task_id="ready", python_callable=lambda: os.path.exists("/data/ready"),
                 poke_interval=30, timeout=3600, mode="reschedule")

    @task.sensor(poke_interval=60, timeout=3600, soft_fail=True)
    def export_ready(ds=None) -> PokeReturnValue:
        size = export_size(ds)
        return PokeReturnValue(is_done=size > 0, xcom_value=size)  # the task's result

    BashSensor(task_id="up", bash_command="curl -sf http://svc/health", retry_exit_code=7)
    TimeSensor(task_id="after_six", target_time=time(18, 0), deferrable=True)
    DayOfWeekSensor(task_id="weekend", week_day={WeekDay.SATURDAY, WeekDay.SUNDAY})

Every one of them takes ``BaseSensorOperator``'s arguments (``poke_interval``, ``timeout``,
``mode``, ``soft_fail`` ...). Only ``TimeSensor`` is deferrable, as in Airflow.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, time, tzinfo
from typing import TYPE_CHECKING, Any, overload

from engine.authoring.arguments import warn_once
from engine.authoring.bash import _RunsBash, run_command
from engine.authoring.context import as_moment
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.operators import PythonOperator, TaskFactory
from engine.authoring.sensor_base import BaseSensorOperator, PokeReturnValue
from engine.authoring.xcom import XComArg
from engine.exceptions import AirflowException, AirflowFailException
from triggers.temporal import DateTimeTrigger

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from engine.authoring.context import Context
    from triggers.base import BaseTrigger

__all__ = (
    "BashSensor",
    "DayOfWeekSensor",
    "PythonSensor",
    "SensorTaskFactory",
    "TimeSensor",
    "TimeSensorAsync",
    "WeekDay",
    "sensor_task",
)


# --- PythonSensor and @task.sensor --------------------------------------------------------


class PythonSensor(BaseSensorOperator, PythonOperator):
    """Pokes ``python_callable(*op_args, **op_kwargs)`` until it returns something truthy, or a
    ``PokeReturnValue`` whose ``is_done`` is True (its ``xcom_value`` is the task's result).

    Called as ``PythonOperator`` calls it: parameters named like context keys (``ti``,
    ``ds``, ``params`` ...) receive them, ``**kwargs`` gets the context, ``templates_dict``,
    ``op_args`` and ``op_kwargs`` are templates, and results of other tasks passed in them
    are upstream and resolved. An ``async def`` callable is run to completion at each poke.
    """

    def poke(self, context: Context) -> PokeReturnValue:
        value = PythonOperator.execute(self, context)
        return value if isinstance(value, PokeReturnValue) else PokeReturnValue(bool(value))


class DecoratedSensorOperator(PythonSensor):
    """What ``@task.sensor`` adds to the DAG: a ``PythonSensor`` over the function."""


class SensorTaskFactory(TaskFactory):
    """What ``@task.sensor`` returns: each call adds a ``DecoratedSensorOperator``."""

    operator_class = DecoratedSensorOperator

    def __repr__(self) -> str:
        return f"<@task.sensor {getattr(self.function, '__qualname__', self.function)!r}>"


@overload
def sensor_task(python_callable: Callable[..., Any], /) -> SensorTaskFactory: ...


@overload
def sensor_task(**operator_kwargs: Any) -> Callable[[Callable[..., Any]], SensorTaskFactory]: ...


def sensor_task(
    python_callable: Callable[..., Any] | None = None, /, **operator_kwargs: Any
) -> SensorTaskFactory | Callable[[Callable[..., Any]], SensorTaskFactory]:
    """``@task.sensor`` / ``@task.sensor(poke_interval=..., timeout=..., mode=...)``: the
    function is poked until it returns True or ``PokeReturnValue(is_done=True, ...)``;
    takes ``@task``'s and the sensor arguments."""
    if python_callable is not None:
        return SensorTaskFactory(python_callable, **operator_kwargs)
    return functools.partial(SensorTaskFactory, **operator_kwargs)


# --- BashSensor -------------------------------------------------------------------------------


class BashSensor(_RunsBash, BaseSensorOperator):
    """Runs ``bash_command`` at each poke: exit code 0 means done.

    With ``retry_exit_code`` set, that exit code means "not yet" and any other non-zero
    code fails the sensor (``AirflowFailException``: no retry; a skip with ``soft_fail``);
    without it, every non-zero code means "not yet" (Airflow's behaviour). ``env``
    (None: the task process's environment), ``cwd`` (default: a fresh temporary directory)
    and ``output_encoding`` are ``BashOperator``'s; the output goes to the task log.
    ``bash_command`` and ``env`` are templates.
    """

    template_fields: Sequence[str] = ("bash_command", "env", "cwd")

    def __init__(
        self,
        *,
        bash_command: str,
        env: Mapping[str, str] | None = None,
        output_encoding: str = "utf-8",
        retry_exit_code: int | None = None,
        cwd: str | None = None,
        **kwargs: Any,
    ) -> None:
        where = f"{caller_location()}: sensor {kwargs.get('task_id')!r}"
        if not isinstance(bash_command, str | XComArg) or not str(bash_command).strip():
            raise DagDefinitionError(
                f"{where}: bash_command must be a non-empty str, got {bash_command!r}"
            )
        if retry_exit_code is not None and (
            isinstance(retry_exit_code, bool) or not isinstance(retry_exit_code, int)
        ):
            raise DagDefinitionError(
                f"{where}: retry_exit_code must be an int or None, got {retry_exit_code!r}"
            )
        super().__init__(**kwargs)
        self.bash_command: Any = bash_command
        self.retry_exit_code = retry_exit_code
        self._set_bash_options(
            where,
            env=env,
            append_env=False,
            output_encoding=output_encoding,
            skip_on_exit_code=None,
            cwd=cwd,
            output_processor=None,
        )

    def poke(self, context: Context) -> bool:
        command = self.bash_command
        if not isinstance(command, str) or not command.strip():
            raise AirflowException(
                f"sensor {self.task_id!r}: the bash command must be a non-empty str, "
                f"got {command!r}"
            )
        self._check_cwd()
        env = self._environment(context)
        argv = [shutil.which("bash") or "bash", "-c", command]
        with contextlib.ExitStack() as stack:
            cwd = self.cwd or stack.enter_context(tempfile.TemporaryDirectory(prefix="sluicetmp"))
            code = run_command(argv, env=env, cwd=cwd, output_encoding=self.output_encoding)
        if code.exit_code == 0:
            return True
        if self.retry_exit_code is not None and code.exit_code != self.retry_exit_code:
            raise AirflowFailException(
                f"sensor {self.task_id!r}: the command exited with code {code.exit_code}, "
                f"neither 0 (done) nor retry_exit_code {self.retry_exit_code} (not yet)"
            )
        return False


# --- TimeSensor -------------------------------------------------------------------------------


def _zone_of(task: BaseSensorOperator) -> tzinfo:
    zone = getattr(task.dag, "timezone", None)
    return zone if isinstance(zone, tzinfo) else UTC


class TimeSensor(BaseSensorOperator):
    """Waits until ``target_time`` (a time of day) on the run's day, in the DAG's time zone.

    The run's day is the date, in the DAG's time zone, of the run's ``run_after`` (when it
    became due), else of its logical date, else today. An aware ``target_time``
    (``time(18, 0, tzinfo=...)``) keeps its own zone. ``deferrable=True`` hands the wait to
    a ``DateTimeTrigger`` (``end_from_trigger=True``: the task ends on the triggerer).
    """

    def __init__(self, *, target_time: time, end_from_trigger: bool = False, **kwargs: Any) -> None:
        where = f"{caller_location()}: sensor {kwargs.get('task_id')!r}"
        if not isinstance(target_time, time):
            raise DagDefinitionError(
                f"{where}: target_time must be a datetime.time, got {target_time!r}"
            )
        if kwargs.pop("start_from_trigger", False):
            raise DagDefinitionError(
                f"{where}: TimeSensor does not start from the trigger here (its moment "
                "depends on the run's day); use deferrable=True"
            )
        kwargs.pop("trigger_kwargs", None)  # Airflow's unused argument
        super().__init__(**kwargs)
        self.target_time = target_time
        self.end_from_trigger = bool(end_from_trigger)

    def target_datetime(self, context: Context) -> datetime:
        """The moment to wait for, in UTC."""
        zone = _zone_of(self)
        run = context.get("dag_run")
        day_of = (
            as_moment(getattr(run, "run_after", None) or context.get("run_after"))
            or as_moment(context.get("logical_date"))
            or self._utcnow()
        )
        day = day_of.astimezone(zone).date()
        own_zone = self.target_time.tzinfo or zone
        moment = datetime.combine(day, self.target_time.replace(tzinfo=None), tzinfo=own_zone)
        return moment.astimezone(UTC)

    def poke(self, context: Context) -> bool:
        return self._utcnow() >= self.target_datetime(context)

    def deferral_trigger(self, context: Context) -> BaseTrigger | None:
        return DateTimeTrigger(
            self.target_datetime(context), end_from_trigger=self.end_from_trigger
        )

    def execute_complete(self, context: Context, event: Any = None) -> None:
        return None


class TimeSensorAsync(TimeSensor):
    """Airflow's deprecated alias: ``TimeSensor(deferrable=True)``."""

    def __init__(self, **kwargs: Any) -> None:
        location = caller_location()
        warn_once(
            "operator",
            "TimeSensorAsync",
            "%s: TimeSensorAsync is deprecated (as in Airflow); use TimeSensor(deferrable=True)",
            location,
            location=location,
        )
        kwargs["deferrable"] = True
        super().__init__(**kwargs)


# --- DayOfWeekSensor --------------------------------------------------------------------------


class WeekDay(enum.IntEnum):
    """The days of the week, ISO numbered (Monday is 1), as Airflow's ``WeekDay``."""

    MONDAY = 1
    TUESDAY = 2
    WEDNESDAY = 3
    THURSDAY = 4
    FRIDAY = 5
    SATURDAY = 6
    SUNDAY = 7

    @classmethod
    def get_weekday_number(cls, week_day_str: str) -> int:
        """The ISO number of a day name (any case): ``"monday"`` -> 1."""
        try:
            return cls[week_day_str.upper()].value
        except KeyError:
            names = ", ".join(day.name.title() for day in cls)
            raise ValueError(f"{week_day_str!r} is not a day of the week ({names})") from None

    @classmethod
    def convert(cls, day: str | WeekDay) -> int:
        """The ISO number of a day given by name or as a ``WeekDay``."""
        if isinstance(day, WeekDay):
            return day.value
        if isinstance(day, str):
            return cls.get_weekday_number(day)
        raise TypeError(f"a day of the week is a str or a WeekDay, got {day!r}")

    @classmethod
    def validate_week_day(cls, week_day: str | WeekDay | Iterable[str | WeekDay]) -> set[int]:
        """The ISO numbers of ``week_day``: one day or an iterable of them."""
        if isinstance(week_day, str | WeekDay):
            return {cls.convert(week_day)}
        if isinstance(week_day, Iterable) and not isinstance(week_day, Mapping):
            days = {cls.convert(day) for day in week_day}
            if days:
                return days
        raise TypeError(
            f"week_day must be a day name, a WeekDay or a set of them, got {week_day!r}"
        )


class DayOfWeekSensor(BaseSensorOperator):
    """Waits until it is one of ``week_day`` (a name, a ``WeekDay``, or a set of them).

    The day is today's in UTC, or with ``use_task_logical_date=True`` the run's logical date
    (in UTC, as Airflow: useful for backfills); a run without a logical date uses its
    ``run_after``.
    """

    def __init__(
        self,
        *,
        week_day: str | WeekDay | Iterable[str | WeekDay],
        use_task_logical_date: bool = False,
        **kwargs: Any,
    ) -> None:
        where = f"{caller_location()}: sensor {kwargs.get('task_id')!r}"
        try:
            days = WeekDay.validate_week_day(week_day)
        except (TypeError, ValueError) as exc:
            raise DagDefinitionError(f"{where}: {exc}") from exc
        super().__init__(**kwargs)
        self.week_day = week_day
        self.use_task_logical_date = bool(use_task_logical_date)
        self._week_day_num = frozenset(days)

    def poke(self, context: Context) -> bool:
        moment = self._utcnow()
        if self.use_task_logical_date:
            run = context.get("dag_run")
            moment = (
                as_moment(context.get("logical_date"))
                or as_moment(getattr(run, "run_after", None))
                or moment
            )
        today = moment.astimezone(UTC).isoweekday()
        return today in self._week_day_num
