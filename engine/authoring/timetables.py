"""Timetables: when a time-scheduled DAG runs, with Airflow 3's meaning of a run.

A run has a ``logical_date`` (its identity: one run per DAG and logical date), a
``data_interval`` (the span of data it covers) and a ``run_after`` (the earliest moment
it may start). The scheduler asks ``next_dagrun_info(last_automated_data_interval=...,
restriction=..., now=...)`` for the next run; backfill asks ``runs_between(start, end)``.
Everything here is pure: no clock is read, ``now`` is a parameter, and every datetime
returned is aware UTC.

Theory of operation (cron and DST). Cron ticks are computed by croniter on *naive local
wall-clock* datetimes and then placed on the time line with zoneinfo:

- a wall time that does not exist (spring forward) is read with the offset in force just
  before the gap (zoneinfo's ``fold=0``): 02:30 on 2026-03-08 in America/New_York is
  07:30Z (03:30 EDT);
- a wall time that exists twice (fall back) runs once, at its first occurrence, unless the
  cron's hour field is ``*``: then both occurrences run, so an hourly DAG runs every real
  hour (25 runs on a fall-back day, 23 on a spring-forward day).

Both rules can put a later wall tick at or before an earlier one on the UTC line (02:30
read as EST equals 03:30 EDT), so ``_CronTicks`` merges the instants through a small heap
and emits a tick only once no later wall tick can map before it. That bound uses the
zone's offsets sampled 27 hours around the tick: it assumes a zone changes its offset at
most once in any two-day window, which every tz database zone does. Ticks come out unique
and strictly increasing.
"""

from __future__ import annotations

import heapq
import itertools
import json
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from engine.authoring.assets import BaseAsset, as_condition
from engine.authoring.context import DagDefinitionError, caller_location

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

ONCE: Final = "@once"
CONTINUOUS: Final = "@continuous"
CRON_PRESETS: Final[Mapping[str, str]] = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_TICK: Final = timedelta(microseconds=1)  # the resolution of datetime: "just after"
_OFFSET_WINDOW: Final = timedelta(hours=27)
_CRON_ERRORS: Final = (ValueError, TypeError, KeyError, IndexError, OverflowError)
_OFFSET_TEXT: Final = re.compile(r"([+-])(\d{2}):(\d{2})(?::(\d{2}))?")
_WEEKDAYS: Final = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_MONTHS: Final = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


# --- runs ------------------------------------------------------------------------------


def _as_utc(value: datetime, name: str) -> datetime:
    """``value`` as a plain aware UTC ``datetime`` (ValueError if naive)."""
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime, got {value!r}")
    utc = value.astimezone(UTC)
    return datetime(  # a plain datetime, also for pendulum's DateTime
        utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond, UTC
    )


@dataclass(frozen=True, slots=True)
class DataInterval:
    """The span of data a run covers, ``[start, end]`` in UTC."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", _as_utc(self.start, "DataInterval.start"))
        object.__setattr__(self, "end", _as_utc(self.end, "DataInterval.end"))
        if self.end < self.start:
            raise ValueError(f"DataInterval ends before it starts: {self.start} > {self.end}")


@dataclass(frozen=True, slots=True)
class DagRunInfo:
    """One run a timetable asks for: its identity, its data and when it may start."""

    logical_date: datetime
    data_interval: DataInterval
    run_after: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "logical_date", _as_utc(self.logical_date, "logical_date"))
        object.__setattr__(self, "run_after", _as_utc(self.run_after, "run_after"))

    @classmethod
    def exact(cls, at: datetime) -> DagRunInfo:
        """A run at ``at`` with a zero-length data interval."""
        return cls(logical_date=at, data_interval=DataInterval(at, at), run_after=at)


@dataclass(frozen=True, slots=True)
class TimeRestriction:
    """What bounds a DAG's runs: ``start_date`` (earliest), ``end_date`` (latest), catchup."""

    earliest: datetime | None
    latest: datetime | None
    catchup: bool

    def __post_init__(self) -> None:
        for name in ("earliest", "latest"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _as_utc(value, f"TimeRestriction.{name}"))

    def bounds(self, start: datetime, end: datetime) -> tuple[datetime, datetime]:
        """``[start, end]`` narrowed to ``[earliest, latest]``."""
        low = start if self.earliest is None else max(start, self.earliest)
        high = end if self.latest is None else min(end, self.latest)
        return low, high


