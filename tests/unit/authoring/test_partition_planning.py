"""plan_partitioned_runs: one run per downstream key whose asset condition is met for that
key; rollups wait (naming the missing keys); events without a key or refused by a mapper
are refused with the reason."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import DAG
from engine.authoring.assets import Asset
from engine.authoring.errors import DagDefinitionError
from engine.authoring.partition_mappers import AllowedKeyMapper, IdentityMapper
from engine.authoring.partition_planning import (
    PartitionRun,
    QueuedPartitionEvent,
    plan_partitioned_runs,
)
from engine.authoring.partition_rollups import RollupMapper
from engine.authoring.partition_temporal import StartOfDayMapper
from engine.authoring.partition_timetables import PartitionedAssetTimetable
from engine.authoring.partition_windows import DayWindow, MinimumCount
from engine.authoring.schedules import resolve_schedule, timetable_from_json
from engine.authoring.timetables import TimeRestriction, timezone_of

HOURLY = Asset("hourly")
ORDERS = Asset("orders")
PRICES = Asset("prices")
DAILY_ROLLUP = RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow())


def event(event_id: int, asset: Asset, key: str | None) -> QueuedPartitionEvent:
    return QueuedPartitionEvent(event_id=event_id, asset=asset.name, partition_key=key)


def hour_keys(day: str = "2026-03-10") -> list[str]:
    return [f"{day}T{hour:02d}:00:00" for hour in range(24)]


def test_identity_makes_one_run_per_key_with_its_events() -> None:
    timetable = PartitionedAssetTimetable(assets=ORDERS)
    queued = [event(1, ORDERS, "us"), event(2, ORDERS, "eu"), event(3, ORDERS, "us")]

    plan = plan_partitioned_runs(timetable, queued)

    assert plan.runs == (PartitionRun("eu", (2,)), PartitionRun("us", (1, 3)))
    assert plan.waiting == ()
    assert plan.refused == ()


def test_an_event_without_a_key_is_refused_with_the_reason() -> None:
    timetable = PartitionedAssetTimetable(assets=ORDERS)

    plan = plan_partitioned_runs(timetable, [event(7, ORDERS, None), event(8, ORDERS, "us")])

    assert plan.runs == (PartitionRun("us", (8,)),)
    (refused,) = plan.refused
    assert refused.event_id == 7
    assert "no partition key" in refused.reason
    assert "'orders'" in refused.reason


def test_an_event_of_an_asset_outside_the_schedule_is_refused() -> None:
    plan = plan_partitioned_runs(PartitionedAssetTimetable(assets=ORDERS), [event(1, PRICES, "us")])
    assert plan.runs == ()
    assert "not in the DAG's partitioned schedule" in plan.refused[0].reason


def test_a_key_the_mapper_refuses_is_refused_with_the_mappers_message() -> None:
    timetable = PartitionedAssetTimetable(
        assets=ORDERS, default_partition_mapper=AllowedKeyMapper(["us", "eu"])
    )

    plan = plan_partitioned_runs(timetable, [event(1, ORDERS, "apac"), event(2, ORDERS, "eu")])

    assert plan.runs == (PartitionRun("eu", (2,)),)
    assert plan.refused[0].event_id == 1
    assert "'apac' is not an allowed key" in plan.refused[0].reason


def test_and_condition_runs_a_key_only_when_both_assets_have_it() -> None:
    timetable = PartitionedAssetTimetable(assets=ORDERS & PRICES)
    queued = [event(1, ORDERS, "us"), event(2, PRICES, "us"), event(3, ORDERS, "eu")]

    plan = plan_partitioned_runs(timetable, queued)

    assert plan.runs == (PartitionRun("us", (1, 2)),)
    (wait,) = plan.waiting
    assert (wait.partition_key, wait.missing, wait.event_ids) == ("eu", ("prices",), (3,))


def test_or_condition_runs_each_key_that_either_asset_has() -> None:
    timetable = PartitionedAssetTimetable(assets=ORDERS | PRICES)
    queued = [event(1, ORDERS, "us"), event(2, PRICES, "eu")]

    plan = plan_partitioned_runs(timetable, queued)

    assert plan.runs == (PartitionRun("eu", (2,)), PartitionRun("us", (1,)))


def test_mixed_condition_is_met_per_key() -> None:
    timetable = PartitionedAssetTimetable(assets=(ORDERS | PRICES) & HOURLY)
    queued = [event(1, ORDERS, "k1"), event(2, HOURLY, "k1"), event(3, PRICES, "k2")]

    plan = plan_partitioned_runs(timetable, queued)

    assert plan.runs == (PartitionRun("k1", (1, 2)),)
    assert plan.waiting[0].partition_key == "k2"
    assert plan.waiting[0].missing == ("orders", "hourly")


def test_rollup_waits_and_names_the_missing_hours() -> None:
    timetable = PartitionedAssetTimetable(assets=HOURLY, default_partition_mapper=DAILY_ROLLUP)
    queued = [event(i, HOURLY, key) for i, key in enumerate(hour_keys()) if i not in (3, 17)]

    plan = plan_partitioned_runs(timetable, queued)

    assert plan.runs == ()
    (wait,) = plan.waiting
    assert wait.partition_key == "2026-03-10"
    assert wait.missing == ("hourly[2026-03-10T03:00:00]", "hourly[2026-03-10T17:00:00]")
    assert len(wait.event_ids) == 22


def test_rollup_runs_once_after_the_24th_hour_with_every_event() -> None:
    timetable = PartitionedAssetTimetable(assets=HOURLY, default_partition_mapper=DAILY_ROLLUP)
    queued = [event(i, HOURLY, key) for i, key in enumerate(hour_keys())]

    plan = plan_partitioned_runs(timetable, queued)

    assert plan.runs == (PartitionRun("2026-03-10", tuple(range(24))),)
    assert plan.waiting == ()


def test_rollup_with_minimum_count_runs_on_enough_hours() -> None:
    mapper = RollupMapper(
        upstream_mapper=StartOfDayMapper(), window=DayWindow(), wait_policy=MinimumCount(-2)
    )
    timetable = PartitionedAssetTimetable(assets=HOURLY, default_partition_mapper=mapper)
    queued = [event(i, HOURLY, key) for i, key in enumerate(hour_keys()[:22])]

    assert [run.partition_key for run in plan_partitioned_runs(timetable, queued).runs] == [
        "2026-03-10"
    ]
    assert plan_partitioned_runs(timetable, queued[:21]).runs == ()


def test_rollup_and_identity_assets_together() -> None:
    timetable = PartitionedAssetTimetable(
        assets=HOURLY & ORDERS,
        partition_mapper_config={HOURLY: DAILY_ROLLUP},
        default_partition_mapper=IdentityMapper(),
    )
    hours = [event(i, HOURLY, key) for i, key in enumerate(hour_keys())]

    waiting = plan_partitioned_runs(timetable, hours)
    ready = plan_partitioned_runs(timetable, [*hours, event(99, ORDERS, "2026-03-10")])

    assert waiting.waiting[0].missing == ("orders",)
    assert ready.runs == (PartitionRun("2026-03-10", (*range(24), 99)),)


def test_a_rollup_refuses_a_key_outside_its_window() -> None:
    timetable = PartitionedAssetTimetable(assets=HOURLY, default_partition_mapper=DAILY_ROLLUP)

    plan = plan_partitioned_runs(timetable, [event(1, HOURLY, "2026-03-10T09:30:00")])

    assert plan.runs == plan.waiting == ()
    assert "'2026-03-10T09:30:00' is not one of the upstream keys" in plan.refused[0].reason


@given(st.permutations(range(24)), st.integers(min_value=0, max_value=23))
def test_rollup_runs_exactly_when_the_last_hour_arrives(order: list[int], cut: int) -> None:
    timetable = PartitionedAssetTimetable(assets=HOURLY, default_partition_mapper=DAILY_ROLLUP)
    keys = hour_keys()
    arrived = [event(i, HOURLY, keys[i]) for i in order[:cut]]
    assert plan_partitioned_runs(timetable, arrived).runs == ()
    everything = [*arrived, *(event(i, HOURLY, keys[i]) for i in order[cut:])]
    assert [run.partition_key for run in plan_partitioned_runs(timetable, everything).runs] == [
        "2026-03-10"
    ]


# --- the timetable ---------------------------------------------------------------------------


def test_mapper_for_gives_the_configured_or_the_default_mapper() -> None:
    timetable = PartitionedAssetTimetable(
        assets=[HOURLY, ORDERS], partition_mapper_config={HOURLY: DAILY_ROLLUP}
    )
    assert timetable.mapper_for("hourly") == DAILY_ROLLUP
    assert timetable.mapper_for("orders") == IdentityMapper()


def test_config_naming_an_asset_outside_the_condition_is_refused() -> None:
    with pytest.raises(DagDefinitionError, match="'prices', which is not in the timetable"):
        PartitionedAssetTimetable(assets=ORDERS, partition_mapper_config={PRICES: IdentityMapper()})


def test_a_mapper_that_is_not_a_mapper_is_refused() -> None:
    with pytest.raises(DagDefinitionError, match="default_partition_mapper must be a partition"):
        PartitionedAssetTimetable(assets=ORDERS, default_partition_mapper="identity")  # type: ignore[arg-type]


def test_the_dag_schedule_gets_the_timetable_and_its_condition() -> None:
    timetable = PartitionedAssetTimetable(assets=ORDERS & PRICES)
    assert resolve_schedule(timetable, timezone=timezone_of("UTC"), where="x") == (
        timetable,
        timetable.asset_condition,
    )
    dag = DAG("partitioned_consumer", schedule=timetable)
    assert dag.timetable is timetable
    assert dag.schedule == ORDERS & PRICES


def test_the_timetable_makes_no_time_runs() -> None:
    timetable = PartitionedAssetTimetable(assets=ORDERS)
    now = datetime(2026, 3, 10, tzinfo=UTC)
    restriction = TimeRestriction(earliest=None, latest=None, catchup=True)
    assert (
        timetable.next_dagrun_info(
            last_automated_data_interval=None, restriction=restriction, now=now
        )
        is None
    )
    assert timetable.runs_between(now, now, restriction=restriction) == []


def test_the_timetable_round_trips_through_the_stored_json() -> None:
    timetable = PartitionedAssetTimetable(
        assets=HOURLY & (ORDERS | PRICES),
        partition_mapper_config={HOURLY: DAILY_ROLLUP, ORDERS | PRICES: StartOfDayMapper()},
        default_partition_mapper=AllowedKeyMapper(["a"]),
    )
    stored = json.loads(json.dumps(timetable.serialize()))
    back = timetable_from_json(stored)
    assert back == timetable
    assert isinstance(back, PartitionedAssetTimetable)
    assert back.mapper_for("prices") == StartOfDayMapper()
    assert back.asset_condition == timetable.asset_condition
