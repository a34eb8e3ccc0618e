"""The cron and delta timetables a DAG runs on without a data interval (Airflow 3's default
for cron strings): ``CronTriggerTimetable``, ``MultipleCronTriggerTimetable``,
``DeltaTriggerTimetable``. A run's logical date is its tick (its data interval is empty, or
``interval`` long before it); ``run_immediately`` decides the first run of a DAG with
``catchup=False``.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, tzinfo
from typing import Any

from engine.authoring.cron import (
    DeltaTicks,
    MergedTicks,
    Ticks,
    align_up,
    as_utc,
    check_delta,
    check_run_immediately,
    describe_cron,
    describe_delta,
    timezone_name,
    timezone_of,
)
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.timetables import (
    DagRunInfo,
    DataInterval,
    TimeRestriction,
    Timetable,
    cron_ticks,
)


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
        self._cron = cron_ticks(cron, self.zone, where=where)
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
            tuple(cron_ticks(cron, self.zone, where=where) for cron in crons)
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