# --- time zones and dates ----------------------------------------------------------------


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
        return _as_utc(aware, name)
    if isinstance(value, date):
        return _as_utc(datetime.combine(value, time(), tzinfo=timezone), name)
    raise DagDefinitionError(
        f"{where}: {name} must be a datetime, got {type(value).__name__} {value!r}; use "
        "datetime(2026, 1, 1, tzinfo=...) or pendulum.datetime(2026, 1, 1, tz=...)"
    )


# --- tick sources --------------------------------------------------------------------------


class _Ticks(Protocol):
    """A strictly increasing series of instants (aware UTC)."""

    def after(self, moment: datetime) -> datetime: ...  # first tick > moment
    def align_down(self, moment: datetime) -> datetime | None: ...  # last tick <= moment
    def before(self, tick: datetime) -> datetime | None: ...  # last tick < tick
    def iter_from(self, moment: datetime) -> Iterator[datetime]: ...  # ticks >= moment


def _align_up(ticks: _Ticks, moment: datetime) -> datetime:
    """The first tick at or after ``moment``."""
    return ticks.after(moment - _TICK)


def _check_cron(text: object, *, where: str) -> str:
    """The 5-field expression of a cron string or preset; DagDefinitionError if invalid."""
    if not isinstance(text, str):
        raise DagDefinitionError(f"{where}: a cron expression must be a str, got {text!r}")
    if text in (ONCE, CONTINUOUS):
        raise DagDefinitionError(
            f"{where}: {text!r} is not a cron expression; pass schedule={text!r} to the DAG"
        )
    if text.startswith("@") and text not in CRON_PRESETS:
        known = ", ".join([*CRON_PRESETS, ONCE, CONTINUOUS])
        raise DagDefinitionError(f"{where}: unknown schedule preset {text!r}; known: {known}")
    expression = CRON_PRESETS.get(text, text)
    if len(expression.split()) != 5:
        raise DagDefinitionError(
            f"{where}: cron expression {text!r} must have 5 fields (minute hour day-of-month "
            "month day-of-week), e.g. '30 2 * * *'"
        )
    try:
        croniter(expression, datetime(2000, 1, 1)).get_next(datetime)
    except _CRON_ERRORS as exc:
        raise DagDefinitionError(
            f"{where}: cron expression {text!r} is not valid or never matches a date ({exc})"
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
class _CronTicks:
    """The ticks of one cron expression on the wall clock of ``zone`` (see module doc)."""

    expression: str
    zone: tzinfo
    every_hour: bool

    @classmethod
    def parse(cls, text: str, zone: tzinfo, *, where: str) -> _CronTicks:
        expression = _check_cron(text, where=where)
        hours: list[object] = croniter(expression).expanded[1]
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
        walls = croniter(self.expression, (moment + low).replace(tzinfo=None))
        pending: list[datetime] = []
        last = moment
        while True:
            wall: datetime = walls.get_next(datetime)
            for instant in self.instants(wall):
                if instant > last:
                    heapq.heappush(pending, instant)
            as_utc = wall.replace(tzinfo=UTC)
            _, high = _offset_range(self.zone, as_utc)
            safe = as_utc - high  # every later wall tick lands after this
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
        walls = croniter(self.expression, start)
        best: datetime | None = None
        while True:
            wall: datetime = walls.get_prev(datetime)
            as_utc = wall.replace(tzinfo=UTC)
            low, _ = _offset_range(self.zone, as_utc)
            if best is not None and as_utc - low <= best:
                return best  # every earlier wall tick lands at or before best
            for instant in self.instants(wall):
                if instant <= moment and (best is None or instant > best):
                    best = instant

    def before(self, tick: datetime) -> datetime | None:
        return self.align_down(tick - _TICK)

    def iter_from(self, moment: datetime) -> Iterator[datetime]:
        return self.iter_after(moment - _TICK)


@dataclass(frozen=True, slots=True)
class _MergedTicks:
    """The union of several tick series (MultipleCronTriggerTimetable)."""

    parts: tuple[_CronTicks, ...]

    def after(self, moment: datetime) -> datetime:
        return min(part.after(moment) for part in self.parts)

    def align_down(self, moment: datetime) -> datetime | None:
        found = [tick for part in self.parts if (tick := part.align_down(moment)) is not None]
        return max(found, default=None)

    def before(self, tick: datetime) -> datetime | None:
        return self.align_down(tick - _TICK)

    def iter_from(self, moment: datetime) -> Iterator[datetime]:
        merged = heapq.merge(*(part.iter_from(moment) for part in self.parts))
        return (tick for tick, _ in itertools.groupby(merged))


@dataclass(frozen=True, slots=True)
class _DeltaTicks:
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
        first = moment if self.anchor is None else _align_up(self, moment)
        return (first + k * self.delta for k in itertools.count())


# --- timetables --------------------------------------------------------------------------


class Timetable:
    """When a DAG runs. Subclasses say what a run means in their docstring."""

    json_type: ClassVar[str] = ""
    summary: str
    description: str
    periodic: bool = True
    active_runs_limit: int | None = None

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
        now: datetime,
    ) -> DagRunInfo | None:
        """The next scheduled run after the last one (None: no more runs)."""
        raise NotImplementedError

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        """The data interval of a run started by hand at ``run_after``."""
        at = _as_utc(run_after, "run_after")
        return DataInterval(at, at)

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        """Backfill: every run whose logical_date is in ``[start, end]`` (both inclusive),
        whatever ``catchup`` says, within ``restriction.earliest`` / ``latest``."""
        raise NotImplementedError

    def serialize(self) -> dict[str, Any]:
        """Plain JSON; ``timetable_from_json`` rebuilds an equal timetable."""
        return {"__type": self.json_type}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timetable):
            return NotImplemented
        return type(self) is type(other) and self.serialize() == other.serialize()

    def __hash__(self) -> int:
        return hash(json.dumps(self.serialize(), sort_keys=True))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.summary!r}: {self.description}>"


