"""Partition mappers: the downstream keys of upstream keys, the keys they refuse (and the
message), composition (Product, Chain, FanOut, Rollup) and the stored JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.authoring.errors import DagDefinitionError
from engine.authoring.partition_mappers import (
    AllowedKeyMapper,
    ChainMapper,
    FixedKeyMapper,
    IdentityMapper,
    PartitionKeyError,
    PartitionMapper,
    ProductMapper,
    downstream_keys,
    mapper_from_json,
)
from engine.authoring.partition_rollups import FanOutMapper, RollupMapper
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
    WeekWindow,
    YearWindow,
)

KEY = "2024-03-13T10:42:15"


@pytest.mark.parametrize(
    ("mapper", "expected"),
    [
        (IdentityMapper(), KEY),
        (StartOfHourMapper(), "2024-03-13T10"),
        (StartOfDayMapper(), "2024-03-13"),
        (StartOfWeekMapper(), "2024-03-11 (W11)"),
        (StartOfMonthMapper(), "2024-03"),
        (StartOfQuarterMapper(), "2024-Q1"),
        (StartOfYearMapper(), "2024"),
        (FixedKeyMapper("all"), "all"),
        (AllowedKeyMapper([KEY]), KEY),
        (StartOfQuarterMapper(output_format="Q{quarter} %Y"), "Q1 2024"),
        (StartOfDayMapper(output_format="%Y%m%d"), "20240313"),
    ],
    ids=repr,
)
def test_each_mapper_maps_a_key(mapper: PartitionMapper, expected: str) -> None:
    assert mapper.to_downstream(KEY) == expected


def test_a_naive_key_is_a_wall_time_of_the_mappers_zone() -> None:
    # 23:30 on the 13th in New York is already the 14th in UTC: the day is New York's.
    assert StartOfDayMapper(timezone="America/New_York").to_downstream("2024-03-13T23:30:00") == (
        "2024-03-13"
    )


def test_a_key_with_an_offset_is_converted_to_the_mappers_zone() -> None:
    mapper = StartOfDayMapper(timezone="Asia/Tokyo", input_format="%Y-%m-%dT%H:%M:%S%z")
    assert mapper.to_downstream("2024-03-13T20:00:00+0000") == "2024-03-14"


@pytest.mark.parametrize(
    "mapper",
    [StartOfHourMapper(), StartOfDayMapper(), StartOfWeekMapper(), StartOfYearMapper()],
    ids=lambda mapper: type(mapper).__name__,
)
def test_a_key_that_is_not_a_date_is_refused_with_its_format(mapper: PartitionMapper) -> None:
    with pytest.raises(PartitionKeyError) as caught:
        mapper.to_downstream("us")
    message = str(caught.value)
    assert "cannot read partition key 'us' as a date" in message
    assert "input_format '%Y-%m-%dT%H:%M:%S'" in message
    assert type(mapper).__name__ in message


def test_allowed_keys_refuses_others_naming_the_allowed_ones() -> None:
    mapper = AllowedKeyMapper(["us", "eu"])
    assert mapper.to_downstream("eu") == "eu"
    with pytest.raises(
        PartitionKeyError,
        match=r"key 'apac' is not an allowed key of AllowedKeyMapper \(allowed: 'us', 'eu'\)",
    ):
        mapper.to_downstream("apac")


def test_allowed_keys_message_stays_short_for_a_long_list() -> None:
    mapper = AllowedKeyMapper([f"k{i}" for i in range(50)])
    with pytest.raises(PartitionKeyError, match="and 40 more"):
        mapper.to_downstream("x")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: AllowedKeyMapper([]), "non-empty list"),
        (lambda: AllowedKeyMapper("us"), "takes a list of keys"),
        (lambda: AllowedKeyMapper(["us", 3]), "non-empty string keys"),
        (lambda: FixedKeyMapper(""), "non-empty string key"),
        (lambda: StartOfDayMapper(input_format="day"), "input_format must be a strftime"),
        (lambda: StartOfDayMapper(timezone="Mars/Base"), "Mars/Base"),
        (lambda: ProductMapper(IdentityMapper(), "x"), "ProductMapper mapper 1 must be"),
        (lambda: ProductMapper(IdentityMapper(), IdentityMapper(), delimiter=""), "delimiter"),
        (
            lambda: ChainMapper(
                IdentityMapper(),
                RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow()),
            ),
            "cannot hold a rollup mapper",
        ),
    ],
)
def test_bad_arguments_are_definition_errors(make, message: str) -> None:
    with pytest.raises(DagDefinitionError, match=message):
        make()


# --- Product and Chain -------------------------------------------------------------------------


def test_product_maps_each_segment_with_its_mapper() -> None:
    mapper = ProductMapper(IdentityMapper(), StartOfDayMapper())
    assert mapper.to_downstream("us|2026-03-10T09:30:00") == "us|2026-03-10"


def test_product_with_its_own_delimiter_and_three_segments() -> None:
    mapper = ProductMapper(
        AllowedKeyMapper(["us", "eu"]), IdentityMapper(), StartOfMonthMapper(), delimiter="/"
    )
    assert mapper.to_downstream("eu/web/2026-03-10T09:30:00") == "eu/web/2026-03"


def test_product_refuses_a_wrong_number_of_segments() -> None:
    mapper = ProductMapper(IdentityMapper(), StartOfDayMapper())
    with pytest.raises(PartitionKeyError, match=r"expects 2 segments separated by '\|'.*got 3"):
        mapper.to_downstream("us|x|2026-03-10T09:30:00")


def test_product_passes_on_a_segment_mappers_refusal() -> None:
    mapper = ProductMapper(AllowedKeyMapper(["us"]), StartOfDayMapper())
    with pytest.raises(PartitionKeyError, match="'eu' is not an allowed key"):
        mapper.to_downstream("eu|2026-03-10T09:30:00")


def test_product_of_a_fan_out_segment_gives_every_combination() -> None:
    weekly = FanOutMapper(upstream_mapper=StartOfWeekMapper(), window=WeekWindow())
    keys = ProductMapper(IdentityMapper(), weekly).to_downstream("us|2026-03-12T00:00:00")
    assert keys == tuple(f"us|2026-03-{day:02d}" for day in range(9, 16))


def test_chain_applies_its_mappers_in_order() -> None:
    mapper = ChainMapper(StartOfHourMapper(output_format="%Y-%m-%dT%H:00:00"), StartOfDayMapper())
    assert mapper.to_downstream("2026-03-10T09:30:00") == "2026-03-10"


def test_chain_stops_at_a_refusal() -> None:
    mapper = ChainMapper(AllowedKeyMapper(["2026-03-10T09:30:00"]), StartOfDayMapper())
    assert mapper.to_downstream("2026-03-10T09:30:00") == "2026-03-10"
    with pytest.raises(PartitionKeyError, match="not an allowed key"):
        mapper.to_downstream("2026-03-11T09:30:00")


def test_chain_passes_each_fanned_out_key_on() -> None:
    fan = FanOutMapper(upstream_mapper=StartOfQuarterMapper(), window=QuarterWindow())
    mapper = ChainMapper(fan, ProductMapper(FixedKeyMapper("eu"), IdentityMapper(), delimiter="-"))
    # the Product splits "2026-04" on "-": FixedKey takes "2026", Identity "04"
    assert mapper.to_downstream("2026-05-10T00:00:00") == ("eu-04", "eu-05", "eu-06")


# --- FanOut ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("upstream", "window", "key", "first", "last", "count"),
    [
        (
            StartOfDayMapper(),
            DayWindow(),
            "2024-01-15T03:30:00",
            "2024-01-15T00",
            "2024-01-15T23",
            24,
        ),
        (StartOfWeekMapper(), WeekWindow(), "2024-01-17T13:42:00", "2024-01-15", "2024-01-21", 7),
        (
            StartOfMonthMapper(),
            MonthWindow(),
            "2024-02-10T00:00:00",
            "2024-02-01",
            "2024-02-29",
            29,
        ),
        (StartOfQuarterMapper(), QuarterWindow(), "2024-05-10T00:00:00", "2024-04", "2024-06", 3),
        (StartOfYearMapper(), YearWindow(), "2024-05-10T00:00:00", "2024-01", "2024-12", 12),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, str | int) else None,
)
def test_fan_out_makes_one_key_per_member(upstream, window, key, first, last, count) -> None:
    keys = FanOutMapper(upstream_mapper=upstream, window=window).to_downstream(key)
    assert (keys[0], keys[-1], len(keys)) == (first, last, count)


def test_fan_out_over_segments_gives_the_segments() -> None:
    mapper = FanOutMapper(upstream_mapper=IdentityMapper(), window=SegmentWindow(["us", "eu"]))
    assert mapper.to_downstream("anything") == ("us", "eu")


def test_fan_out_with_a_given_downstream_mapper() -> None:
    mapper = FanOutMapper(
        upstream_mapper=StartOfHourMapper(),
        window=HourWindow(),
        downstream_mapper=StartOfHourMapper(output_format="%Y-%m-%dT%H:%M"),
    )
    keys = mapper.to_downstream("2026-03-10T09:15:00")
    assert (keys[0], keys[-1], len(keys)) == ("2026-03-10T09:00", "2026-03-10T09:59", 60)


def test_fan_out_over_an_hour_needs_a_downstream_mapper() -> None:
    with pytest.raises(DagDefinitionError, match="needs a downstream_mapper"):
        FanOutMapper(upstream_mapper=StartOfHourMapper(), window=HourWindow())


@pytest.mark.parametrize("kind", [RollupMapper, FanOutMapper])
def test_an_upstream_mapper_of_another_grain_is_refused(kind) -> None:
    with pytest.raises(DagDefinitionError, match=r"pair it with StartOfMonthMapper\(...\)"):
        kind(upstream_mapper=StartOfDayMapper(), window=MonthWindow())
    with pytest.raises(DagDefinitionError, match="a mapper of plain keys"):
        kind(upstream_mapper=StartOfDayMapper(), window=SegmentWindow(["a"]))


def test_an_output_format_that_cannot_be_read_back_is_refused_for_a_rollup() -> None:
    with pytest.raises(DagDefinitionError, match="cannot be read back to the start of its day"):
        RollupMapper(upstream_mapper=StartOfDayMapper(output_format="%m/%d"), window=DayWindow())


# --- Rollup ------------------------------------------------------------------------------------


def test_rollup_maps_an_hour_to_its_day_and_expects_the_days_hours() -> None:
    mapper = RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow())
    assert mapper.is_rollup
    assert mapper.to_downstream("2026-03-10T09:00:00") == "2026-03-10"
    expected = mapper.expected_upstream_keys("2026-03-10")
    assert expected == {f"2026-03-10T{hour:02d}:00:00" for hour in range(24)}
    assert not mapper.is_satisfied("2026-03-10", expected - {"2026-03-10T05:00:00"})
    assert mapper.is_satisfied("2026-03-10", expected | {"2026-03-11T00:00:00"})


def test_rollup_of_segments_waits_for_every_segment() -> None:
    mapper = RollupMapper(
        upstream_mapper=FixedKeyMapper("all_regions"), window=SegmentWindow(["us", "eu", "apac"])
    )
    assert mapper.to_downstream("eu") == "all_regions"
    assert mapper.expected_upstream_keys("all_regions") == {"us", "eu", "apac"}
    assert not mapper.is_satisfied("all_regions", frozenset({"us", "eu"}))
    with pytest.raises(PartitionKeyError, match="'mars' is not one of the upstream keys"):
        mapper.to_downstream("mars")


def test_rollup_of_months_into_a_quarter_with_an_upstream_format() -> None:
    mapper = RollupMapper(
        upstream_mapper=StartOfQuarterMapper(input_format="%Y-%m"), window=QuarterWindow()
    )
    assert mapper.to_downstream("2026-05") == "2026-Q2"
    assert mapper.expected_upstream_keys("2026-Q2") == {"2026-04", "2026-05", "2026-06"}


def test_rollup_of_a_downstream_key_it_cannot_read_says_so() -> None:
    mapper = RollupMapper(upstream_mapper=StartOfWeekMapper(), window=WeekWindow())
    with pytest.raises(PartitionKeyError, match="is not a key of StartOfWeekMapper"):
        mapper.expected_upstream_keys("2026-03-10 (W11)")  # a Tuesday


def test_minimum_count_larger_than_the_window_is_refused() -> None:
    with pytest.raises(DagDefinitionError, match="can never be met"):
        RollupMapper(
            upstream_mapper=StartOfWeekMapper(), window=WeekWindow(), wait_policy=MinimumCount(8)
        )


@given(st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2090, 1, 1)))
def test_every_hour_of_a_day_rolls_up_to_that_days_key(moment: datetime) -> None:
    mapper = RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow())
    hour = moment.replace(minute=0, second=0, microsecond=0).strftime("%Y-%m-%dT%H:%M:%S")
    day = mapper.to_downstream(hour)
    assert day == moment.strftime("%Y-%m-%d")
    assert hour in mapper.expected_upstream_keys(day)


@given(
    st.datetimes(
        min_value=datetime(1990, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC)
    ),
    st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]),
)
def test_every_day_of_a_month_rolls_up_and_fans_back_out(moment: datetime, zone: str) -> None:
    day = moment.strftime("%Y-%m-%dT00:00:00")
    rollup = RollupMapper(upstream_mapper=StartOfMonthMapper(timezone=zone), window=MonthWindow())
    month = rollup.to_downstream(day)
    expected = rollup.expected_upstream_keys(month)
    assert day in expected
    next_month = (moment.replace(day=28) + timedelta(days=4)).replace(day=1)
    assert len(expected) == (next_month - moment.replace(day=1)).days
    fan = FanOutMapper(upstream_mapper=StartOfMonthMapper(timezone=zone), window=MonthWindow())
    assert moment.strftime("%Y-%m-%d") in fan.to_downstream(day)


# --- keys and JSON -----------------------------------------------------------------------------


def test_downstream_keys_refuses_keys_over_250_characters() -> None:
    with pytest.raises(PartitionKeyError, match="longer than 250"):
        downstream_keys(IdentityMapper(), "k" * 251)


EVERY_MAPPER = [
    IdentityMapper(),
    StartOfHourMapper(timezone="Europe/Berlin"),
    StartOfDayMapper(input_format="%Y-%m-%dT%H"),
    StartOfWeekMapper(output_format="%Y-%m-%d"),
    StartOfMonthMapper(),
    StartOfQuarterMapper(),
    StartOfYearMapper(timezone="+05:30"),
    AllowedKeyMapper(["us", "eu"]),
    FixedKeyMapper("all"),
    ProductMapper(IdentityMapper(), StartOfDayMapper(), delimiter="/"),
    ChainMapper(AllowedKeyMapper(["a"]), IdentityMapper(), FixedKeyMapper("b")),
    RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow()),
    RollupMapper(
        upstream_mapper=StartOfYearMapper(), window=YearWindow(), wait_policy=MinimumCount(-1)
    ),
    RollupMapper(upstream_mapper=FixedKeyMapper("x"), window=SegmentWindow(["b", "a"])),
    RollupMapper(upstream_mapper=StartOfHourMapper(), window=HourWindow()),
    FanOutMapper(upstream_mapper=StartOfWeekMapper(), window=WeekWindow()),
    FanOutMapper(
        upstream_mapper=StartOfHourMapper(),
        window=HourWindow(),
        downstream_mapper=StartOfHourMapper(output_format="%H:%M"),
    ),
]


@pytest.mark.parametrize("mapper", EVERY_MAPPER, ids=repr)
def test_every_mapper_round_trips_through_json(mapper: PartitionMapper) -> None:
    stored = json.loads(json.dumps(mapper.serialize()))
    back = mapper_from_json(stored)
    assert back == mapper
    assert type(back) is type(mapper)
    assert hash(back) == hash(mapper)
    assert repr(back) == repr(mapper)


@pytest.mark.parametrize(
    "data", [None, {}, {"__type": "nope"}, {"__type": "allowed_key", "allowed_keys": 3}]
)
def test_bad_stored_mappers_are_value_errors(data: object) -> None:
    with pytest.raises(ValueError, match=r"mapper|AllowedKeyMapper"):
        mapper_from_json(data)


def test_a_fan_out_downstream_mapper_must_write_what_the_window_gives() -> None:
    with pytest.raises(DagDefinitionError, match=r"give a StartOf\.\.\.Mapper"):
        FanOutMapper(
            upstream_mapper=StartOfWeekMapper(),
            window=WeekWindow(),
            downstream_mapper=IdentityMapper(),
        )
    with pytest.raises(DagDefinitionError, match="give a mapper of plain keys"):
        FanOutMapper(
            upstream_mapper=IdentityMapper(),
            window=SegmentWindow(["us"]),
            downstream_mapper=StartOfDayMapper(),
        )


class OwnMapper(IdentityMapper):
    """A mapper class of a DAG file: the scheduler could not rebuild it."""

    def to_downstream(self, key: str) -> str:
        return key.upper()


def test_a_mapper_class_of_the_dag_file_is_refused_and_does_not_replace_ours() -> None:
    with pytest.raises(DagDefinitionError, match="OwnMapper is a mapper class of the DAG file"):
        ChainMapper(IdentityMapper(), OwnMapper())
    assert type(mapper_from_json({"__type": "identity"})) is IdentityMapper
