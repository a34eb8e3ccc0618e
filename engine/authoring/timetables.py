"""Timetables: when a time-scheduled DAG runs, with Airflow 3's meaning of a run.

A run has a ``logical_date`` (its identity: one run per DAG and logical date), a
``data_interval`` (the span of data it covers) and a ``run_after`` (the earliest moment it
may start). The scheduler asks ``next_dagrun_info(...)`` for the next run; backfill asks
``runs_between(start, end)``. Everything here is pure: no clock is read, ``now`` is a
parameter, and every datetime returned is aware UTC.

This module owns the run records, the ``Timetable`` base, the schedule presets and cron
strings (``check_cron``), the simple timetables (``@once``, ``@continuous``) and
``AssetOrTimeSchedule``; the cron and delta timetables are
``engine.authoring.trigger_timetables`` (Airflow's ``CronTriggerTimetable`` ...) and
``engine.authoring.interval_timetables`` (the data-interval ones); a DAG's ``schedule``
argument and the stored JSON form, ``engine.authoring.schedules``. Time zones, time values
and the tick series a timetable walks are ``engine.authoring.cron``'s; ``timezone_of``,
``timezone_name`` and ``to_utc`` are re-exported here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

from engine.authoring.assets import BaseAsset, as_condition
from engine.authoring.cron import (
    RESOLUTION,
    CronTicks,
    as_utc,
    check_cron_expression,
)
from engine.authoring.cron import timezone_name as timezone_name  # public here too
from engine.authoring.cron import timezone_of as timezone_of
from engine.authoring.cron import to_utc as to_utc
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime, tzinfo

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


def check_cron(text: object, *, where: str) -> str:
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


def cron_ticks(text: str, zone: tzinfo, *, where: str) -> CronTicks:
    """The ticks of a cron string or preset on the wall clock of ``zone``."""
    return CronTicks.of(check_cron(text, where=where), zone)


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

    def partition_key_for(self, info: DagRunInfo) -> str | None:
        """The partition key of the time run ``info`` (None: the run has none)."""
        return None

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


class AssetOrTimeSchedule(Timetable):
    """Runs on its timetable *or* when its asset condition is met, whichever comes first.

    Time runs are those of ``timetable`` (same logical_date, data interval and run_after);
    asset-triggered runs are made by the scheduler from ``asset_condition``.
    """

    json_type = "asset_or_time"

    def __init__(self, *, timetable: Timetable, assets: BaseAsset | list[BaseAsset]) -> None:
        where = caller_location()
        # a timetable with its own assets (AssetOrTimeSchedule, PartitionedAssetTimetable)
        if not isinstance(timetable, Timetable) or hasattr(timetable, "asset_condition"):
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

    def partition_key_for(self, info: DagRunInfo) -> str | None:
        return self.timetable.partition_key_for(info)

    def serialize(self) -> dict[str, Any]:
        inner, assets = self.timetable.serialize(), self.asset_condition.to_json()
        return {"__type": self.json_type, "timetable": inner, "assets": assets}
