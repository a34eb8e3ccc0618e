"""The pure part of "why" for a DAG that runs per partition key: each waiting key in words,
naming a rollup's missing upstream keys and the assets an ``&`` / ``|`` still needs."""

from __future__ import annotations

from engine.authoring.assets import Asset
from engine.authoring.partition_mappers import AllowedKeyMapper, IdentityMapper
from engine.authoring.partition_rollups import RollupMapper
from engine.authoring.partition_temporal import StartOfDayMapper, StartOfMonthMapper
from engine.authoring.partition_timetables import PartitionedAssetTimetable
from engine.authoring.partition_windows import DayWindow, MinimumCount, MonthWindow
from engine.views.why_partitions import partition_schedule

hourly, prices, regions = Asset("hourly_sales"), Asset("prices"), Asset("regions[eu]")
DAY = "2026-03-10"
HOURS = [f"{DAY}T{hour:02d}:00:00" for hour in range(24)]


def _rollup(**kwargs) -> RollupMapper:
    return RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow(), **kwargs)


def _queued(asset: str, keys: list[str], first: int = 1) -> list[tuple[int, str, str | None]]:
    return [(first + n, asset, key) for n, key in enumerate(keys)]


def test_a_rollup_names_how_many_hours_are_missing_and_which() -> None:
    timetable = PartitionedAssetTimetable(assets=hourly, default_partition_mapper=_rollup())
    shown = partition_schedule(timetable, _queued("hourly_sales", HOURS[:21]))
    [wait] = shown["waiting"]
    assert wait["message"] == (
        "2026-03-10: waiting for 3 of 24 hourly keys of asset hourly_sales: "
        "2026-03-10T21:00:00, 2026-03-10T22:00:00, 2026-03-10T23:00:00"
    )
    assert wait["events"] == 21 and shown["ready"] == [] and shown["queued_events"] == 21
    assert shown["mappers"] == {"hourly_sales": repr(_rollup())}


def test_many_missing_keys_are_cut_short_and_a_minimum_count_says_what_it_needs() -> None:
    mapper = _rollup(wait_policy=MinimumCount(20))
    timetable = PartitionedAssetTimetable(assets=hourly, default_partition_mapper=mapper)
    [wait] = partition_schedule(timetable, _queued("hourly_sales", HOURS[:2]))["waiting"]
    assert wait["message"].startswith(
        "2026-03-10: waiting for 22 of 24 hourly keys of asset hourly_sales: "
        "2026-03-10T02:00:00, 2026-03-10T03:00:00,"
    )
    assert wait["message"].endswith("and 16 more (MinimumCount(20); 2 arrived)")
    assert wait["rollups"][0]["needed"] == 20 and len(wait["rollups"][0]["missing_keys"]) == 22


def test_a_conditional_names_the_assets_a_key_still_needs() -> None:
    both = PartitionedAssetTimetable(
        assets=hourly & prices,
        partition_mapper_config={hourly: _rollup()},
        default_partition_mapper=IdentityMapper(),
    )
    shown = partition_schedule(both, _queued("hourly_sales", HOURS) + _queued("prices", [], 99))
    [wait] = shown["waiting"]
    assert wait["message"] == "2026-03-10: waiting for an event of asset prices for this key"
    assert wait["missing_assets"] == ["prices"] and wait["rollups"] == []

    either = PartitionedAssetTimetable(
        assets=hourly | prices, partition_mapper_config={hourly: _rollup()}
    )
    waiting = partition_schedule(either, _queued("hourly_sales", HOURS[:23]))["waiting"]
    assert waiting[0]["message"] == (
        "2026-03-10: waiting for 1 of 24 hourly keys of asset hourly_sales: "
        "2026-03-10T23:00:00 or an event of asset prices for this key"
    )


def test_keys_ready_and_refused_events_are_reported_and_waits_come_newest_first() -> None:
    month = RollupMapper(upstream_mapper=StartOfMonthMapper(), window=MonthWindow())
    timetable = PartitionedAssetTimetable(
        assets=regions, default_partition_mapper=AllowedKeyMapper(["us", "eu"])
    )
    shown = partition_schedule(timetable, [(1, "regions[eu]", "us"), (2, "regions[eu]", "fr")])
    assert shown["ready"] == ["us"] and shown["waiting"] == []
    [refused] = shown["refused"]
    assert refused["event_id"] == 2 and "'fr' is not an allowed key" in refused["reason"]

    monthly = PartitionedAssetTimetable(assets=hourly, default_partition_mapper=month)
    days = ["2026-01-05T00:00:00", "2026-03-01T00:00:00", "2026-02-11T00:00:00"]
    waits = partition_schedule(monthly, _queued("hourly_sales", days))["waiting"]
    assert [w["partition_key"] for w in waits] == ["2026-03", "2026-02", "2026-01"]
    assert waits[1]["rollups"][0]["grain"] == "daily"
    assert waits[1]["rollups"][0]["expected"] == 28  # February 2026


def test_a_key_that_already_ran_on_a_kept_event_is_not_ready_again() -> None:
    timetable = PartitionedAssetTimetable(assets=regions)
    queued = [(1, "regions[eu]", "us"), (2, "regions[eu]", "eu")]
    shown = partition_schedule(timetable, queued, consumed={(1, "us")})
    assert shown["ready"] == ["eu"]
