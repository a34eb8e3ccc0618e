"""Cron and the wall clock: where a schedule ticks on the UTC time line.

This module owns time zones (``timezone_of``, ``timezone_name``), the time values a DAG
author passes (``to_utc`` and ``as_utc`` for datetimes, ``check_delta`` and
``check_run_immediately`` for durations, ``check_cron_expression`` for a 5-field cron),
the tick series a timetable walks (``CronTicks`` on a zone's wall clock, their union
``MergedTicks``, the fixed grid ``DeltaTicks``) and the English sentences describing a
cron expression or a delta. It knows nothing of runs, presets or timetables (the
timetable modules build on it, never the other way). Everything here is pure: no clock is
read, and every datetime returned is aware UTC.

Theory of operation (cron and DST). Cron ticks are computed by croniter on *naive local
wall-clock* datetimes and then placed on the time line with zoneinfo:

- a wall time that does not exist (spring forward) is read with the offset in force just
  before the gap (zoneinfo's ``fold=0``): 02:30 on 2026-03-08 in America/New_York is
  07:30Z (03:30 EDT);
- a wall time that exists twice (fall back) runs once, at its first occurrence, unless the
  cron's hour field is ``*``: then both occurrences run, so an hourly DAG runs every real
  hour (25 runs on a fall-back day, 23 on a spring-forward day).

Both rules can put a later wall tick at or before an earlier one on the UTC line (02:30
read as EST equals 03:30 EDT), so ``CronTicks`` merges the instants through a small heap
and emits a tick only once no later wall tick can map before it. That bound uses the
zone's offsets sampled 27 hours around the tick: it assumes a zone changes its offset at
most once in any two-day window, which every tz database zone does. Ticks come out unique
and strictly increasing.

croniter is imported where a cron expression is first read (``_cron``), not with this
module: every DAG file imports it through ``engine.authoring.dag``, and a DAG without a cron
schedule (asset-triggered, manual, a delta) never needs it, nor does its task process.
"""

from __future__ import annotations

import heapq
import itertools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from typing import TYPE_CHECKING, Final, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location

if TYPE_CHECKING:
    from collections.abc import Iterator

    from croniter import croniter

__all__ = (
    "RESOLUTION",
    "CronTicks",
    "DeltaTicks",
    "MergedTicks",
    "Ticks",
    "align_up",
    "as_utc",
    "check_cron_expression",
    "check_delta",
    "check_run_immediately",
    "describe_cron",
    "describe_delta",
    "timezone_name",
    "timezone_of",
    "to_utc",
)

RESOLUTION: Final = timedelta(microseconds=1)  # the resolution of datetime: "just after"
_OFFSET_WINDOW: Final = timedelta(hours=27)
_CRON_ERRORS: Final = (ValueError, TypeError, KeyError, IndexError, OverflowError)
_OFFSET_TEXT: Final = re.compile(r"([+-])(\d{2}):(\d{2})(?::(\d{2}))?")
_WEEKDAYS: Final = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_MONTHS: Final = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


# --- time zones and time values -----------------------------------------------------------


def as_utc(value: datetime, name: str) -> datetime:
    """``value`` as a plain aware UTC ``datetime`` (ValueError if naive)."""
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime, got {value!r}")
    utc = value.astimezone(UTC)
    return datetime(  # a plain datetime, also for pendulum's DateTime
        utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond, UTC
    )


def timezone_of(value: object | None) -> tzinfo:
    """The zone named or given by ``value``: an IANA name, ``"UTC"``, ``"+02:00"``, a
    ``ZoneInfo`` (pendulum's ``Timezone`` is one), a fixed offset (``datetime.timezone``,
    pendulum's ``FixedTimezone``) or None (UTC). UTC always comes back as ``datetime.UTC``.
    """
    if value is None:
        return UTC
    if isinstance(value, str):
        return _zone_named(value)
    if isinstance(value, ZoneInfo):
        if value.key is None:
            raise DagDefinitionError(
                f"{caller_location()}: a ZoneInfo loaded from a file has no name and cannot be "
                "stored; use ZoneInfo('Area/City')"
            )
        return _zone_named(value.key)
    if isinstance(value, tzinfo):
        name = getattr(value, "zone", None)  # pytz zones
        if isinstance(name, str):
            return _zone_named(name)
        offset = value.utcoffset(None)  # fixed offsets answer without a datetime
        if isinstance(offset, timedelta):
            return _fixed_zone(offset)
    raise DagDefinitionError(
        f"{caller_location()}: timezone must be a zone name such as 'Europe/Berlin', a "
        f"ZoneInfo, a pendulum timezone or a fixed offset, got {value!r}"
    )


