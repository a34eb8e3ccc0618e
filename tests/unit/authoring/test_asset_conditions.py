"""Asset conditions: truth tables for &, |, nesting and lists; JSON round trips."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import DAG, Asset, AssetAll, AssetAny, BaseAsset, DagDefinitionError

A, B, C = Asset("a"), Asset("b"), Asset("c")
NAMES = ("a", "b", "c")
ALL_UPDATES = [frozenset(combo) for n in range(4) for combo in itertools.combinations(NAMES, n)]


@pytest.mark.parametrize(
    ("updated", "expected_and", "expected_or"),
    [
        (set(), False, False),
        ({"a"}, False, True),
        ({"b"}, False, True),
        ({"a", "b"}, True, True),
        ({"c"}, False, False),
    ],
)
def test_truth_table_of_and_or(updated: set[str], expected_and: bool, expected_or: bool) -> None:
    assert (A & B).evaluate(updated) is expected_and
    assert (A | B).evaluate(updated) is expected_or


@pytest.mark.parametrize("updated", ALL_UPDATES)
def test_nesting(updated: frozenset[str]) -> None:
    a, b, c = ("a" in updated), ("b" in updated), ("c" in updated)
    assert (A & (B | C)).evaluate(updated) is (a and (b or c))
    assert ((A & B) | C).evaluate(updated) is ((a and b) or c)
    assert AssetAny(AssetAll(A, B), AssetAll(B, C)).evaluate(updated) is ((a and b) or (b and c))


@pytest.mark.parametrize("updated", ALL_UPDATES)
def test_a_list_schedule_means_all(updated: frozenset[str]) -> None:
    dag = DAG("list_schedule", schedule=[A, B, C], auto_register=False)
    assert dag.schedule is not None
    assert dag.schedule.evaluate(updated) is (set(NAMES) <= updated)


def test_single_asset_and_single_item_list() -> None:
    assert A.evaluate({"a"}) and not A.evaluate({"b"})
    dag = DAG("single", schedule=[A], auto_register=False)
    assert dag.schedule == A


def test_chains_are_flattened() -> None:
    assert A & B & C == AssetAll(A, B, C)
    assert A | B | C == AssetAny(A, B, C)
    assert (A & B) | C == AssetAny(AssetAll(A, B), C)


def test_asset_names_are_distinct_and_ordered() -> None:
    assert ((A & B) | (B & C)).asset_names() == ["a", "b", "c"]


def test_json_round_trip() -> None:
    condition = (A & Asset("b", uri="s3://bucket/b")) | C
    data = condition.to_json()
    assert data == {
        "__type": "asset_any",
        "objects": [
            {
                "__type": "asset_all",
                "objects": [
                    {"__type": "asset", "name": "a", "uri": "a"},
                    {"__type": "asset", "name": "b", "uri": "s3://bucket/b"},
                ],
            },
            {"__type": "asset", "name": "c", "uri": "c"},
        ],
    }
    assert BaseAsset.from_json(data) == condition


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {"__type": "cron"},
        {"__type": "asset", "name": 1, "uri": "x"},
        {"__type": "asset_all", "objects": []},
        {"__type": "asset_any", "objects": "a"},
    ],
)
def test_from_json_refuses_bad_data(data: object) -> None:
    with pytest.raises(ValueError, match="asset"):
        BaseAsset.from_json(data)


@pytest.mark.parametrize("bad", [[], "not a cron", 5])
def test_invalid_schedules_are_refused(bad: object) -> None:
    with pytest.raises(DagDefinitionError, match="schedule"):
        DAG("bad_schedule", schedule=bad, auto_register=False)  # type: ignore[arg-type]


def test_conditions_take_only_assets() -> None:
    with pytest.raises(DagDefinitionError, match="at least one"):
        AssetAll()
    with pytest.raises(DagDefinitionError, match="takes assets"):
        AssetAny(A, "b")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        A & "b"  # type: ignore[operator]


# --- property: evaluation matches a reference, and survives the JSON round trip ---------

leaves = st.sampled_from(NAMES).map(Asset)
conditions = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3).map(lambda xs: AssetAll(*xs)),
        st.lists(children, min_size=1, max_size=3).map(lambda xs: AssetAny(*xs)),
        st.tuples(children, children).map(lambda ab: ab[0] & ab[1]),
        st.tuples(children, children).map(lambda ab: ab[0] | ab[1]),
    ),
    max_leaves=8,
)


def reference(data: dict, updated: frozenset[str]) -> bool:
    if data["__type"] == "asset":
        return data["name"] in updated
    results = [reference(item, updated) for item in data["objects"]]
    return all(results) if data["__type"] == "asset_all" else any(results)


@given(conditions, st.sampled_from(ALL_UPDATES))
def test_evaluation_matches_reference_and_json(condition: BaseAsset, updated: frozenset) -> None:
    data = condition.to_json()
    assert condition.evaluate(updated) is reference(data, updated)
    rebuilt = BaseAsset.from_json(data)
    assert rebuilt == condition
    assert rebuilt.evaluate(updated) is condition.evaluate(updated)
