"""Timetables: DST days, catchup on and off, backfill ranges, JSON, schedules and zones.

Every test passes ``now`` explicitly; nothing reads the clock.
"""

from __future__ import annotations

import itertools
import json
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo

import pendulum
import pytest
from croniter import croniter

from engine.authoring.assets import Asset, AssetAll, AssetAny
from engine.authoring.errors import DagDefinitionError
from engine.authoring.interval_timetables import (
    CronDataIntervalTimetable,
    DeltaDataIntervalTimetable,
)
from engine.authoring.schedules import resolve_schedule, timetable_from_json
from engine.authoring.timetables import (
    AssetOrTimeSchedule,
    ContinuousTimetable,
    DagRunInfo,
    DataInterval,
    OnceTimetable,
    TimeRestriction,
    Timetable,
    timezone_name,
    timezone_of,
    to_utc,
)
from engine.authoring.trigger_timetables import (
    CronTriggerTimetable,
    DeltaTriggerTimetable,
    MultipleCronTriggerTimetable,
)

NY = ZoneInfo("America/New_York")
HOUR = timedelta(hours=1)
CATCHUP = TimeRestriction(earliest=None, latest=None, catchup=True)
NO_CATCHUP = TimeRestriction(earliest=None, latest=None, catchup=False)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def restriction(earliest=None, latest=None, *, catchup: bool) -> TimeRestriction:
    return TimeRestriction(earliest=earliest, latest=latest, catchup=catchup)


def nxt(timetable: Timetable, *, now: datetime, last=None, earliest=None, latest=None, catchup):
    return timetable.next_dagrun_info(
        last_automated_data_interval=last,
        restriction=restriction(earliest, latest, catchup=catchup),
        now=now,
    )


def at(tick: datetime, interval: timedelta = timedelta(0)) -> DagRunInfo:
    """What a trigger timetable's run at ``tick`` looks like."""
    return DagRunInfo(
        logical_date=tick, data_interval=DataInterval(tick - interval, tick), run_after=tick
    )


def over(start: datetime, end: datetime) -> DagRunInfo:
    """What a data-interval timetable's run for ``[start, end]`` looks like."""
    return DagRunInfo(logical_date=start, data_interval=DataInterval(start, end), run_after=end)


def local_day(day: date, zone: ZoneInfo = NY) -> tuple[datetime, datetime]:
    """Midnight to just before the next midnight, on the wall clock of ``zone``."""
    start = datetime.combine(day, datetime.min.time(), tzinfo=zone)
    end = datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=zone)
    return start, end - timedelta(microseconds=1)


def logical_dates(runs: list[DagRunInfo]) -> list[datetime]:
    return [run.logical_date for run in runs]


# --- DST --------------------------------------------------------------------------------------


def test_spring_forward_daily_run_in_the_gap_lands_after_it() -> None:
    daily = CronTriggerTimetable("30 2 * * *", timezone="America/New_York")
    runs = daily.runs_between(utc(2026, 3, 7), utc(2026, 3, 10), restriction=CATCHUP)
    assert logical_dates(runs) == [
        utc(2026, 3, 7, 7, 30),  # 02:30 EST
        utc(2026, 3, 8, 7, 30),  # 02:30 does not exist: 03:30 EDT
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
    ]
    previous = DataInterval(utc(2026, 3, 7, 7, 30), utc(2026, 3, 7, 7, 30))
    info = nxt(daily, now=utc(2026, 4, 1), last=previous, catchup=True)
    assert info == at(utc(2026, 3, 8, 7, 30))
    assert info is not None and info.logical_date.astimezone(NY).strftime("%H:%M %Z") == "03:30 EDT"


def test_spring_forward_hourly_runs_23_times_one_every_real_hour() -> None:
    hourly = CronTriggerTimetable("@hourly", timezone=NY)
    runs = hourly.runs_between(*local_day(date(2026, 3, 8)), restriction=CATCHUP)
    ticks = logical_dates(runs)
    assert len(ticks) == 23
    assert ticks[0] == utc(2026, 3, 8, 5)  # midnight EST
    assert all(b - a == HOUR for a, b in itertools.pairwise(ticks))


def test_fall_back_daily_run_in_the_repeated_hour_runs_once_at_its_first_occurrence() -> None:
    daily = CronTriggerTimetable("30 1 * * *", timezone="America/New_York")
    runs = daily.runs_between(*local_day(date(2026, 11, 1)), restriction=CATCHUP)
    assert logical_dates(runs) == [utc(2026, 11, 1, 5, 30)]  # 01:30 EDT, not 01:30 EST
    after = DataInterval(utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 5, 30))
    info = nxt(daily, now=utc(2026, 12, 1), last=after, catchup=True)
    assert info == at(utc(2026, 11, 2, 6, 30))


def test_fall_back_hourly_runs_25_times_one_every_real_hour() -> None:
    hourly = CronTriggerTimetable("0 * * * *", timezone=NY)
    runs = hourly.runs_between(*local_day(date(2026, 11, 1)), restriction=CATCHUP)
    ticks = logical_dates(runs)
    assert len(ticks) == 25
    assert ticks[0] == utc(2026, 11, 1, 4)  # midnight EDT
    assert all(b - a == HOUR for a, b in itertools.pairwise(ticks))
    # Both 01:00s run, found one after the other by the scheduler too.
    first_one = DataInterval(utc(2026, 11, 1, 5), utc(2026, 11, 1, 5))
    assert nxt(hourly, now=utc(2026, 11, 2), last=first_one, catchup=True) == at(
        utc(2026, 11, 1, 6)
    )