def timezone_name(tz: tzinfo) -> str:
    """The stored form of a zone: ``timezone_of(timezone_name(tz)) == timezone_of(tz)``."""
    zone = timezone_of(tz)
    if zone is UTC:
        return "UTC"
    if isinstance(zone, ZoneInfo) and zone.key is not None:
        return zone.key
    offset = zone.utcoffset(None)
    assert offset is not None  # timezone_of returns UTC, a named ZoneInfo or a fixed offset
    sign, rest = ("-", -offset) if offset < timedelta(0) else ("+", offset)
    hours, seconds = divmod(int(rest.total_seconds()), 3600)
    text = f"{sign}{hours:02d}:{seconds // 60:02d}"
    return text + (f":{seconds % 60:02d}" if seconds % 60 else "")


def _zone_named(name: str) -> tzinfo:
    if name == "UTC":
        return UTC
    match = _OFFSET_TEXT.fullmatch(name)
    if match:
        sign, hours, minutes, seconds = match.groups()
        offset = timedelta(hours=int(hours), minutes=int(minutes), seconds=int(seconds or 0))
        return _fixed_zone(-offset if sign == "-" else offset)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise DagDefinitionError(
            f"{caller_location()}: unknown time zone {name!r}; use an IANA name such as "
            "'Europe/Berlin', 'UTC' or a fixed offset such as '+02:00'"
        ) from exc


def _fixed_zone(offset: timedelta) -> tzinfo:
    if offset == timedelta(0):
        return UTC
    try:
        return timezone(offset)
    except ValueError as exc:
        raise DagDefinitionError(f"{caller_location()}: bad UTC offset {offset}: {exc}") from exc


def to_utc(value: object, *, timezone: tzinfo, where: str, name: str) -> datetime:
    """A DAG argument as an aware UTC ``datetime``.

    Naive datetimes are wall-clock times in ``timezone`` (a wall time in a DST gap reads
    with the offset before the gap, an ambiguous one as its first occurrence); aware ones,
    pendulum's included, are converted; a ``date`` means midnight in ``timezone``.
    """
    if isinstance(value, datetime):
        aware = value if value.utcoffset() is not None else value.replace(tzinfo=timezone)
        return as_utc(aware, name)
    if isinstance(value, date):
        return as_utc(datetime.combine(value, time(), tzinfo=timezone), name)
    raise DagDefinitionError(
        f"{where}: {name} must be a datetime, got {type(value).__name__} {value!r}; use "
        "datetime(2026, 1, 1, tzinfo=...) or pendulum.datetime(2026, 1, 1, tz=...)"
    )


def check_delta(value: object, name: str, *, where: str, positive: bool) -> timedelta:
    """``value`` if it is a (positive, or zero or positive) timedelta; else DagDefinitionError."""
    if not isinstance(value, timedelta):
        raise DagDefinitionError(f"{where}: {name} must be a datetime.timedelta, got {value!r}")
    if value < timedelta(0) or (positive and not value):
        need = "positive" if positive else "zero or positive"
        raise DagDefinitionError(f"{where}: {name} must be {need}, got {value}")
    return value