class OnceTimetable(Timetable):
    """``"@once"``: a single run, at the DAG's start_date, or when first scheduled without one.

    logical_date = run_after = start_date (or ``now``); the data interval is that instant.
    There is no run after it, catchup or not.
    """

    json_type = "once"
    summary = ONCE
    description = "Once, at the start date"
    periodic = False

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
        now: datetime,
    ) -> DagRunInfo | None:
        if last_automated_data_interval is not None:
            return None
        at = _as_utc(now, "now") if restriction.earliest is None else restriction.earliest
        if restriction.latest is not None and at > restriction.latest:
            return None
        return DagRunInfo.exact(at)

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        """The run at start_date if it is in range; nothing without a start_date."""
        low, high = restriction.bounds(_as_utc(start, "start"), _as_utc(end, "end"))
        at = restriction.earliest
        return [DagRunInfo.exact(at)] if at is not None and low <= at <= high else []


class ContinuousTimetable(Timetable):
    """``"@continuous"``: a new run as soon as the previous one ends (one active at a time).

    logical_date = run_after = max(now, start_date), with a zero-length data interval; a
    run is never at or before the previous one. Nothing to backfill: ``runs_between`` is
    empty.
    """

    json_type = "continuous"
    summary = CONTINUOUS
    description = "As soon as the previous run ends"
    periodic = False
    active_runs_limit = 1

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
        now: datetime,
    ) -> DagRunInfo | None:
        at = _as_utc(now, "now")
        if restriction.earliest is not None:
            at = max(at, restriction.earliest)
        last = last_automated_data_interval
        if last is not None and at <= last.end:
            at = last.end + _TICK
        if restriction.latest is not None and at > restriction.latest:
            return None
        return DagRunInfo.exact(at)

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        return []


def _check_delta(value: object, name: str, *, where: str, positive: bool) -> timedelta:
    if not isinstance(value, timedelta):
        raise DagDefinitionError(f"{where}: {name} must be a datetime.timedelta, got {value!r}")
    if value < timedelta(0) or (positive and not value):
        need = "positive" if positive else "zero or positive"
        raise DagDefinitionError(f"{where}: {name} must be {need}, got {value}")
    return value


def _check_run_immediately(value: object, *, where: str) -> bool | timedelta:
    if isinstance(value, bool):
        return value
    if isinstance(value, timedelta):
        return _check_delta(value, "run_immediately", where=where, positive=False)
    raise DagDefinitionError(
        f"{where}: run_immediately must be True, False or a datetime.timedelta, got {value!r}"
    )


