"""CronPartitionTimetable (the key of each time run), PartitionedAtRuntime, and the stored
JSON of the partition timetables."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from engine import DAG
from engine.authoring.assets import Asset
from engine.authoring.errors import DagDefinitionError
from engine.authoring.partition_mappers import PartitionKeyError
from engine.authoring.partition_rollups import RollupMapper
from engine.authoring.partition_temporal import StartOfDayMapper
from engine.authoring.partition_timetables import (
    CronPartitionTimetable,
    PartitionedAssetTimetable,
    PartitionedAtRuntime,
)
from engine.authoring.partition_windows import DayWindow
from engine.authoring.schedules import resolve_schedule, timetable_from_json
from engine.authoring.timetables import (
    AssetOrTimeSchedule,
    DagRunInfo,
    TimeRestriction,
    Timetable,
    timezone_of,
)
from engine.authoring.trigger_timetables import CronTriggerTimetable

CATCHUP = TimeRestriction(earliest=None, latest=None, catchup=True)


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def key_at(timetable: Timetable, moment: datetime) -> str | None:
    return timetable.partition_key_for(DagRunInfo.exact(moment))


def test_an_hourly_backfill_of_a_day_gives_the_24_hour_keys() -> None:
    timetable = CronPartitionTimetable("0 * * * *", timezone="UTC")
    runs = timetable.runs_between(at(2026, 3, 10), at(2026, 3, 10, 23), restriction=CATCHUP)
    keys = [timetable.partition_key_for(run) for run in runs]
    assert keys == [f"2026-03-10T{hour:02d}:00:00" for hour in range(24)]


def test_the_keys_roll_up_into_a_daily_rollup() -> None:
    producer = CronPartitionTimetable("0 * * * *")
    runs = producer.runs_between(at(2026, 3, 10), at(2026, 3, 10, 23), restriction=CATCHUP)
    rollup = RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow())
    assert {producer.partition_key_for(run) for run in runs} == rollup.expected_upstream_keys(
        "2026-03-10"
    )


def test_run_offset_minus_one_processes_the_previous_ticks_partition() -> None:
    timetable = CronPartitionTimetable("@daily", run_offset=-1, key_format="%Y-%m-%d")
    assert key_at(timetable, at(2026, 3, 11)) == "2026-03-10"
    assert key_at(timetable, at(2026, 3, 1)) == "2026-02-28"


def test_run_offset_plus_two_processes_a_later_ticks_partition() -> None:
    timetable = CronPartitionTimetable("0 */6 * * *", run_offset=2)
    assert key_at(timetable, at(2026, 3, 10, 18)) == "2026-03-11T06:00:00"


def test_keys_are_written_on_the_timetables_wall_clock() -> None:
    timetable = CronPartitionTimetable("0 0 * * *", timezone="Europe/Berlin", key_format="%Y-%m-%d")
    runs = timetable.runs_between(at(2026, 3, 9), at(2026, 3, 10), restriction=CATCHUP)
    assert [run.logical_date for run in runs] == [at(2026, 3, 9, 23)]
    assert timetable.partition_key_for(runs[0]) == "2026-03-10"


def test_it_schedules_like_a_cron_trigger_timetable() -> None:
    partitioned = CronPartitionTimetable("30 * * * *")
    plain = CronTriggerTimetable("30 * * * *", run_immediately=False)
    now = at(2026, 3, 10, 9, 45)
    no_catchup = TimeRestriction(earliest=None, latest=None, catchup=False)
    args = {"last_automated_data_interval": None, "restriction": no_catchup, "now": now}
    assert partitioned.next_dagrun_info(**args) == plain.next_dagrun_info(**args)
    assert partitioned.next_dagrun_info(**args).logical_date == at(2026, 3, 10, 10, 30)  # type: ignore[union-attr]


def test_a_key_format_that_gives_runs_the_same_key_is_refused() -> None:
    with pytest.raises(DagDefinitionError, match="the same partition key") as caught:
        CronPartitionTimetable("0 * * * *", key_format="%Y-%m-%d")
    assert "'%H' for an hourly cron" in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"run_offset": 1.5}, "whole number of cron ticks"),
        ({"run_offset": timedelta(hours=1)}, "whole number of cron ticks"),
        ({"key_format": "day"}, "key_format must be a strftime"),
        ({"timezone": "Nowhere/Land"}, "Nowhere/Land"),
    ],
)
def test_bad_arguments_are_definition_errors(kwargs, message: str) -> None:
    with pytest.raises(DagDefinitionError, match=message):
        CronPartitionTimetable("@daily", **kwargs)


def test_other_timetables_give_no_key() -> None:
    assert key_at(CronTriggerTimetable("@daily"), at(2026, 3, 10)) is None
    assert key_at(PartitionedAtRuntime(), at(2026, 3, 10)) is None


def test_partitioned_at_runtime_never_schedules() -> None:
    timetable = PartitionedAtRuntime()
    restriction = TimeRestriction(earliest=at(2026, 1, 1), latest=None, catchup=True)
    info = timetable.next_dagrun_info(
        last_automated_data_interval=None, restriction=restriction, now=at(2026, 3, 10)
    )
    assert info is None
    assert timetable.runs_between(at(2026, 1, 1), at(2026, 3, 1), restriction=restriction) == []
    assert timetable.partitioned_at_runtime


def test_the_dag_takes_the_partition_timetables_as_its_schedule() -> None:
    utc = timezone_of("UTC")
    for timetable in (CronPartitionTimetable("@hourly"), PartitionedAtRuntime()):
        assert resolve_schedule(timetable, timezone=utc, where="x") == (timetable, None)
        assert DAG("d", schedule=timetable).timetable is timetable


EVERY_TIMETABLE = [
    CronPartitionTimetable("0 * * * *"),
    CronPartitionTimetable(
        "0 0 * * 1",
        timezone="America/New_York",
        run_offset=-1,
        run_immediately=timedelta(hours=2),
        key_format="%G-W%V",
    ),
    CronPartitionTimetable("@daily", run_immediately=True, key_format="%Y%m%d"),
    PartitionedAtRuntime(),
    PartitionedAssetTimetable(assets=Asset("a")),
    PartitionedAssetTimetable(
        assets=[Asset("a"), Asset("b", "s3://b")],
        partition_mapper_config={Asset("b", "s3://b"): StartOfDayMapper()},
    ),
]


@pytest.mark.parametrize("timetable", EVERY_TIMETABLE, ids=repr)
def test_every_partition_timetable_round_trips_through_the_stored_json(
    timetable: Timetable,
) -> None:
    back = timetable_from_json(json.loads(json.dumps(timetable.serialize())))
    assert back == timetable
    assert type(back) is type(timetable)
    assert back.description == timetable.description
    moment = at(2026, 3, 10, 5)
    assert key_at(back, moment) == key_at(timetable, moment)


@pytest.mark.parametrize(
    "data",
    [
        {"__type": "cron_partition", "expression": "@daily", "timezone": "UTC"},
        {
            "__type": "cron_partition",
            "expression": "@daily",
            "timezone": "UTC",
            "run_immediately": False,
            "run_offset": "1",
            "key_format": "%Y",
        },
        {"__type": "partitioned_asset", "assets": {"__type": "asset", "name": "a", "uri": "a"}},
        {
            "__type": "partitioned_asset",
            "assets": {"__type": "asset", "name": "a", "uri": "a"},
            "partition_mappers": {"b": {"__type": "identity"}},
            "default_partition_mapper": {"__type": "identity"},
        },
    ],
)
def test_bad_stored_partition_timetables_are_value_errors(data) -> None:
    with pytest.raises(ValueError, match="stored timetable"):
        timetable_from_json(data)


@pytest.mark.parametrize(
    "timetable",
    [
        CronPartitionTimetable("0 * * * *"),
        CronPartitionTimetable("0 6 * * *", run_offset=-1, key_format="%Y-%m-%d"),
        CronPartitionTimetable("0 0 * * *", timezone="Europe/Berlin", run_offset=2),
        CronPartitionTimetable("0 0 1 * *", timezone="America/New_York", key_format="%Y-%m"),
    ],
    ids=repr,
)
def test_run_for_key_goes_back_from_each_key_to_its_run(timetable: CronPartitionTimetable) -> None:
    runs = timetable.runs_between(at(2026, 2, 25), at(2026, 4, 5), restriction=CATCHUP)
    assert runs
    for run in runs:  # across both DST changes of New York and Berlin
        key = timetable.partition_key_for(run)
        assert key is not None
        assert timetable.run_for_key(key) == run


@pytest.mark.parametrize(
    ("key", "message"),
    [("2026-03-10T09:30:00", "the nearest is '2026-03-10T10:00:00'"), ("x", "cannot read it")],
)
def test_run_for_key_refuses_a_key_that_is_not_one_of_the_timetables(key, message) -> None:
    with pytest.raises(PartitionKeyError, match=message):
        CronPartitionTimetable("0 * * * *").run_for_key(key)


def test_asset_or_time_gives_its_time_runs_the_partition_keys() -> None:
    schedule = AssetOrTimeSchedule(timetable=CronPartitionTimetable("@hourly"), assets=Asset("a"))
    assert key_at(schedule, at(2026, 3, 10, 9)) == "2026-03-10T09:00:00"
    with pytest.raises(DagDefinitionError, match="must be a timetable such as"):
        AssetOrTimeSchedule(
            timetable=PartitionedAssetTimetable(assets=Asset("b")), assets=Asset("a")
        )