def test_every_15_minutes_runs_every_real_quarter_hour_across_the_gap() -> None:
    quarterly = CronTriggerTimetable("*/15 * * * *", timezone=NY)
    ticks = logical_dates(quarterly.runs_between(*local_day(date(2026, 3, 8)), restriction=CATCHUP))
    assert len(ticks) == 23 * 4
    assert all(b - a == timedelta(minutes=15) for a, b in itertools.pairwise(ticks))


def test_data_intervals_on_dst_days_last_23_and_25_hours() -> None:
    daily = CronDataIntervalTimetable("@daily", "America/New_York")
    spring = daily.runs_between(utc(2026, 3, 8, 5), utc(2026, 3, 8, 5), restriction=CATCHUP).pop()
    fall = daily.runs_between(utc(2026, 11, 1, 4), utc(2026, 11, 1, 4), restriction=CATCHUP).pop()
    assert spring == over(utc(2026, 3, 8, 5), utc(2026, 3, 9, 4))
    assert fall == over(utc(2026, 11, 1, 4), utc(2026, 11, 2, 5))


def _oracle(cron: str, zone, start: datetime, end: datetime) -> list[datetime]:
    """The DST rule by brute force: every wall tick of a wide window, placed, sorted, unique."""
    every_hour = croniter(cron).expanded[1] == ["*"]
    walls = croniter(cron, (start - timedelta(days=3)).replace(tzinfo=None))
    found: set[datetime] = set()
    while (wall := walls.get_next(datetime)) < (end + timedelta(days=3)).replace(tzinfo=None):
        first = wall.replace(tzinfo=zone).astimezone(UTC)
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        found.add(first)
        exists_twice = second.astimezone(zone).replace(tzinfo=None) == wall
        if every_hour and exists_twice:
            found.add(second)
    return sorted(tick for tick in found if start <= tick <= end)


WINDOWS = [  # (zone, a day around a change of offset)
    ("America/New_York", date(2026, 3, 7)),
    ("America/New_York", date(2026, 10, 31)),
    ("Europe/Berlin", date(2026, 3, 28)),
    ("Europe/Berlin", date(2026, 10, 24)),
    ("Australia/Lord_Howe", date(2026, 4, 4)),  # a 30-minute DST
    ("Australia/Lord_Howe", date(2026, 10, 3)),
    ("Pacific/Apia", date(2011, 12, 28)),  # skipped the whole of 2011-12-30
    ("America/Sao_Paulo", date(2018, 11, 3)),  # DST began at midnight
    ("America/Sao_Paulo", date(2019, 2, 15)),  # and ended at midnight
    ("UTC", date(2026, 3, 7)),
    ("+05:30", date(2026, 3, 7)),
]
CRONS = [
    "0 * * * *",
    "30 2 * * *",
    "*/20 * * * *",
    "0 0 * * *",
    "30 1 * * *",
    "45 */2 * * *",
    "15,40 2 * * *",  # Lord Howe: 02:15 is in the 30-minute gap and lands after 02:40
]


@pytest.mark.parametrize(("zone_name", "day"), WINDOWS)
@pytest.mark.parametrize("cron", CRONS)
def test_ticks_match_the_brute_force_rule_and_strictly_increase(zone_name, day, cron) -> None:
    zone = timezone_of(zone_name)
    start = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    end = start + timedelta(days=3)
    wide = _oracle(cron, zone, start - timedelta(days=2), end + timedelta(days=2))
    expected = [tick for tick in wide if start <= tick <= end]
    trigger = CronTriggerTimetable(cron, timezone=zone)
    assert logical_dates(trigger.runs_between(start, end, restriction=CATCHUP)) == expected
    data = CronDataIntervalTimetable(cron, zone)
    for moment in (start + k * timedelta(minutes=173) for k in range(1, 20)):
        point = DataInterval(moment, moment)
        following = nxt(trigger, now=end, last=point, catchup=True)
        assert following is not None
        assert following.logical_date == next(tick for tick in wide if tick > moment)
        latest = data.infer_manual_data_interval(run_after=moment).end
        assert latest == max(tick for tick in wide if tick <= moment)


# --- OnceTimetable and ContinuousTimetable ----------------------------------------------------


@pytest.mark.parametrize("catchup", [True, False])
def test_once_runs_at_start_date_or_now_and_only_once(catchup: bool) -> None:
    once = OnceTimetable()
    now = utc(2026, 5, 1, 12)
    start = utc(2026, 1, 1)
    assert nxt(once, now=now, earliest=start, catchup=catchup) == DagRunInfo.exact(start)
    assert nxt(once, now=now, catchup=catchup) == DagRunInfo.exact(now)
    done = DataInterval(start, start)
    assert nxt(once, now=now, last=done, earliest=start, catchup=catchup) is None
    assert nxt(once, now=now, earliest=start, latest=utc(2025, 1, 1), catchup=catchup) is None
    assert once.periodic is False and once.active_runs_limit is None and once.summary == "@once"


def test_once_backfill_holds_the_start_date_run_only_when_in_range() -> None:
    once = OnceTimetable()
    start = utc(2026, 1, 1)
    bounded = restriction(start, catchup=False)
    assert once.runs_between(utc(2025, 1, 1), utc(2027, 1, 1), restriction=bounded) == [
        DagRunInfo.exact(start)
    ]
    assert once.runs_between(utc(2026, 2, 1), utc(2027, 1, 1), restriction=bounded) == []
    assert once.runs_between(utc(2025, 1, 1), utc(2027, 1, 1), restriction=NO_CATCHUP) == []