class _TriggerTimetable(Timetable):
    """Runs *at* each tick: logical_date = run_after = tick, data ``[tick - interval, tick]``."""

    interval: timedelta = timedelta(0)
    run_immediately: bool | timedelta = True

    def _ticks(self, anchor: datetime | None) -> _Ticks:
        raise NotImplementedError

    def _run_at(self, tick: datetime) -> DagRunInfo:
        interval = DataInterval(tick - self.interval, tick)
        return DagRunInfo(logical_date=tick, data_interval=interval, run_after=tick)

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
        now: datetime,
    ) -> DagRunInfo | None:
        now = _as_utc(now, "now")
        ticks = self._ticks(restriction.earliest)
        last = last_automated_data_interval
        if restriction.catchup and last is not None:
            tick = ticks.after(last.end)
        elif restriction.catchup and restriction.earliest is not None:
            tick = _align_up(ticks, restriction.earliest)
        else:
            tick = self._tick_for_now(ticks, now)
            if last is not None:
                tick = max(tick, ticks.after(last.end))
        if restriction.earliest is not None and tick < restriction.earliest:
            tick = _align_up(ticks, restriction.earliest)
        if restriction.latest is not None and tick > restriction.latest:
            return None
        return self._run_at(tick)

    def _tick_for_now(self, ticks: _Ticks, now: datetime) -> datetime:
        """Without catchup: the latest past tick if run_immediately allows it, else the next."""
        past = ticks.align_down(now)
        wanted = self.run_immediately
        if past is not None and (
            wanted is True or (isinstance(wanted, timedelta) and now - past <= wanted)
        ):
            return past
        return _align_up(ticks, now)

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        at = _as_utc(run_after, "run_after")
        return DataInterval(at - self.interval, at)

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        low, high = restriction.bounds(_as_utc(start, "start"), _as_utc(end, "end"))
        if low > high:
            return []
        ticks = self._ticks(low if restriction.earliest is None else restriction.earliest)
        in_range = itertools.takewhile(lambda tick: tick <= high, ticks.iter_from(low))
        return [self._run_at(tick) for tick in in_range]

    def _interval_json(self) -> dict[str, Any]:
        wanted = self.run_immediately
        immediately = wanted if isinstance(wanted, bool) else wanted.total_seconds()
        return {"interval": self.interval.total_seconds(), "run_immediately": immediately}


class CronTriggerTimetable(_TriggerTimetable):
    """Runs at each tick of a cron expression, in ``timezone`` (Airflow 3's default for cron).

    A run happens *at* the tick: logical_date = run_after = tick, and the data interval is
    ``[tick - interval, tick]`` (zero-length by default). With catchup every tick from
    start_date on runs; without it the latest past tick runs (``run_immediately=True``), or
    only if it is at most that old (a timedelta), or never (False: wait for the next tick).
    """

    json_type = "cron_trigger"

    def __init__(
        self,
        cron: str,
        *,
        timezone: str | tzinfo = "UTC",
        interval: timedelta = timedelta(0),
        run_immediately: bool | timedelta = True,
    ) -> None:
        where = caller_location()
        self.zone = timezone_of(timezone)
        self.expression = cron
        self._cron = _CronTicks.parse(cron, self.zone, where=where)
        self.interval = _check_delta(interval, "interval", where=where, positive=False)
        self.run_immediately = _check_run_immediately(run_immediately, where=where)
        self.summary = cron
        self.description = f"{_describe_cron(self._cron.expression)}, {timezone_name(self.zone)}"

    def _ticks(self, anchor: datetime | None) -> _Ticks:
        return self._cron

    def serialize(self) -> dict[str, Any]:
        timing = {"expression": self.expression, "timezone": timezone_name(self.zone)}
        return {"__type": self.json_type, **timing, **self._interval_json()}


