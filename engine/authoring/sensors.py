"""The time and file sensors: ``TimeDeltaSensor``, ``DateTimeSensor``, ``FileSensor``.

Each pokes (``mode="poke"`` / ``"reschedule"``) or, deferrable, hands its wait to a trigger
(``triggers.temporal``, ``triggers.file``); ``BaseSensorOperator`` (``engine.authoring.
sensor_base``) holds what every sensor shares. The other standard sensors are in
``engine.authoring.standard_sensors`` and ``engine.authoring.external_task``.
"""

from __future__ import annotations

import glob
import os
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.sensor_base import (
    DEFAULT_POKE_INTERVAL_S,
    DEFAULT_SENSOR_TIMEOUT_S,
    EXECUTE_COMPLETE,
    BaseSensorOperator,
    PokeReturnValue,
)
from triggers.base import StartTriggerArgs, classpath_of
from triggers.file import FileTrigger
from triggers.temporal import DateTimeTrigger, TimeDeltaTrigger

if TYPE_CHECKING:
    from engine.authoring.context import Context
    from triggers.base import BaseTrigger

__all__ = (
    "DEFAULT_POKE_INTERVAL_S",
    "DEFAULT_SENSOR_TIMEOUT_S",
    "EXECUTE_COMPLETE",
    "BaseSensorOperator",
    "DateTimeSensor",
    "FileSensor",
    "PokeReturnValue",
    "TimeDeltaSensor",
)


class TimeDeltaSensor(BaseSensorOperator):
    """Waits ``delta`` from the sensor's first poke (also across reschedules).

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

    def poke(self, context: Context) -> bool:
        now = self._utcnow()
        started = self.first_poke_at or now  # kept across reschedules
        return now >= started + self.delta

    def deferral_trigger(self, context: Context) -> BaseTrigger | None:
        return TimeDeltaTrigger(self.delta, end_from_trigger=self.end_from_trigger)


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