@pytest.mark.parametrize("catchup", [True, False])
def test_continuous_runs_now_never_before_start_date_or_the_last_run(catchup: bool) -> None:
    continuous = ContinuousTimetable()
    now = utc(2026, 5, 1, 12)
    assert nxt(continuous, now=now, catchup=catchup) == DagRunInfo.exact(now)
    later = utc(2026, 6, 1)
    assert nxt(continuous, now=now, earliest=later, catchup=catchup) == DagRunInfo.exact(later)
    past = DataInterval(utc(2026, 5, 1, 11), utc(2026, 5, 1, 11))
    assert nxt(continuous, now=now, last=past, catchup=catchup) == DagRunInfo.exact(now)
    same = DataInterval(now, now)  # the clock has not moved since the last run
    info = nxt(continuous, now=now, last=same, catchup=catchup)
    assert info is not None and info.logical_date > now
    assert nxt(continuous, now=now, latest=utc(2026, 5, 1), catchup=catchup) is None


def test_continuous_allows_one_active_run_and_has_nothing_to_backfill() -> None:
    continuous = ContinuousTimetable()
    assert continuous.active_runs_limit == 1 and continuous.periodic is False
    assert continuous.runs_between(utc(2026, 1, 1), utc(2026, 2, 1), restriction=CATCHUP) == []
    manual = continuous.infer_manual_data_interval(run_after=utc(2026, 1, 1))
    assert manual == DataInterval(utc(2026, 1, 1), utc(2026, 1, 1))


# --- CronTriggerTimetable -----------------------------------------------------------------------

NOW = utc(2026, 5, 4, 10, 20)  # a Monday


def test_cron_trigger_catchup_runs_every_tick_from_start_date_whatever_now() -> None:
    hourly = CronTriggerTimetable("0 * * * *")
    start = utc(2026, 5, 1, 5, 10)
    assert nxt(hourly, now=NOW, earliest=start, catchup=True) == at(utc(2026, 5, 1, 6))
    last = DataInterval(utc(2026, 5, 1, 6), utc(2026, 5, 1, 6))
    assert nxt(hourly, now=NOW, last=last, earliest=start, catchup=True) == at(utc(2026, 5, 1, 7))
    on_tick = utc(2026, 5, 1, 6)
    assert nxt(hourly, now=NOW, earliest=on_tick, catchup=True) == at(on_tick)


@pytest.mark.parametrize(
    ("run_immediately", "expected"),
    [
        (True, utc(2026, 5, 4, 10)),  # the latest past tick
        (False, utc(2026, 5, 4, 11)),  # wait for the next one
        (timedelta(minutes=30), utc(2026, 5, 4, 10)),  # 20 minutes old: recent enough
        (timedelta(minutes=10), utc(2026, 5, 4, 11)),  # too old
    ],
)
def test_cron_trigger_without_catchup_follows_run_immediately(run_immediately, expected) -> None:
    hourly = CronTriggerTimetable("0 * * * *", run_immediately=run_immediately)
    assert nxt(hourly, now=NOW, catchup=False) == at(expected)
    long_ago = utc(2026, 1, 1)
    assert nxt(hourly, now=NOW, earliest=long_ago, catchup=False) == at(expected)
    # Without a start date catchup has nothing to catch up from: as without catchup.
    assert nxt(hourly, now=NOW, catchup=True) == at(expected)


@pytest.mark.parametrize("run_immediately", [True, False, timedelta(minutes=5)])
def test_cron_trigger_without_catchup_skips_missed_ticks_but_never_repeats(run_immediately) -> None:
    hourly = CronTriggerTimetable("0 * * * *", run_immediately=run_immediately)
    old = DataInterval(utc(2026, 5, 4, 3), utc(2026, 5, 4, 3))
    info = nxt(hourly, now=NOW, last=old, catchup=False)
    assert info is not None and info.logical_date >= utc(2026, 5, 4, 10)
    current = DataInterval(utc(2026, 5, 4, 10), utc(2026, 5, 4, 10))
    assert nxt(hourly, now=NOW, last=current, catchup=False) == at(utc(2026, 5, 4, 11))


def test_cron_trigger_tick_exactly_at_now_is_due_even_without_run_immediately() -> None:
    hourly = CronTriggerTimetable("0 * * * *", run_immediately=False)
    tick = utc(2026, 5, 4, 10)
    assert nxt(hourly, now=tick, catchup=False) == at(tick)


@pytest.mark.parametrize("catchup", [True, False])
def test_cron_trigger_never_runs_before_start_date_nor_after_end_date(catchup: bool) -> None:
    hourly = CronTriggerTimetable("0 * * * *")
    future = utc(2026, 5, 4, 12, 30)
    assert nxt(hourly, now=NOW, earliest=future, catchup=catchup) == at(utc(2026, 5, 4, 13))
    end = utc(2026, 5, 4, 10, 30)
    current = DataInterval(utc(2026, 5, 4, 10), utc(2026, 5, 4, 10))
    assert nxt(hourly, now=NOW, last=current, latest=end, catchup=catchup) is None
    on_end = utc(2026, 5, 4, 11)  # end_date is inclusive
    assert nxt(hourly, now=NOW, last=current, latest=on_end, catchup=catchup) == at(on_end)


def test_cron_trigger_interval_gives_the_data_interval_before_the_tick() -> None:
    daily = CronTriggerTimetable("@daily", timezone="Europe/Berlin", interval=timedelta(days=1))
    info = nxt(daily, now=NOW, catchup=False)
    assert info == at(utc(2026, 5, 3, 22), timedelta(days=1))  # midnight CEST
    manual = daily.infer_manual_data_interval(run_after=NOW)
    assert manual == DataInterval(NOW - timedelta(days=1), NOW)