class MultipleCronTriggerTimetable(_TriggerTimetable):
    """Runs at every tick of any of several cron expressions (a tick shared by two runs once).

    Each run is as for ``CronTriggerTimetable``: logical_date = run_after = tick, data
    interval ``[tick - interval, tick]``.
    """

    json_type = "multiple_cron_trigger"

    def __init__(
        self,
        *crons: str,
        timezone: str | tzinfo = "UTC",
        interval: timedelta = timedelta(0),
        run_immediately: bool | timedelta = True,
    ) -> None:
        where = caller_location()
        if not crons:
            raise DagDefinitionError(f"{where}: MultipleCronTriggerTimetable needs a cron")
        self.zone = timezone_of(timezone)
        self.expressions = tuple(crons)
        self._merged = _MergedTicks(
            tuple(_CronTicks.parse(cron, self.zone, where=where) for cron in crons)
        )
        self.interval = _check_delta(interval, "interval", where=where, positive=False)
        self.run_immediately = _check_run_immediately(run_immediately, where=where)
        self.summary = ", ".join(crons)
        described = "; ".join(_describe_cron(part.expression) for part in self._merged.parts)
        self.description = f"{described}, {timezone_name(self.zone)}"

    def _ticks(self, anchor: datetime | None) -> _Ticks:
        return self._merged

    def serialize(self) -> dict[str, Any]:
        timing = {"expressions": list(self.expressions), "timezone": timezone_name(self.zone)}
        return {"__type": self.json_type, **timing, **self._interval_json()}


class DeltaTriggerTimetable(_TriggerTimetable):
    """Runs every ``delta`` from start_date: at start_date + k * delta (what a timedelta
    schedule means in Airflow 3). Without a start_date the ticks align to ``now``.

    logical_date = run_after = tick; data interval ``[tick - interval, tick]``. Catchup and
    the latest past tick follow ``CronTriggerTimetable`` (``run_immediately=True``).
    """

    json_type = "delta_trigger"

    def __init__(self, delta: timedelta, *, interval: timedelta = timedelta(0)) -> None:
        where = caller_location()
        self.delta = _check_delta(delta, "delta", where=where, positive=True)
        self.interval = _check_delta(interval, "interval", where=where, positive=False)
        self.summary = f"every {delta}"
        self.description = f"Every {_describe_delta(delta)} from the start date"

    def _ticks(self, anchor: datetime | None) -> _Ticks:
        return _DeltaTicks(self.delta, anchor)

    def serialize(self) -> dict[str, Any]:
        return {
            "__type": self.json_type,
            "delta": self.delta.total_seconds(),
            "interval": self.interval.total_seconds(),
        }


class _DataIntervalTimetable(Timetable):
    """Runs *for* the interval between two ticks, once it has ended."""

    def _ticks(self, anchor: datetime | None) -> _Ticks:
        raise NotImplementedError

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
        now: datetime,
    ) -> DagRunInfo | None:
        now = _as_utc(now, "now")
        ticks = self._ticks(restriction.earliest)
        last = last_automated_data_interval
        if restriction.catchup and (last is not None or restriction.earliest is not None):
            candidates = [None if last is None else ticks.align_down(last.end)]
        else:
            end = ticks.align_down(now)  # the latest interval that has ended by now
            candidates = [None if end is None else ticks.before(end)]
            if last is not None:
                candidates.append(ticks.align_down(last.end))
        start = max((c for c in candidates if c is not None), default=None)
        if restriction.earliest is not None and (start is None or start < restriction.earliest):
            start = _align_up(ticks, restriction.earliest)
        if start is None:  # unreachable for cron; a delta grid always has an anchor here
            start = _align_up(ticks, now)
        if restriction.latest is not None and start > restriction.latest:
            return None
        return self._run_for(start, ticks.after(start))

    @staticmethod
    def _run_for(start: datetime, end: datetime) -> DagRunInfo:
        return DagRunInfo(logical_date=start, data_interval=DataInterval(start, end), run_after=end)

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        low, high = restriction.bounds(_as_utc(start, "start"), _as_utc(end, "end"))
        if low > high:
            return []
        ticks = self._ticks(low if restriction.earliest is None else restriction.earliest)
        runs: list[DagRunInfo] = []
        for first, second in itertools.pairwise(ticks.iter_from(low)):
            if first > high:
                break
            runs.append(self._run_for(first, second))
        return runs