def check_run_immediately(value: object, *, where: str) -> bool | timedelta:
    """``value`` if it is True, False or a timedelta of zero or more; else DagDefinitionError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, timedelta):
        return check_delta(value, "run_immediately", where=where, positive=False)
    raise DagDefinitionError(
        f"{where}: run_immediately must be True, False or a datetime.timedelta, got {value!r}"
    )


# --- tick series -------------------------------------------------------------------------


class Ticks(Protocol):
    """A strictly increasing series of instants (aware UTC)."""

    def after(self, moment: datetime) -> datetime: ...  # first tick > moment
    def align_down(self, moment: datetime) -> datetime | None: ...  # last tick <= moment
    def before(self, tick: datetime) -> datetime | None: ...  # last tick < tick
    def iter_from(self, moment: datetime) -> Iterator[datetime]: ...  # ticks >= moment


def align_up(ticks: Ticks, moment: datetime) -> datetime:
    """The first tick at or after ``moment``."""
    return ticks.after(moment - RESOLUTION)


def _cron(expression: str, start: datetime | None = None) -> croniter:
    """croniter's walk of ``expression`` from ``start`` (see the module's docstring)."""
    from croniter import croniter

    return croniter(expression, start)


def check_cron_expression(expression: str, *, where: str) -> str:
    """``expression`` with single spaces; DagDefinitionError unless it is 5 valid fields.

    Presets (``"@daily"``) are the caller's to expand first (``engine.authoring.timetables``).
    """
    if len(expression.split()) != 5:
        raise DagDefinitionError(
            f"{where}: cron expression {expression!r} must have 5 fields (minute hour "
            "day-of-month month day-of-week), e.g. '30 2 * * *'"
        )
    try:
        _cron(expression, datetime(2000, 1, 1)).get_next(datetime)
    except _CRON_ERRORS as exc:
        raise DagDefinitionError(
            f"{where}: cron expression {expression!r} is not valid or never matches a date ({exc})"
        ) from exc
    return " ".join(expression.split())


def _offset_range(zone: tzinfo, moment: datetime) -> tuple[timedelta, timedelta]:
    """Lowest and highest UTC offset of ``zone`` within 27 hours of ``moment``."""
    if isinstance(zone, timezone):  # UTC too
        offset = zone.utcoffset(None) or timedelta(0)
        return offset, offset
    offsets = [
        (moment + shift).astimezone(zone).utcoffset() or timedelta(0)
        for shift in (-_OFFSET_WINDOW, timedelta(0), _OFFSET_WINDOW)
    ]
    return min(offsets), max(offsets)


@dataclass(frozen=True, slots=True)
class CronTicks:
    """The ticks of one cron expression on the wall clock of ``zone`` (see module doc)."""

    expression: str
    zone: tzinfo
    every_hour: bool

    @classmethod
    def of(cls, expression: str, zone: tzinfo) -> CronTicks:
        """The ticks of ``expression``, as returned by ``check_cron_expression``."""
        hours: list[object] = _cron(expression).expanded[1]
        return cls(expression, zone, hours == ["*"])

    def instants(self, wall: datetime) -> tuple[datetime, ...]:
        """Where the naive wall time ``wall`` lands on the UTC line (one or two instants)."""
        first = wall.replace(tzinfo=self.zone).astimezone(UTC)
        second = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        if first == second or not self.every_hour:
            return (first,)
        if second.astimezone(self.zone).replace(tzinfo=None) != wall:
            return (first,)  # a gap: fold=1 lands before it, on another wall time
        return (first, second)

    def iter_after(self, moment: datetime) -> Iterator[datetime]:
        # A wall tick w lands at w - offset(w) > moment only if w > moment + lowest offset.
        low, _ = _offset_range(self.zone, moment)
        walls = _cron(self.expression, (moment + low).replace(tzinfo=None))
        pending: list[datetime] = []
        last = moment
        while True:
            wall: datetime = walls.get_next(datetime)
            for instant in self.instants(wall):
                if instant > last:
                    heapq.heappush(pending, instant)
            wall_utc = wall.replace(tzinfo=UTC)
            _, high = _offset_range(self.zone, wall_utc)
            safe = wall_utc - high  # every later wall tick lands after this
            while pending and pending[0] <= safe:
                tick = heapq.heappop(pending)
                if tick > last:
                    last = tick
                    yield tick

    def after(self, moment: datetime) -> datetime:
        return next(self.iter_after(moment))

    def align_down(self, moment: datetime) -> datetime | None:
        # A wall tick w lands at or before moment only if w <= moment + highest offset.
        _, high = _offset_range(self.zone, moment)
        start = (moment + high).replace(tzinfo=None, microsecond=0) + timedelta(seconds=1)
        walls = _cron(self.expression, start)
        best: datetime | None = None
        while True:
            wall: datetime = walls.get_prev(datetime)
            wall_utc = wall.replace(tzinfo=UTC)
            low, _ = _offset_range(self.zone, wall_utc)
            if best is not None and wall_utc - low <= best:
                return best  # every earlier wall tick lands at or before best
            for instant in self.instants(wall):
                if instant <= moment and (best is None or instant > best):
                    best = instant

    def before(self, tick: datetime) -> datetime | None:
        return self.align_down(tick - RESOLUTION)

    def iter_from(self, moment: datetime) -> Iterator[datetime]:
        return self.iter_after(moment - RESOLUTION)


@dataclass(frozen=True, slots=True)
class MergedTicks:
    """The union of several tick series (MultipleCronTriggerTimetable)."""

    parts: tuple[CronTicks, ...]

    def after(self, moment: datetime) -> datetime:
        return min(part.after(moment) for part in self.parts)

    def align_down(self, moment: datetime) -> datetime | None:
        found = [tick for part in self.parts if (tick := part.align_down(moment)) is not None]
        return max(found, default=None)

    def before(self, tick: datetime) -> datetime | None:
        return self.align_down(tick - RESOLUTION)

    def iter_from(self, moment: datetime) -> Iterator[datetime]:
        merged = heapq.merge(*(part.iter_from(moment) for part in self.parts))
        return (tick for tick, _ in itertools.groupby(merged))


@dataclass(frozen=True, slots=True)
class DeltaTicks:
    """``anchor + k * delta`` for k >= 0; without an anchor every instant is aligned."""

    delta: timedelta
    anchor: datetime | None

    def after(self, moment: datetime) -> datetime:
        if self.anchor is None:
            return moment + self.delta
        if moment < self.anchor:
            return self.anchor
        return self.anchor + ((moment - self.anchor) // self.delta + 1) * self.delta

    def align_down(self, moment: datetime) -> datetime | None:
        if self.anchor is None:
            return moment
        if moment < self.anchor:
            return None
        return self.anchor + ((moment - self.anchor) // self.delta) * self.delta

    def before(self, tick: datetime) -> datetime | None:
        previous = tick - self.delta
        return None if self.anchor is not None and previous < self.anchor else previous

    def iter_from(self, moment: datetime) -> Iterator[datetime]:
        first = moment if self.anchor is None else align_up(self, moment)
        return (first + k * self.delta for k in itertools.count())


# --- descriptions ----------------------------------------------------------------------------


def describe_delta(delta: timedelta) -> str:
    """``"1 day, 2 hours"``; ``str(delta)`` when it is not a whole number of seconds."""
    seconds = int(delta.total_seconds())
    if delta != timedelta(seconds=seconds):
        return str(delta)
    parts = []
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}{'s' if count > 1 else ''}")
    return ", ".join(parts)


def _every(field: str) -> int | None:
    """N for a ``*/N`` field."""
    match = re.fullmatch(r"\*/(\d+)", field)
    return int(match[1]) if match else None


def _describe_time(minute: str, hour: str) -> str | None:
    if minute.isdigit() and hour.isdigit():
        return f"At {int(hour):02d}:{int(minute):02d}"
    if hour == "*" and minute.isdigit():
        return f"At minute {int(minute)} past every hour"
    if hour == "*" and minute == "*":
        return "Every minute"
    if hour == "*" and (step := _every(minute)) is not None:
        return f"Every {step} minutes"
    if minute.isdigit() and (step := _every(hour)) is not None:
        return f"At minute {int(minute)} past every {step} hours"
    return None


def _describe_days(day: str, month: str, weekday: str) -> str | None:
    parts = []
    if day != "*":
        parts.append(f"on day {int(day)} of the month" if day.isdigit() else None)
    if weekday != "*":
        known = weekday.isdigit() and int(weekday) <= 7
        parts.append(f"on {_WEEKDAYS[int(weekday) % 7]}" if known else None)
    if month != "*":
        step = _every(month)
        if month.isdigit() and 1 <= int(month) <= 12:
            parts.append(f"in {_MONTHS[int(month) - 1]}")
        else:
            parts.append(None if step is None else f"every {step} months")
    if None in parts:
        return None
    return "".join(f" {part}" for part in parts if part)


def describe_cron(expression: str) -> str:
    """A short English sentence for common cron shapes, else ``"Cron <expression>"``."""
    minute, hour, day, month, weekday = expression.split()
    timing = _describe_time(minute, hour)
    days = _describe_days(day, month, weekday)
    if timing is None or days is None:
        return f"Cron {expression}"
    return timing + days