def test_cron_trigger_in_a_time_zone() -> None:
    daily = CronTriggerTimetable("0 9 * * *", timezone=pendulum.timezone("Asia/Tokyo"))
    assert nxt(daily, now=NOW, catchup=False) == at(utc(2026, 5, 4, 0))  # 09:00 JST
    assert daily.description == "At 09:00, Asia/Tokyo"
    assert daily.summary == "0 9 * * *"


# --- CronDataIntervalTimetable ------------------------------------------------------------------


def test_cron_data_interval_catchup_continues_from_start_date_and_the_last_run() -> None:
    hourly = CronDataIntervalTimetable("0 * * * *", "UTC")
    start = utc(2026, 5, 1, 5, 10)
    first = utc(2026, 5, 1, 6)
    assert nxt(hourly, now=NOW, earliest=start, catchup=True) == over(first, first + HOUR)
    last = DataInterval(first, first + HOUR)
    second = nxt(hourly, now=NOW, last=last, earliest=start, catchup=True)
    assert second == over(first + HOUR, first + 2 * HOUR)


def test_cron_data_interval_without_catchup_runs_the_latest_complete_interval() -> None:
    hourly = CronDataIntervalTimetable("0 * * * *", "UTC")
    latest = over(utc(2026, 5, 4, 9), utc(2026, 5, 4, 10))
    assert nxt(hourly, now=NOW, catchup=False) == latest
    assert nxt(hourly, now=NOW, earliest=utc(2026, 1, 1), catchup=False) == latest
    assert nxt(hourly, now=NOW, catchup=True) == latest  # no start date: nothing to catch up
    long_ago = DataInterval(utc(2026, 5, 4, 2), utc(2026, 5, 4, 3))
    assert nxt(hourly, now=NOW, last=long_ago, catchup=False) == latest
    done = latest.data_interval  # already ran: the next one, due at 11:00
    assert nxt(hourly, now=NOW, last=done, catchup=False) == over(
        utc(2026, 5, 4, 10), utc(2026, 5, 4, 11)
    )


@pytest.mark.parametrize("catchup", [True, False])
def test_cron_data_interval_respects_start_and_end_date(catchup: bool) -> None:
    hourly = CronDataIntervalTimetable("0 * * * *")
    future = utc(2026, 5, 4, 12, 30)
    expected = over(utc(2026, 5, 4, 13), utc(2026, 5, 4, 14))
    assert nxt(hourly, now=NOW, earliest=future, catchup=catchup) == expected
    done = DataInterval(utc(2026, 5, 4, 9), utc(2026, 5, 4, 10))
    assert nxt(hourly, now=NOW, last=done, latest=utc(2026, 5, 4, 9, 59), catchup=catchup) is None


def test_cron_data_interval_manual_run_covers_the_last_complete_interval() -> None:
    daily = CronDataIntervalTimetable("@daily", timezone="UTC")
    manual = daily.infer_manual_data_interval(run_after=utc(2026, 5, 25, 1))
    assert manual == DataInterval(utc(2026, 5, 24), utc(2026, 5, 25))


# --- DeltaTriggerTimetable and DeltaDataIntervalTimetable -----------------------------------------

HALF_HOUR = timedelta(minutes=30)


def test_delta_trigger_ticks_from_start_date() -> None:
    every = DeltaTriggerTimetable(HALF_HOUR)
    start = utc(2026, 5, 4, 9, 5)
    # catchup: every tick from start_date on
    assert nxt(every, now=NOW, earliest=start, catchup=True) == at(start)
    after_first = DataInterval(start, start)
    assert nxt(every, now=NOW, last=after_first, earliest=start, catchup=True) == at(
        utc(2026, 5, 4, 9, 35)
    )
    # no catchup: the latest tick on the grid, then the one after the last run
    assert nxt(every, now=NOW, earliest=start, catchup=False) == at(utc(2026, 5, 4, 10, 5))
    last = DataInterval(utc(2026, 5, 4, 10, 5), utc(2026, 5, 4, 10, 5))
    assert nxt(every, now=NOW, last=last, earliest=start, catchup=False) == at(
        utc(2026, 5, 4, 10, 35)
    )
    later = utc(2026, 5, 4, 12)
    assert nxt(every, now=NOW, earliest=later, catchup=False) == at(later)


@pytest.mark.parametrize("catchup", [True, False])
def test_delta_trigger_without_start_date_aligns_to_now(catchup: bool) -> None:
    every = DeltaTriggerTimetable(HALF_HOUR, interval=HALF_HOUR)
    assert nxt(every, now=NOW, catchup=catchup) == at(NOW, HALF_HOUR)
    recent = DataInterval(utc(2026, 5, 4, 10) - HALF_HOUR, utc(2026, 5, 4, 10))
    assert nxt(every, now=NOW, last=recent, catchup=catchup) == at(
        utc(2026, 5, 4, 10, 30), HALF_HOUR
    )
    if not catchup:
        old = DataInterval(utc(2026, 5, 4, 1), utc(2026, 5, 4, 1))
        assert nxt(every, now=NOW, last=old, catchup=False) == at(NOW, HALF_HOUR)


def test_delta_data_interval_runs_intervals_from_start_date() -> None:
    hourly = DeltaDataIntervalTimetable(HOUR)
    start = utc(2026, 5, 4, 6, 5)
    first = over(start, start + HOUR)
    assert nxt(hourly, now=NOW, earliest=start, catchup=True) == first
    assert nxt(hourly, now=NOW, last=first.data_interval, earliest=start, catchup=True) == over(
        start + HOUR, start + 2 * HOUR
    )
    latest = over(utc(2026, 5, 4, 9, 5), utc(2026, 5, 4, 10, 5))
    assert nxt(hourly, now=NOW, earliest=start, catchup=False) == latest
    assert nxt(hourly, now=NOW, last=first.data_interval, earliest=start, catchup=False) == latest
    future = utc(2026, 5, 5)
    assert nxt(hourly, now=NOW, earliest=future, catchup=False) == over(future, future + HOUR)
    assert nxt(hourly, now=NOW, earliest=start, latest=start, catchup=True) == first
    assert nxt(hourly, now=NOW, last=first.data_interval, latest=start, catchup=True) is None


