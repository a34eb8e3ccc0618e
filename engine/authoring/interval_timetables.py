"""The timetables whose runs cover a data interval (Airflow 2's meaning of a cron string):
``CronDataIntervalTimetable`` and ``DeltaDataIntervalTimetable``. A run's logical date is
the start of its interval, and it runs after the interval ends.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from engine.authoring.cron import (
    DeltaTicks,
    Ticks,
    align_up,
    as_utc,
    check_delta,
    describe_cron,
    describe_delta,
    timezone_name,
    timezone_of,
)
from engine.authoring.locations import caller_location
from engine.authoring.timetables import (
    DagRunInfo,
    DataInterval,
    TimeRestriction,
    Timetable,
    cron_ticks,
)

if TYPE_CHECKING:
    from datetime import datetime, timedelta, tzinfo


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
        self._cron = cron_ticks(cron, self.zone, where=where)
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
