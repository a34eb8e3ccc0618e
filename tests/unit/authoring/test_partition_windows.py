"""Rollup windows (the upstream keys of one downstream key, in UTC and in zones with and
without DST) and wait policies."""

from __future__ import annotations

import json

import pytest

from engine.authoring.errors import DagDefinitionError
from engine.authoring.partition_mappers import FixedKeyMapper
from engine.authoring.partition_rollups import RollupMapper
from engine.authoring.partition_temporal import (
    StartOfDayMapper,
    StartOfHourMapper,
    StartOfMonthMapper,
    StartOfQuarterMapper,
    StartOfWeekMapper,
    StartOfYearMapper,
)
from engine.authoring.partition_windows import (
    DayWindow,
    HourWindow,
    MinimumCount,
    MonthWindow,
    QuarterWindow,
    SegmentWindow,
    WaitForAll,
    WeekWindow,
    Window,
    YearWindow,
    wait_policy_from_json,
    window_from_json,
)


def expected(mapper, window, key: str) -> list[str]:
    return sorted(RollupMapper(upstream_mapper=mapper, window=window).expected_upstream_keys(key))


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata"])  # no DST in either
def test_hour_window_is_sixty_minutes(zone: str) -> None:
    keys = expected(StartOfHourMapper(timezone=zone), HourWindow(), "2026-03-10T09")
    assert keys == [f"2026-03-10T09:{minute:02d}:00" for minute in range(60)]


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "Europe/Berlin"])
def test_day_window_is_the_24_hours_of_an_ordinary_day(zone: str) -> None:
    keys = expected(StartOfDayMapper(timezone=zone), DayWindow(), "2026-03-10")
    assert keys == [f"2026-03-10T{hour:02d}:00:00" for hour in range(24)]


def test_day_window_on_a_spring_forward_day_has_the_23_real_hours() -> None:
    keys = expected(StartOfDayMapper(timezone="America/New_York"), DayWindow(), "2026-03-08")
    assert len(keys) == 23
    assert "2026-03-08T02:00:00" not in keys  # 02:00 does not exist that day
    assert keys[:3] == ["2026-03-08T00:00:00", "2026-03-08T01:00:00", "2026-03-08T03:00:00"]


def test_day_window_on_a_fall_back_day_tells_the_repeated_hour_apart_by_offset() -> None:
    plain = expected(StartOfDayMapper(timezone="America/New_York"), DayWindow(), "2026-11-01")
    assert len(plain) == 24  # 01:00 twice, the same key
    with_offset = StartOfDayMapper(timezone="America/New_York", input_format="%Y-%m-%dT%H:%M:%S%z")
    keys = expected(with_offset, DayWindow(), "2026-11-01")
    assert len(keys) == 25
    assert {"2026-11-01T01:00:00-0400", "2026-11-01T01:00:00-0500"} <= set(keys)


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_week_window_is_monday_to_sunday(zone: str) -> None:
    keys = expected(StartOfWeekMapper(timezone=zone), WeekWindow(), "2026-03-09 (W11)")
    assert keys == [f"2026-03-{day:02d}T00:00:00" for day in range(9, 16)]


@pytest.mark.parametrize(
    ("key", "days"), [("2024-02", 29), ("2025-02", 28), ("2026-04", 30), ("2026-12", 31)]
)
def test_month_window_is_the_days_of_the_month(key: str, days: int) -> None:
    for zone in ("UTC", "Europe/Berlin"):
        keys = expected(StartOfMonthMapper(timezone=zone), MonthWindow(), key)
        assert len(keys) == days
        assert keys[0] == f"{key}-01T00:00:00"


def test_quarter_and_year_windows_are_their_months() -> None:
    quarter = expected(StartOfQuarterMapper(input_format="%Y-%m"), QuarterWindow(), "2026-Q4")
    assert quarter == ["2026-10", "2026-11", "2026-12"]
    year = expected(
        StartOfYearMapper(timezone="Australia/Sydney", input_format="%Y-%m"), YearWindow(), "2026"
    )
    assert year == [f"2026-{month:02d}" for month in range(1, 13)]


def test_segment_window_is_its_segments_whatever_the_key() -> None:
    window = SegmentWindow(["us", "eu", "us"])
    assert window.segments == ("us", "eu")
    assert expected(FixedKeyMapper("all"), window, "all") == ["eu", "us"]