@pytest.mark.parametrize("catchup", [True, False])
def test_delta_data_interval_without_start_date(catchup: bool) -> None:
    hourly = DeltaDataIntervalTimetable(HOUR)
    assert nxt(hourly, now=NOW, catchup=catchup) == over(NOW - HOUR, NOW)
    last = DataInterval(NOW - HOUR / 2, NOW + HOUR / 2)
    assert nxt(hourly, now=NOW, last=last, catchup=catchup) == over(
        NOW + HOUR / 2, NOW + 3 * HOUR / 2
    )
    assert hourly.infer_manual_data_interval(run_after=NOW) == DataInterval(NOW - HOUR, NOW)


# --- MultipleCronTriggerTimetable and AssetOrTimeSchedule ----------------------------------------


@pytest.mark.parametrize("catchup", [True, False])
def test_multiple_cron_trigger_runs_on_the_union_of_ticks(catchup: bool) -> None:
    both = MultipleCronTriggerTimetable("0 9 * * *", "30 17 * * 1-5", timezone="Europe/Berlin")
    monday = both.runs_between(utc(2026, 5, 4), utc(2026, 5, 4, 23), restriction=CATCHUP)
    assert logical_dates(monday) == [utc(2026, 5, 4, 7), utc(2026, 5, 4, 15, 30)]
    saturday = both.runs_between(utc(2026, 5, 9), utc(2026, 5, 9, 23), restriction=CATCHUP)
    assert logical_dates(saturday) == [utc(2026, 5, 9, 7)]
    start = utc(2026, 5, 4, 6, 30)
    expected = utc(2026, 5, 4, 7) if catchup else utc(2026, 5, 4, 15, 30)
    now = utc(2026, 5, 4, 16)
    assert nxt(both, now=now, earliest=start, catchup=catchup) == at(expected)
    last = DataInterval(utc(2026, 5, 4, 15, 30), utc(2026, 5, 4, 15, 30))
    assert nxt(both, now=now, last=last, earliest=start, catchup=catchup) == at(utc(2026, 5, 5, 7))


def test_multiple_cron_trigger_runs_a_shared_tick_once() -> None:
    both = MultipleCronTriggerTimetable("0 * * * *", "0 */2 * * *", "*/30 * * * *")
    runs = both.runs_between(utc(2026, 5, 4), utc(2026, 5, 4, 2), restriction=CATCHUP)
    assert logical_dates(runs) == [utc(2026, 5, 4) + k * HALF_HOUR for k in range(5)]


@pytest.mark.parametrize("catchup", [True, False])
def test_asset_or_time_schedule_delegates_time_to_its_timetable(catchup: bool) -> None:
    inner = CronTriggerTimetable("0 * * * *")
    either = AssetOrTimeSchedule(timetable=inner, assets=[Asset("a"), Asset("b")])
    assert either.asset_condition == AssetAll(Asset("a"), Asset("b"))
    start = utc(2026, 5, 4, 6)
    assert nxt(either, now=NOW, earliest=start, catchup=catchup) == nxt(
        inner, now=NOW, earliest=start, catchup=catchup
    )
    assert either.runs_between(start, NOW, restriction=CATCHUP) == inner.runs_between(
        start, NOW, restriction=CATCHUP
    )
    assert either.summary == "0 * * * *" and either.periodic
    assert resolve_schedule(either, timezone=UTC, where="here") == (either, either.asset_condition)


def test_asset_or_time_schedule_rejects_a_missing_timetable_or_assets() -> None:
    with pytest.raises(DagDefinitionError, match="timetable"):
        AssetOrTimeSchedule(timetable="@daily", assets=Asset("a"))  # type: ignore[arg-type]
    with pytest.raises(DagDefinitionError, match="schedule"):
        AssetOrTimeSchedule(timetable=OnceTimetable(), assets=[])


# --- end_date and backfill ------------------------------------------------------------------------

ALL_PERIODIC = [
    CronTriggerTimetable("0 * * * *"),
    CronDataIntervalTimetable("0 * * * *"),
    DeltaTriggerTimetable(HOUR),
    DeltaDataIntervalTimetable(HOUR),
    MultipleCronTriggerTimetable("0 * * * *", "30 * * * *"),
    AssetOrTimeSchedule(timetable=CronTriggerTimetable("0 * * * *"), assets=Asset("a")),
]


@pytest.mark.parametrize("timetable", ALL_PERIODIC, ids=repr)
def test_no_run_after_end_date(timetable: Timetable) -> None:
    start, end = utc(2026, 5, 1), utc(2026, 5, 1, 5)
    assert nxt(timetable, now=NOW, earliest=start, latest=end, catchup=False) is None  # NOW: later
    seen, last = [], None
    while info := nxt(timetable, now=NOW, last=last, earliest=start, latest=end, catchup=True):
        seen.append(info.logical_date)
        last = info.data_interval
    assert seen[0] == start and seen[-1] == end  # end_date is inclusive
    assert len(seen) == (11 if isinstance(timetable, MultipleCronTriggerTimetable) else 6)


