"""Timetables: when a time-scheduled DAG runs, with Airflow 3's meaning of a run.

This module owns the run records, the timetables, the schedule presets, ``resolve_schedule``
and the stored JSON form. A run has a ``logical_date`` (its identity: one run per DAG and
logical date), a ``data_interval`` (the span of data it covers) and a ``run_after`` (the
earliest moment it may start). The scheduler asks ``next_dagrun_info(...)`` for the next
run; backfill asks ``runs_between(start, end)``. Everything here is pure: no clock is read,
``now`` is a parameter, and every datetime returned is aware UTC.

Time zones, time values and the tick series a timetable walks are ``engine.authoring.cron``'s;
``timezone_of``, ``timezone_name`` and ``to_utc`` are re-exported here.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, ClassVar, Final

from engine.authoring.assets import BaseAsset, as_condition
from engine.authoring.cron import (
    RESOLUTION,
    CronTicks,
    DeltaTicks,
    MergedTicks,
    Ticks,
    align_up,
    as_utc,
    check_cron_expression,
    check_delta,
    check_run_immediately,
    describe_cron,
    describe_delta,
)
from engine.authoring.cron import timezone_name as timezone_name  # public here too
from engine.authoring.cron import timezone_of as timezone_of
from engine.authoring.cron import to_utc as to_utc
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

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


# --- runs ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DataInterval:
    """The span of data a run covers, ``[start, end]`` in UTC."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", as_utc(self.start, "DataInterval.start"))
        object.__setattr__(self, "end", as_utc(self.end, "DataInterval.end"))
        if self.end < self.start:
            raise ValueError(f"DataInterval ends before it starts: {self.start} > {self.end}")


@dataclass(frozen=True, slots=True)
class DagRunInfo:
    """One run a timetable asks for: its identity, its data and when it may start."""

    logical_date: datetime
    data_interval: DataInterval
    run_after: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "logical_date", as_utc(self.logical_date, "logical_date"))
        object.__setattr__(self, "run_after", as_utc(self.run_after, "run_after"))

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
                object.__setattr__(self, name, as_utc(value, f"TimeRestriction.{name}"))

    def bounds(self, start: datetime, end: datetime) -> tuple[datetime, datetime]:
        """``[start, end]`` narrowed to ``[earliest, latest]``."""
        low = start if self.earliest is None else max(start, self.earliest)
        high = end if self.latest is None else min(end, self.latest)
        return low, high


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
        at = as_utc(run_after, "run_after")
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
        at = as_utc(now, "now") if restriction.earliest is None else restriction.earliest
        if restriction.latest is not None and at > restriction.latest:
            return None
        return DagRunInfo.exact(at)

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        """The run at start_date if it is in range; nothing without a start_date."""
        low, high = restriction.bounds(as_utc(start, "start"), as_utc(end, "end"))
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
        at = as_utc(now, "now")
        if restriction.earliest is not None:
            at = max(at, restriction.earliest)
        last = last_automated_data_interval
        if last is not None and at <= last.end:
            at = last.end + RESOLUTION
        if restriction.latest is not None and at > restriction.latest:
            return None
        return DagRunInfo.exact(at)

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        return []