@pytest.mark.parametrize(
    ("segments", "message"),
    [([], "at least one key"), ("us", "list of keys"), (["us", ""], "non-empty strings")],
)
def test_bad_segments_are_definition_errors(segments, message: str) -> None:
    with pytest.raises(DagDefinitionError, match=message):
        SegmentWindow(segments)


# --- wait policies -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "matched", "expected_count", "met"),
    [
        (WaitForAll(), 24, 24, True),
        (WaitForAll(), 23, 24, False),
        (MinimumCount(20), 20, 24, True),
        (MinimumCount(20), 19, 24, False),
        (MinimumCount(24), 23, 23, True),  # a 23-hour day holds fewer keys than asked
        (MinimumCount(-2), 22, 24, True),
        (MinimumCount(-2), 21, 24, False),
        (MinimumCount(-30), 0, 24, True),
    ],
)
def test_wait_policies(policy, matched: int, expected_count: int, met: bool) -> None:
    assert policy.is_met(matched, expected_count) is met


@pytest.mark.parametrize(("n", "message"), [(0, r"MinimumCount\(0\)"), (1.5, "takes an int")])
def test_bad_minimum_counts_are_definition_errors(n, message: str) -> None:
    with pytest.raises(DagDefinitionError, match=message):
        MinimumCount(n)


def test_the_wait_for_all_class_is_taken_as_its_instance() -> None:
    mapper = RollupMapper(
        upstream_mapper=StartOfDayMapper(),
        window=DayWindow(),
        wait_policy=WaitForAll,  # type: ignore[arg-type]
    )
    assert mapper.wait_policy == WaitForAll()


def test_a_wait_policy_that_is_not_one_is_refused() -> None:
    with pytest.raises(DagDefinitionError, match="wait_policy must be"):
        RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow(), wait_policy=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "window",
    [
        HourWindow(),
        DayWindow(),
        WeekWindow(),
        MonthWindow(),
        QuarterWindow(),
        YearWindow(),
        SegmentWindow(["b", "a"]),
    ],
    ids=repr,
)
def test_every_window_round_trips_through_json(window: Window) -> None:
    back = window_from_json(json.loads(json.dumps(window.serialize())))
    assert back == window
    assert repr(back) == repr(window)


@pytest.mark.parametrize("policy", [WaitForAll(), MinimumCount(3), MinimumCount(-1)], ids=repr)
def test_every_wait_policy_round_trips_through_json(policy) -> None:
    assert wait_policy_from_json(json.loads(json.dumps(policy.serialize()))) == policy


@pytest.mark.parametrize(
    ("reader", "data"),
    [
        (window_from_json, {"__type": "segment_window", "segments": "x"}),
        (window_from_json, {"__type": "nope"}),
        (wait_policy_from_json, {"__type": "minimum_count", "n": "3"}),
        (wait_policy_from_json, None),
    ],
)
def test_bad_stored_windows_and_policies_are_value_errors(reader, data) -> None:
    with pytest.raises(ValueError, match="stored"):
        reader(data)


def test_an_iso_week_key_reads_back_to_its_monday() -> None:
    mapper = StartOfWeekMapper(output_format="%G-W%V", input_format="%Y-%m-%d")
    assert mapper.to_downstream("2027-01-01") == "2026-W53"  # a Friday of ISO week 53 of 2026
    keys = expected(mapper, WeekWindow(), "2026-W53")
    assert keys == [
        "2026-12-28",
        "2026-12-29",
        "2026-12-30",
        "2026-12-31",
        *(f"2027-01-0{day}" for day in range(1, 4)),
    ]


class OwnWindow(DayWindow):
    """A window class of a DAG file: it would be stored as a DayWindow."""


class OwnPolicy(WaitForAll):
    """A wait policy class of a DAG file."""


def test_window_and_policy_classes_of_a_dag_file_are_refused() -> None:
    with pytest.raises(DagDefinitionError, match="window classes of a DAG file"):
        RollupMapper(upstream_mapper=StartOfDayMapper(), window=OwnWindow())
    with pytest.raises(DagDefinitionError, match="policy classes of a DAG file"):
        RollupMapper(
            upstream_mapper=StartOfDayMapper(), window=DayWindow(), wait_policy=OwnPolicy()
        )