class CronDataIntervalTimetable(_DataIntervalTimetable):
    """Runs once per interval between two cron ticks, after it ends (Airflow 2's cron).

    logical_date = the interval's start, data interval = ``[tick, next tick]``, run_after =
    the interval's end. With catchup every interval from start_date runs; without it the
    latest interval that has ended runs, unless a later one already did.
    """

    json_type = "cron_data_interval"

    def __init__(self, cron: str, timezone: str | tzinfo = "UTC") -> None:
        where = caller_location()
        self.zone = timezone_of(timezone)
        self.expression = cron
        self._cron = _CronTicks.parse(cron, self.zone, where=where)
        self.summary = cron
        self.description = f"{_describe_cron(self._cron.expression)}, {timezone_name(self.zone)}"

    def _ticks(self, anchor: datetime | None) -> _Ticks:
        return self._cron

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        """The last complete interval before ``run_after``."""
        at = _as_utc(run_after, "run_after")
        end = self._cron.align_down(at) or at
        return DataInterval(self._cron.before(end) or end, end)

    def serialize(self) -> dict[str, Any]:
        zone = timezone_name(self.zone)
        return {"__type": self.json_type, "expression": self.expression, "timezone": zone}


class DeltaDataIntervalTimetable(_DataIntervalTimetable):
    """Runs once per ``delta``-long interval from start_date, after the interval ends.

    logical_date = the interval's start (start_date + k * delta), data interval =
    ``[start, start + delta]``, run_after = its end. Without a start_date the intervals
    align to ``now`` (the latest is ``[now - delta, now]``) or follow the last run.
    """

    json_type = "delta_data_interval"

    def __init__(self, delta: timedelta) -> None:
        self.delta = _check_delta(delta, "delta", where=caller_location(), positive=True)
        self.summary = f"every {delta}"
        self.description = f"Intervals of {_describe_delta(delta)} from the start date"

    def _ticks(self, anchor: datetime | None) -> _Ticks:
        return _DeltaTicks(self.delta, anchor)

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        at = _as_utc(run_after, "run_after")
        return DataInterval(at - self.delta, at)

    def serialize(self) -> dict[str, Any]:
        return {"__type": self.json_type, "delta": self.delta.total_seconds()}


class AssetOrTimeSchedule(Timetable):
    """Runs on its timetable *or* when its asset condition is met, whichever comes first.

    Time runs are those of ``timetable`` (same logical_date, data interval and run_after);
    asset-triggered runs are made by the scheduler from ``asset_condition``.
    """

    json_type = "asset_or_time"

    def __init__(self, *, timetable: Timetable, assets: BaseAsset | list[BaseAsset]) -> None:
        where = caller_location()
        if not isinstance(timetable, Timetable) or isinstance(timetable, AssetOrTimeSchedule):
            raise DagDefinitionError(
                f"{where}: AssetOrTimeSchedule timetable must be a timetable such as "
                f"CronTriggerTimetable(...), got {timetable!r}"
            )
        condition = as_condition(assets, where=where)
        if condition is None:
            raise DagDefinitionError(f"{where}: AssetOrTimeSchedule needs assets, got None")
        self.timetable = timetable
        self.asset_condition: BaseAsset = condition
        self.summary = timetable.summary
        self.description = f"Triggered by assets or {timetable.description}"
        self.periodic = timetable.periodic
        self.active_runs_limit = timetable.active_runs_limit

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
        now: datetime,
    ) -> DagRunInfo | None:
        return self.timetable.next_dagrun_info(
            last_automated_data_interval=last_automated_data_interval,
            restriction=restriction,
            now=now,
        )

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        return self.timetable.infer_manual_data_interval(run_after=run_after)

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        return self.timetable.runs_between(start, end, restriction=restriction)

    def serialize(self) -> dict[str, Any]:
        inner, assets = self.timetable.serialize(), self.asset_condition.to_json()
        return {"__type": self.json_type, "timetable": inner, "assets": assets}


# --- schedules and stored timetables -------------------------------------------------------


