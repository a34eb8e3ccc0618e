"""Sensors: tasks that wait for a condition, by poking in the worker or by deferring.

A sensor built with ``deferrable=True`` hands its wait to a trigger and frees its worker
slot; with ``deferrable=False`` it calls ``poke`` every ``poke_interval`` seconds until it
returns True or ``timeout`` seconds have passed (``SensorTimeout``). ``deferrable=None``
(the default) follows ``[operators] default_deferrable`` (see ``resolve_deferrable``).

Airflow's sensor arguments: ``soft_fail=True`` ends a sensor that timed out (poking or
deferred) as skipped instead of failed; ``silent_fail=True`` logs an error raised by
``poke`` and pokes again. ``mode="reschedule"`` is accepted with one warning: the sensor
pokes in its worker slot (``deferrable=True`` frees the slot); ``exponential_backoff`` and
``max_wait`` are ignored with one warning.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.context import (
    DagDefinitionError,
    SensorTimeout,
    TaskDeferralTimeout,
    caller_location,
    default_deferrable_from,
    resolve_deferrable,
    run_to_completion,
)
from engine.authoring.dag import BaseOperator, warn_once
from engine.exceptions import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    AirflowTaskTimeout,
)
from triggers.base import StartTriggerArgs, classpath_of
from triggers.file import FileTrigger
from triggers.temporal import DateTimeTrigger, TimeDeltaTrigger

if TYPE_CHECKING:
    from collections.abc import Mapping

    from engine.authoring.context import Context
    from triggers.base import BaseTrigger

logger = logging.getLogger(__name__)

DEFAULT_POKE_INTERVAL_S: Final = 60.0
DEFAULT_SENSOR_TIMEOUT_S: Final = 7 * 24 * 3600.0
EXECUTE_COMPLETE: Final = "execute_complete"
SENSOR_MODES: Final = ("poke", "reschedule")
# What silent_fail never swallows (as in Airflow): the outcomes a task asks for on purpose.
_NEVER_SILENCED: Final = (
    AirflowSensorTimeout,
    AirflowTaskTimeout,
    AirflowSkipException,
    AirflowFailException,
)


def _seconds(where: str, name: str, value: object, *, allow_zero: bool) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DagDefinitionError(f"{where}: {name} must be seconds or a timedelta, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise DagDefinitionError(
            f"{where}: {name} must be {'>= 0' if allow_zero else '> 0'} seconds, got {value}"
        )
    return float(value)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class BaseSensorOperator(BaseOperator):
    """Waits until ``poke(context)`` is True; defers when ``deferral_trigger`` offers one."""

    def __init__(
        self,
        *,
        deferrable: bool | None = None,
        poke_interval: float | timedelta = DEFAULT_POKE_INTERVAL_S,
        timeout: float | timedelta = DEFAULT_SENSOR_TIMEOUT_S,
        mode: str = "poke",
        soft_fail: bool = False,
        silent_fail: bool = False,
        exponential_backoff: bool = False,
        max_wait: float | timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        where = f"{caller_location()}: sensor {self.task_id!r}"
        if deferrable is not None and not isinstance(deferrable, bool):
            raise DagDefinitionError(f"{where}: deferrable must be True, False or None")
        self.deferrable = deferrable
        self.poke_interval = _seconds(where, "poke_interval", poke_interval, allow_zero=False)
        self.timeout = _seconds(where, "timeout", timeout, allow_zero=True)
        if mode not in SENSOR_MODES:
            raise DagDefinitionError(f"{where}: mode must be one of {SENSOR_MODES}, got {mode!r}")
        self.mode = mode
        self.soft_fail = bool(soft_fail)
        self.silent_fail = bool(silent_fail)
        self._warn_ignored(
            where,
            {
                "mode": mode == "reschedule",
                "exponential_backoff": bool(exponential_backoff),
                "max_wait": max_wait is not None,
            },
        )

    def _warn_ignored(self, where: str, is_set: Mapping[str, bool]) -> None:
        hints = {
            "mode": "mode='reschedule' pokes in the worker slot like 'poke'; deferrable=True "
            "frees the slot",
            "exponential_backoff": "exponential_backoff is ignored: pokes stay poke_interval apart",
            "max_wait": "max_wait is ignored: pokes stay poke_interval apart",
        }
        for name, hint in hints.items():
            if is_set[name]:
                warn_once("operator", name, "%s: %s", where, hint, location=where)

    def poke(self, context: Context) -> bool:
        """True once the condition holds."""
        raise NotImplementedError(f"{type(self).__name__} must implement poke(context)")

    def deferral_trigger(self, context: Context) -> BaseTrigger | None:
        """The trigger to defer to in deferrable mode; None: this sensor only pokes."""
        return None

    def execute(self, context: Context) -> Any:
        try:
            return self._wait(context)
        except SensorTimeout as exc:
            self._skip_if_soft(exc)
            raise

    def resume_execution(
        self, next_method: str, next_kwargs: Mapping[str, Any] | None, context: Context
    ) -> Any:
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except TaskDeferralTimeout as exc:
            self._skip_if_soft(exc)
            raise

    def _skip_if_soft(self, exc: BaseException) -> None:
        if self.soft_fail:
            raise AirflowSkipException(f"sensor {self.task_id!r} timed out (soft_fail): {exc}")

    def _wait(self, context: Context) -> Any:
        if resolve_deferrable(self, default_deferrable_from(context)):
            trigger = run_to_completion(
                self.deferral_trigger(context), what=f"sensor {self.task_id!r}: deferral_trigger()"
            )
            if trigger is not None:
                self.defer(
                    trigger=trigger,
                    method_name=EXECUTE_COMPLETE,
                    timeout=timedelta(seconds=self.timeout),
                )
        self.poke_until_done(context)
        return None

    def execute_complete(self, context: Context, event: Any = None) -> Any:
        """Where a deferred sensor resumes: the trigger fired, so the wait is over."""
        return None

    def poke_until_done(self, context: Context) -> None:
        """Poke every ``poke_interval`` seconds; ``SensorTimeout`` after ``timeout``."""
        started = self._monotonic()
        what = f"sensor {self.task_id!r}: poke()"
        while not self._poke_once(context, what):
            elapsed = self._monotonic() - started
            if elapsed >= self.timeout:
                raise SensorTimeout(
                    f"sensor {self.task_id!r} did not succeed within {self.timeout:g} s "
                    f"(poked every {self.poke_interval:g} s)"
                )
            self._sleep(min(self.poke_interval, self.timeout - elapsed))

    def _poke_once(self, context: Context, what: str) -> bool:
        try:
            return bool(run_to_completion(self.poke(context), what=what))
        except _NEVER_SILENCED:
            raise
        except Exception:
            if not self.silent_fail:
                raise
            logger.exception(
                "%s failed; silent_fail is set, so the sensor pokes again",
                what,
                extra={"action": "poke_failed", "task_id": self.task_id},
            )
            return False

    def _monotonic(self) -> float:
        return time.monotonic()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class TimeDeltaSensor(BaseSensorOperator):
    """Waits ``delta`` from the moment the sensor first runs.

    Deferrable: a ``TimeDeltaTrigger``; with ``end_from_trigger=True`` the task ends on the
    triggerer without coming back to a worker.
    """

    def __init__(self, *, delta: timedelta, end_from_trigger: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(delta, timedelta):
            raise DagDefinitionError(
                f"{caller_location()}: TimeDeltaSensor delta must be a timedelta, got {delta!r}"
            )
        self.delta = delta
        self.end_from_trigger = bool(end_from_trigger)
        self._target: datetime | None = None

    def poke(self, context: Context) -> bool:
        now = self._utcnow()
        if self._target is None:
            self._target = now + self.delta
        return now >= self._target

    def deferral_trigger(self, context: Context) -> BaseTrigger | None:
        return TimeDeltaTrigger(self.delta, end_from_trigger=self.end_from_trigger)

    def _utcnow(self) -> datetime:
        return _utcnow()


class DateTimeSensor(BaseSensorOperator):
    """Waits until ``target_time`` (timezone-aware) has passed.

    ``start_from_trigger=True`` sends the task straight to the triggerer (no worker at all
    with ``end_from_trigger=True``).
    """

    def __init__(
        self,
        *,
        target_time: datetime,
        end_from_trigger: bool = False,
        start_from_trigger: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(target_time, datetime) or target_time.utcoffset() is None:
            raise DagDefinitionError(
                f"{caller_location()}: DateTimeSensor target_time must be a timezone-aware "
                f"datetime, got {target_time!r}; e.g. datetime(..., tzinfo=timezone.utc)"
            )
        self.target_time = target_time.astimezone(UTC)
        self.end_from_trigger = bool(end_from_trigger)
        if start_from_trigger:
            self.start_from_trigger = True
            self.start_trigger_args = StartTriggerArgs(
                trigger_cls=classpath_of(DateTimeTrigger),
                trigger_kwargs={
                    "moment": self.target_time,
                    "end_from_trigger": self.end_from_trigger,
                },
                next_method=EXECUTE_COMPLETE,
                timeout=timedelta(seconds=self.timeout),
            )

    def poke(self, context: Context) -> bool:
        return self._utcnow() >= self.target_time

    def deferral_trigger(self, context: Context) -> BaseTrigger | None:
        return DateTimeTrigger(self.target_time, end_from_trigger=self.end_from_trigger)

    def _utcnow(self) -> datetime:
        return _utcnow()


class FileSensor(BaseSensorOperator):
    """Waits until ``filepath`` (a path or a glob) matches a regular file.

    Deferrable: a ``FileTrigger`` polling every ``poke_interval`` seconds on the triggerer.
    """

    def __init__(self, *, filepath: str, recursive: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(filepath, str | os.PathLike) or not os.fspath(filepath):
            raise DagDefinitionError(
                f"{caller_location()}: FileSensor filepath must be a path, got {filepath!r}"
            )
        self.filepath = os.fspath(filepath)
        self.recursive = bool(recursive)

    def poke(self, context: Context) -> bool:
        matches = glob.glob(self.filepath, recursive=self.recursive)
        return any(os.path.isfile(path) for path in matches)

    def deferral_trigger(self, context: Context) -> BaseTrigger | None:
        return FileTrigger(
            self.filepath, recursive=self.recursive, poke_interval=self.poke_interval
        )