class _TriggerTimetable(Timetable):
    """Runs *at* each tick: logical_date = run_after = tick, data ``[tick - interval, tick]``."""

    interval: timedelta = timedelta(0)
    run_immediately: bool | timedelta = True

    def _ticks(self, anchor: datetime | None) -> Ticks:
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
        now = as_utc(now, "now")
        ticks = self._ticks(restriction.earliest)
        last = last_automated_data_interval
        if restriction.catchup and last is not None:
            tick = ticks.after(last.end)
        elif restriction.catchup and restriction.earliest is not None:
            tick = align_up(ticks, restriction.earliest)
        else:
            tick = self._tick_for_now(ticks, now)
            if last is not None:
                tick = max(tick, ticks.after(last.end))
        if restriction.earliest is not None and tick < restriction.earliest:
            tick = align_up(ticks, restriction.earliest)
        if restriction.latest is not None and tick > restriction.latest:
            return None
        return self._run_at(tick)

    def _tick_for_now(self, ticks: Ticks, now: datetime) -> datetime:
        """Without catchup: the latest past tick if run_immediately allows it, else the next."""
        past = ticks.align_down(now)
        wanted = self.run_immediately
        if past is not None and (
            wanted is True or (isinstance(wanted, timedelta) and now - past <= wanted)
        ):
            return past
        return align_up(ticks, now)

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        at = as_utc(run_after, "run_after")
        return DataInterval(at - self.interval, at)

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        low, high = restriction.bounds(as_utc(start, "start"), as_utc(end, "end"))
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
        self._cron = _cron_ticks(cron, self.zone, where=where)
        self.interval = check_delta(interval, "interval", where=where, positive=False)
        self.run_immediately = check_run_immediately(run_immediately, where=where)
        self.summary = cron
        self.description = f"{describe_cron(self._cron.expression)}, {timezone_name(self.zone)}"

    def _ticks(self, anchor: datetime | None) -> Ticks:
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
        self._merged = MergedTicks(
            tuple(_cron_ticks(cron, self.zone, where=where) for cron in crons)
        )
        self.interval = check_delta(interval, "interval", where=where, positive=False)
        self.run_immediately = check_run_immediately(run_immediately, where=where)
        self.summary = ", ".join(crons)
        described = "; ".join(describe_cron(part.expression) for part in self._merged.parts)
        self.description = f"{described}, {timezone_name(self.zone)}"

    def _ticks(self, anchor: datetime | None) -> Ticks:
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
        self.delta = check_delta(delta, "delta", where=where, positive=True)
        self.interval = check_delta(interval, "interval", where=where, positive=False)
        self.summary = f"every {delta}"
        self.description = f"Every {describe_delta(delta)} from the start date"

    def _ticks(self, anchor: datetime | None) -> Ticks:
        return DeltaTicks(self.delta, anchor)

    def serialize(self) -> dict[str, Any]:
        return {
            "__type": self.json_type,
            "delta": self.delta.total_seconds(),
            "interval": self.interval.total_seconds(),
        }


class _DataIntervalTimetable(Timetable):
    """Runs *for* the interval between two ticks, once it has ended."""

    def _ticks(self, anchor: datetime | None) -> Ticks:
        raise NotImplementedError

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
        now: datetime,
    ) -> DagRunInfo | None:
        now = as_utc(now, "now")
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
            start = align_up(ticks, restriction.earliest)
        if start is None:  # unreachable for cron; a delta grid always has an anchor here
            start = align_up(ticks, now)
        if restriction.latest is not None and start > restriction.latest:
            return None
        return self._run_for(start, ticks.after(start))

    @staticmethod
    def _run_for(start: datetime, end: datetime) -> DagRunInfo:
        return DagRunInfo(logical_date=start, data_interval=DataInterval(start, end), run_after=end)

    def runs_between(
        self, start: datetime, end: datetime, *, restriction: TimeRestriction
    ) -> list[DagRunInfo]:
        low, high = restriction.bounds(as_utc(start, "start"), as_utc(end, "end"))
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
        self._cron = _cron_ticks(cron, self.zone, where=where)
        self.summary = cron
        self.description = f"{describe_cron(self._cron.expression)}, {timezone_name(self.zone)}"

    def _ticks(self, anchor: datetime | None) -> Ticks:
        return self._cron

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        """The last complete interval before ``run_after``."""
        at = as_utc(run_after, "run_after")
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
        self.delta = check_delta(delta, "delta", where=caller_location(), positive=True)
        self.summary = f"every {delta}"
        self.description = f"Intervals of {describe_delta(delta)} from the start date"

    def _ticks(self, anchor: datetime | None) -> Ticks:
        return DeltaTicks(self.delta, anchor)

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        at = as_utc(run_after, "run_after")
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
    return check_cron_expression(CRON_PRESETS.get(text, text), where=where)


def _cron_ticks(text: str, zone: tzinfo, *, where: str) -> CronTicks:
    """The ticks of a cron string or preset on the wall clock of ``zone``."""
    return CronTicks.of(_check_cron(text, where=where), zone)


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
        check_delta(schedule, "a timedelta schedule", where=where, positive=True)
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