def resolve_schedule(
    schedule: object, *, timezone: tzinfo, where: str
) -> tuple[Timetable | None, BaseAsset | None]:
    """A DAG's ``schedule`` as (timetable, asset condition); either or both may be None."""
    if schedule is None:
        return None, None
    if isinstance(schedule, AssetOrTimeSchedule):
        return schedule, schedule.asset_condition
    if isinstance(schedule, Timetable):
        return schedule, None
    if isinstance(schedule, str):
        if schedule == ONCE:
            return OnceTimetable(), None
        if schedule == CONTINUOUS:
            return ContinuousTimetable(), None
        _check_cron(schedule, where=where)  # the error names `where`, not this frame
        return CronTriggerTimetable(schedule, timezone=timezone), None
    if isinstance(schedule, timedelta):
        _check_delta(schedule, "a timedelta schedule", where=where, positive=True)
        return DeltaTriggerTimetable(schedule), None
    if isinstance(schedule, BaseAsset | list | tuple):
        return None, as_condition(schedule, where=where)
    raise DagDefinitionError(
        f"{where}: schedule must be None (manual runs only), a cron expression ('0 3 * * *'), "
        "a preset ('@hourly', '@daily', '@weekly', '@monthly', '@yearly', '@once', "
        "'@continuous'), a datetime.timedelta, a timetable (CronTriggerTimetable(...), "
        "CronDataIntervalTimetable(...), DeltaTriggerTimetable(...), ...), an Asset, a list "
        "of assets, an asset condition (a & b, a | b) or AssetOrTimeSchedule(...); got "
        f"{type(schedule).__name__} {schedule!r}"
    )


def _seconds(data: Mapping[str, Any], key: str) -> timedelta:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number of seconds, got {value!r}")
    return timedelta(seconds=value)


def _run_immediately_from(data: Mapping[str, Any]) -> bool | timedelta:
    value = data.get("run_immediately")
    return value if isinstance(value, bool) else _seconds(data, "run_immediately")


def _text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {value!r}")
    return value


def _from_cron_trigger(data: Mapping[str, Any]) -> Timetable:
    return CronTriggerTimetable(
        _text(data, "expression"),
        timezone=_text(data, "timezone"),
        interval=_seconds(data, "interval"),
        run_immediately=_run_immediately_from(data),
    )


def _from_multiple_cron(data: Mapping[str, Any]) -> Timetable:
    crons = data.get("expressions")
    if not isinstance(crons, list) or not all(isinstance(cron, str) for cron in crons):
        raise ValueError(f"expressions must be a list of strings, got {crons!r}")
    return MultipleCronTriggerTimetable(
        *crons,
        timezone=_text(data, "timezone"),
        interval=_seconds(data, "interval"),
        run_immediately=_run_immediately_from(data),
    )


def _from_asset_or_time(data: Mapping[str, Any]) -> Timetable:
    inner = timetable_from_json(data.get("timetable"))
    return AssetOrTimeSchedule(timetable=inner, assets=BaseAsset.from_json(data.get("assets")))


_READERS: Final[Mapping[str, Callable[[Mapping[str, Any]], Timetable]]] = {
    OnceTimetable.json_type: lambda data: OnceTimetable(),
    ContinuousTimetable.json_type: lambda data: ContinuousTimetable(),
    CronTriggerTimetable.json_type: _from_cron_trigger,
    MultipleCronTriggerTimetable.json_type: _from_multiple_cron,
    CronDataIntervalTimetable.json_type: lambda data: CronDataIntervalTimetable(
        _text(data, "expression"), _text(data, "timezone")
    ),
    DeltaTriggerTimetable.json_type: lambda data: DeltaTriggerTimetable(
        _seconds(data, "delta"), interval=_seconds(data, "interval")
    ),
    DeltaDataIntervalTimetable.json_type: lambda data: DeltaDataIntervalTimetable(
        _seconds(data, "delta")
    ),
    AssetOrTimeSchedule.json_type: _from_asset_or_time,
}


def timetable_from_json(data: object) -> Timetable:
    """Rebuild a timetable stored by ``Timetable.serialize``; ValueError on bad data."""
    if not isinstance(data, dict):
        raise ValueError(f"a stored timetable must be a JSON object, got {data!r}")
    kind = data.get("__type")
    reader = _READERS.get(kind) if isinstance(kind, str) else None
    if reader is None:
        raise ValueError(f"unknown timetable type {data.get('__type')!r}")
    try:
        return reader(data)
    except ValueError as exc:  # DagDefinitionError is one too
        raise ValueError(f"stored timetable {data!r} is invalid: {exc}") from exc


# --- descriptions ----------------------------------------------------------------------------


def _describe_delta(delta: timedelta) -> str:
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


def _describe_cron(expression: str) -> str:
    """A short English sentence for common cron shapes, else ``"Cron <expression>"``."""
    minute, hour, day, month, weekday = expression.split()
    timing = _describe_time(minute, hour)
    days = _describe_days(day, month, weekday)
    if timing is None or days is None:
        return f"Cron {expression}"
    return timing + days