def test_backfill_includes_both_ends_and_ignores_catchup() -> None:
    hourly = CronTriggerTimetable("0 * * * *")
    start, end = utc(2026, 5, 4, 10), utc(2026, 5, 4, 12)
    for catchup in (True, False):
        runs = hourly.runs_between(start, end, restriction=restriction(catchup=catchup))
        assert runs == [at(start), at(start + HOUR), at(end)]
    intervals = CronDataIntervalTimetable("0 * * * *").runs_between(
        start, end, restriction=NO_CATCHUP
    )
    assert intervals == [over(start + k * HOUR, start + (k + 1) * HOUR) for k in range(3)]


def test_backfill_respects_start_and_end_date() -> None:
    hourly = CronTriggerTimetable("0 * * * *")
    start, end = utc(2026, 5, 4, 10), utc(2026, 5, 4, 14)
    bounded = restriction(utc(2026, 5, 4, 10, 30), utc(2026, 5, 4, 13), catchup=False)
    assert logical_dates(hourly.runs_between(start, end, restriction=bounded)) == [
        utc(2026, 5, 4, 11),
        utc(2026, 5, 4, 12),
        utc(2026, 5, 4, 13),
    ]
    assert hourly.runs_between(end, start, restriction=CATCHUP) == []
    outside = restriction(utc(2027, 1, 1), catchup=False)
    assert hourly.runs_between(start, end, restriction=outside) == []


def test_backfill_of_delta_timetables_keeps_the_start_date_grid() -> None:
    start = utc(2026, 5, 4, 6, 5)
    grid = restriction(start, catchup=False)
    window = (utc(2026, 5, 4, 8), utc(2026, 5, 4, 10, 5))
    trigger_runs = DeltaTriggerTimetable(HOUR).runs_between(*window, restriction=grid)
    assert logical_dates(trigger_runs) == [utc(2026, 5, 4, 8, 5), utc(2026, 5, 4, 9, 5), window[1]]
    interval_runs = DeltaDataIntervalTimetable(HOUR).runs_between(*window, restriction=grid)
    assert interval_runs[0] == over(utc(2026, 5, 4, 8, 5), utc(2026, 5, 4, 9, 5))
    # without a start date the range's own start anchors the grid
    free = DeltaTriggerTimetable(HOUR).runs_between(*window, restriction=NO_CATCHUP)
    assert logical_dates(free) == [window[0], window[0] + HOUR, window[0] + 2 * HOUR]


# --- JSON ----------------------------------------------------------------------------------------

ROUND_TRIPS = [
    OnceTimetable(),
    ContinuousTimetable(),
    CronTriggerTimetable("@daily", timezone="Europe/Berlin"),
    CronTriggerTimetable("*/5 * * * *", interval=HOUR, run_immediately=False),
    CronTriggerTimetable("0 3 * * 1-5", timezone="+05:30", run_immediately=timedelta(minutes=9)),
    MultipleCronTriggerTimetable("0 9 * * *", "30 17 * * *", timezone=NY, interval=HOUR),
    CronDataIntervalTimetable("0 0 1 * *", "America/New_York"),
    DeltaTriggerTimetable(timedelta(minutes=90), interval=timedelta(seconds=1.5)),
    DeltaDataIntervalTimetable(timedelta(days=1)),
    AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("@hourly", timezone=NY), assets=Asset("a") | Asset("b")
    ),
]


@pytest.mark.parametrize("timetable", ROUND_TRIPS, ids=repr)
def test_serialize_round_trips_through_json(timetable: Timetable) -> None:
    stored = json.loads(json.dumps(timetable.serialize()))
    rebuilt = timetable_from_json(stored)
    assert rebuilt == timetable and type(rebuilt) is type(timetable)
    assert rebuilt.serialize() == stored
    assert (rebuilt.summary, rebuilt.description) == (timetable.summary, timetable.description)
    assert hash(rebuilt) == hash(timetable)
    info = nxt(rebuilt, now=NOW, earliest=utc(2026, 5, 1), catchup=True)
    assert info == nxt(timetable, now=NOW, earliest=utc(2026, 5, 1), catchup=True)


def test_serialize_keeps_the_preset_and_asset_condition() -> None:
    stored = CronTriggerTimetable("@daily").serialize()
    assert stored == {
        "__type": "cron_trigger",
        "expression": "@daily",
        "timezone": "UTC",
        "interval": 0.0,
        "run_immediately": True,
    }
    either = timetable_from_json(ROUND_TRIPS[-1].serialize())
    assert isinstance(either, AssetOrTimeSchedule)
    assert either.asset_condition == AssetAny(Asset("a"), Asset("b"))


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        "cron_trigger",
        {},
        {"__type": "nope"},
        {"__type": "cron_trigger", "expression": "bad", "timezone": "UTC", "interval": 0},
        {"__type": "cron_trigger", "expression": "@daily", "timezone": "Mars/Base", "interval": 0},
        {"__type": "cron_trigger", "expression": "@daily", "timezone": "UTC", "interval": "1h"},
        {"__type": "cron_trigger", "expression": "@daily", "timezone": "UTC", "interval": True},
        {"__type": "cron_trigger", "expression": "@daily", "timezone": "UTC", "interval": -1},
        {"__type": "delta_trigger", "delta": 0, "interval": 0},
        {"__type": "delta_data_interval"},
        {"__type": "multiple_cron_trigger", "expressions": "0 * * * *", "timezone": "UTC"},
        {"__type": "asset_or_time", "timetable": {"__type": "once"}, "assets": None},
        {"__type": "asset_or_time", "timetable": None, "assets": {"__type": "asset"}},
    ],
)
def test_bad_stored_timetables_raise_value_error(data: object) -> None:
    with pytest.raises(ValueError, match=r"timetable|asset"):
        timetable_from_json(data)


