"""``Asset.ref(name=...)``: a reference to an asset declared in another DAG file, met by that
asset's updates, declaring nothing, stored as JSON, usable in partitioned timetables."""

from __future__ import annotations

import json

import pytest

from engine import DAG, Asset, AssetAlias, BaseAsset, DagDefinitionError, EmptyOperator
from engine.authoring.assets import AssetNameRef
from engine.authoring.partition_temporal import StartOfDayMapper
from engine.authoring.partition_timetables import PartitionedAssetTimetable
from engine.authoring.schedules import timetable_from_json
from engine.views.dags import condition_text

STATS = Asset.ref(name="team_b_player_stats")


def test_a_name_ref_is_met_by_the_update_of_the_asset_of_that_name() -> None:
    assert isinstance(STATS, AssetNameRef)
    assert STATS.evaluate({"team_b_player_stats"}) is True
    assert STATS.evaluate({"other"}) is False
    assert STATS.evaluate(set(), {"team_b_player_stats"}) is False  # not an alias
    both, either = Asset("a") & STATS, STATS | Asset("a")
    assert both.evaluate({"a"}) is False
    assert both.evaluate({"a", "team_b_player_stats"}) is True
    assert either.evaluate({"team_b_player_stats"}) is True


def test_a_ref_is_named_by_the_condition_but_declares_nothing() -> None:
    condition = Asset("a", "s3://a") & (STATS | AssetAlias("al"))
    assert condition.asset_names() == ["a", "team_b_player_stats"]
    assert list(condition.iter_assets()) == [Asset("a", "s3://a")]
    assert condition.alias_names() == ["al"]


def test_refs_compare_by_name_and_differ_from_the_asset() -> None:
    assert Asset.ref(name="x") == AssetNameRef("x")
    assert len({Asset.ref(name="x"), Asset.ref(name="x"), Asset.ref(name="y")}) == 2
    assert Asset.ref(name="x") != Asset("x")
    assert repr(Asset.ref(name="x")) == "AssetNameRef(name='x')"


def test_json_round_trip_keeps_the_ref_a_ref() -> None:
    condition = Asset("a") & (STATS | Asset.ref(name="c"))
    data = json.loads(json.dumps(condition.to_json()))
    assert data["objects"][1]["objects"][0] == {
        "__type": "asset_name_ref",
        "name": "team_b_player_stats",
    }
    back = BaseAsset.from_json(data)
    assert back == condition
    assert condition_text(data) == "a & (team_b_player_stats | c)"
    assert list(back.iter_assets()) == [Asset("a")]


@pytest.mark.parametrize(
    "data", [{"__type": "asset_name_ref"}, {"__type": "asset_name_ref", "name": 3}]
)
def test_bad_stored_refs_are_refused(data: object) -> None:
    with pytest.raises(ValueError, match="asset_name_ref needs a string name"):
        BaseAsset.from_json(data)


def test_bad_refs_are_refused_naming_the_file() -> None:
    with pytest.raises(DagDefinitionError, match=r"test_asset_refs\.py.*Asset\.ref name"):
        Asset.ref()
    with pytest.raises(DagDefinitionError, match=r"Asset\.ref\(uri='s3://x'\) is not supported"):
        Asset.ref(uri="s3://x")


def test_a_dag_is_scheduled_on_a_ref() -> None:
    with DAG("consumer", schedule=[Asset("a"), STATS]) as dag:
        EmptyOperator(task_id="t")
    assert dag.schedule is not None
    assert dag.schedule.asset_names() == ["a", "team_b_player_stats"]


def test_refs_are_not_inlets_or_outlets() -> None:
    with DAG("d"), pytest.raises(DagDefinitionError, match="outlets takes Asset and AssetAlias"):
        EmptyOperator(task_id="t", outlets=[STATS])


def test_a_ref_keys_a_partition_mapper_and_survives_the_stored_json() -> None:
    timetable = PartitionedAssetTimetable(
        assets=Asset("team_a_player_stats") & STATS,
        partition_mapper_config={STATS: StartOfDayMapper()},
    )
    assert timetable.mapper_for("team_b_player_stats") == StartOfDayMapper()
    back = timetable_from_json(json.loads(json.dumps(timetable.serialize())))
    assert back == timetable
    assert isinstance(back, PartitionedAssetTimetable)
    assert back.mapper_for("team_b_player_stats") == StartOfDayMapper()
    assert list(back.asset_condition.iter_assets()) == [Asset("team_a_player_stats")]


def test_a_mapper_key_ref_must_be_in_the_condition() -> None:
    with pytest.raises(DagDefinitionError, match="names asset 'elsewhere', which is not in"):
        PartitionedAssetTimetable(
            assets=STATS, partition_mapper_config={Asset.ref(name="elsewhere"): StartOfDayMapper()}
        )