# --- resolve_schedule --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "expression"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@quarterly", "0 0 1 */3 *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
    ],
)
def test_cron_presets_become_cron_triggers_keeping_their_name(preset, expression) -> None:
    berlin = ZoneInfo("Europe/Berlin")
    timetable, condition = resolve_schedule(preset, timezone=berlin, where="dags/x.py:3")
    assert condition is None
    assert isinstance(timetable, CronTriggerTimetable)
    assert timetable.summary == preset and timetable.zone is berlin
    plain = CronTriggerTimetable(expression, timezone=berlin)
    year = (utc(2025, 12, 31), utc(2026, 2, 1))  # holds a tick of every preset
    runs = timetable.runs_between(*year, restriction=CATCHUP)
    assert runs == plain.runs_between(*year, restriction=CATCHUP) and runs


def test_resolve_schedule_of_once_continuous_cron_and_timedelta() -> None:
    assert resolve_schedule(None, timezone=UTC, where="w") == (None, None)
    assert resolve_schedule("@once", timezone=UTC, where="w") == (OnceTimetable(), None)
    assert resolve_schedule("@continuous", timezone=UTC, where="w") == (ContinuousTimetable(), None)
    cron, _ = resolve_schedule("15 3 * * 1-5", timezone=NY, where="w")
    assert cron == CronTriggerTimetable("15 3 * * 1-5", timezone="America/New_York")
    delta, _ = resolve_schedule(timedelta(minutes=30), timezone=NY, where="w")
    assert delta == DeltaTriggerTimetable(timedelta(minutes=30))
    assert delta is not None and delta.summary == "every 0:30:00"
    custom = CronDataIntervalTimetable("@daily")
    assert resolve_schedule(custom, timezone=UTC, where="w") == (custom, None)


def test_resolve_schedule_of_assets() -> None:
    a, b = Asset("a"), Asset("b")
    assert resolve_schedule(a, timezone=UTC, where="w") == (None, a)
    assert resolve_schedule([a, b], timezone=UTC, where="w") == (None, AssetAll(a, b))
    assert resolve_schedule(a | b, timezone=UTC, where="w") == (None, AssetAny(a, b))


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("not a cron", r"dags/x\.py:7: cron expression 'not a cron' must have 5 fields"),
        ("61 * * * *", r"dags/x\.py:7: cron expression '61 \* \* \* \*' is not valid"),
        ("0 0 30 2 *", r"dags/x\.py:7: cron expression '0 0 30 2 \*' is not valid or never"),
        ("0 0 * * * 30", r"must have 5 fields"),
        ("@fortnightly", r"dags/x\.py:7: unknown schedule preset '@fortnightly'"),
        (timedelta(0), r"dags/x\.py:7: a timedelta schedule must be positive"),
        (timedelta(minutes=-5), r"must be positive"),
        (3600, r"dags/x\.py:7: schedule must be None .*got int 3600"),
        ({"cron": "@daily"}, r"schedule must be None .*a datetime\.timedelta"),
        (CronTriggerTimetable, r"schedule must be None"),
        ([], r"schedule=\[\] would never run"),
        (["@daily"], r"a schedule list must hold assets"),
    ],
)
def test_resolve_schedule_rejects_bad_input_clearly(schedule: object, message: str) -> None:
    with pytest.raises(DagDefinitionError, match=message):
        resolve_schedule(schedule, timezone=UTC, where="dags/x.py:7")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: CronTriggerTimetable("@once"), r"not a cron expression"),
        (lambda: CronTriggerTimetable("0 * * * *", timezone="Nowhere/City"), r"unknown time zone"),
        (lambda: CronTriggerTimetable("0 * * * *", interval=-HOUR), r"interval must be zero or"),
        (lambda: CronTriggerTimetable("0 * * * *", run_immediately="yes"), r"run_immediately"),
        (lambda: CronTriggerTimetable(5), r"must be a str"),
        (lambda: MultipleCronTriggerTimetable(), r"needs a cron"),
        (lambda: DeltaTriggerTimetable(HOUR, interval=3600), r"interval must be a datetime"),
        (lambda: DeltaDataIntervalTimetable(timedelta(0)), r"delta must be positive"),
        (lambda: CronDataIntervalTimetable("* * *"), r"5 fields"),
    ],
)
def test_timetable_arguments_are_checked(build, message: str) -> None:
    with pytest.raises(DagDefinitionError, match=message) as caught:
        build()
    assert __file__ in str(caught.value)  # names the line in the DAG file


# --- time zones and dates -------------------------------------------------------------------------

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (datetime(2026, 7, 1, 12), utc(2026, 7, 1, 10)),  # naive: Berlin wall time (CEST)
        (datetime(2026, 1, 1, 12), utc(2026, 1, 1, 11)),  # naive: CET
        (datetime(2026, 3, 29, 2, 30), utc(2026, 3, 29, 1, 30)),  # in the gap: as CET
        (datetime(2026, 10, 25, 2, 30), utc(2026, 10, 25, 0, 30)),  # twice: the first
        (datetime(2026, 7, 1, 12, tzinfo=NY), utc(2026, 7, 1, 16)),  # aware: converted
        (datetime(2026, 7, 1, 12, tzinfo=timezone(timedelta(hours=-3))), utc(2026, 7, 1, 15)),
        (pendulum.datetime(2026, 7, 1, 12, tz="Asia/Tokyo"), utc(2026, 7, 1, 3)),
        (pendulum.datetime(2026, 7, 1, 12, tz="UTC"), utc(2026, 7, 1, 12)),
        (pendulum.naive(2026, 7, 1, 12), utc(2026, 7, 1, 10)),
        (date(2026, 7, 1), utc(2026, 6, 30, 22)),  # midnight in Berlin
        (pendulum.date(2026, 1, 1), utc(2025, 12, 31, 23)),
    ],
)
def test_to_utc(value: object, expected: datetime) -> None:
    result = to_utc(value, timezone=BERLIN, where="dags/x.py:3", name="start_date")
    assert result == expected
    assert type(result) is datetime and result.tzinfo is UTC


@pytest.mark.parametrize("value", ["2026-01-01", 1767225600, None, pendulum.duration(days=1)])
def test_to_utc_rejects_what_is_not_a_date(value: object) -> None:
    with pytest.raises(DagDefinitionError, match=r"dags/x\.py:3: start_date must be a datetime"):
        to_utc(value, timezone=UTC, where="dags/x.py:3", name="start_date")


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (None, "UTC"),
        ("UTC", "UTC"),
        ("Europe/Berlin", "Europe/Berlin"),
        (ZoneInfo("Europe/Berlin"), "Europe/Berlin"),
        (ZoneInfo("UTC"), "UTC"),
        (UTC, "UTC"),
        (pendulum.timezone("Asia/Kolkata"), "Asia/Kolkata"),
        (pendulum.UTC, "UTC"),
        (pendulum.FixedTimezone(-3 * 3600), "-03:00"),
        (timezone(timedelta(hours=5, minutes=30)), "+05:30"),
        (timezone(timedelta(hours=-9, minutes=-30), "Marquesas"), "-09:30"),
        (timezone(timedelta(0)), "UTC"),
        ("+02:00", "+02:00"),
        ("-00:30:15", "-00:30:15"),
    ],
)
def test_timezone_of_and_its_stored_name(value: object, name: str) -> None:
    zone = timezone_of(value)
    assert timezone_name(zone) == name
    assert timezone_of(timezone_name(zone)) == zone
    if isinstance(value, tzinfo):
        moment = utc(2026, 7, 1)
        assert moment.astimezone(zone).utcoffset() == moment.astimezone(value).utcoffset()


def test_timezone_of_gives_plain_zones() -> None:
    assert timezone_of("UTC") is UTC and timezone_of(pendulum.UTC) is UTC
    assert type(timezone_of(pendulum.timezone("Europe/Berlin"))) is ZoneInfo
    assert timezone_of(pendulum.timezone("Europe/Berlin")) == BERLIN


@pytest.mark.parametrize(
    "value", ["Mars/Olympus", "", "America", "/etc/localtime", "+25:00", 5, object()]
)
def test_timezone_of_rejects_unknown_zones_clearly(value: object) -> None:
    with pytest.raises(DagDefinitionError, match=r"time zone|timezone|offset"):
        timezone_of(value)


# --- the rest ----------------------------------------------------------------------------------


def test_runs_need_aware_datetimes_and_come_back_in_utc() -> None:
    with pytest.raises(ValueError, match="aware"):
        DataInterval(datetime(2026, 1, 1), utc(2026, 1, 2))
    with pytest.raises(ValueError, match="ends before it starts"):
        DataInterval(utc(2026, 1, 2), utc(2026, 1, 1))
    with pytest.raises(ValueError, match="now must be an aware datetime"):
        nxt(CronTriggerTimetable("@daily"), now=datetime(2026, 1, 1), catchup=False)
    interval = DataInterval(datetime(2026, 1, 1, 1, tzinfo=BERLIN), pendulum.datetime(2026, 1, 2))
    assert interval == DataInterval(utc(2026, 1, 1), utc(2026, 1, 2))
    assert type(interval.end) is datetime and interval.end.tzinfo is UTC
    bounds = TimeRestriction(
        earliest=datetime(2026, 1, 1, 1, tzinfo=BERLIN), latest=None, catchup=True
    )
    assert bounds.earliest == utc(2026, 1, 1)


@pytest.mark.parametrize(
    ("timetable", "summary", "description"),
    [
        (CronTriggerTimetable("0 * * * *", timezone=BERLIN), "0 * * * *",
         "At minute 0 past every hour, Europe/Berlin"),
        (CronTriggerTimetable("@weekly"), "@weekly", "At 00:00 on Sunday, UTC"),
        (CronTriggerTimetable("*/15 * * * *"), "*/15 * * * *", "Every 15 minutes, UTC"),
        (CronTriggerTimetable("0 6 1 */3 *"), "0 6 1 */3 *",
         "At 06:00 on day 1 of the month every 3 months, UTC"),
        (CronDataIntervalTimetable("5 4 * * 1-5", "UTC"), "5 4 * * 1-5", "Cron 5 4 * * 1-5, UTC"),
        (DeltaTriggerTimetable(timedelta(minutes=30)), "every 0:30:00",
         "Every 30 minutes from the start date"),
        (DeltaDataIntervalTimetable(timedelta(days=1, hours=2)), "every 1 day, 2:00:00",
         "Intervals of 1 day, 2 hours from the start date"),
        (OnceTimetable(), "@once", "Once, at the start date"),
    ],
)  # fmt: skip
def test_summary_and_description(timetable: Timetable, summary: str, description: str) -> None:
    assert (timetable.summary, timetable.description) == (summary, description)
    assert summary in repr(timetable)


@pytest.mark.parametrize(
    "cls",
    [
        OnceTimetable,
        ContinuousTimetable,
        CronTriggerTimetable,
        MultipleCronTriggerTimetable,
        CronDataIntervalTimetable,
        DeltaTriggerTimetable,
        DeltaDataIntervalTimetable,
        AssetOrTimeSchedule,
    ],
)
def test_every_timetable_says_what_a_run_means(cls: type[Timetable]) -> None:
    doc = cls.__doc__ or ""
    assert "logical_date" in doc or "same logical_date" in doc
    assert "run_after" in doc and "interval" in doc
