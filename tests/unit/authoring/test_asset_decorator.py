"""``@asset`` / ``@asset.multi`` as a DAG file defines them: the DAG of one task each, the
asset it makes, the inlets its parameters name, what it is usable as, and the refusals."""

from __future__ import annotations

import pytest

from engine import DAG, Asset, AssetAll, asset
from engine.authoring.asset_decorator import AssetDefinition, MultiAssetDefinition
from engine.authoring.dag import take_registered_dags
from engine.authoring.errors import DagDefinitionError
from engine.authoring.timetables import Timetable


@pytest.fixture(autouse=True)
def _registered():
    take_registered_dags()
    yield
    take_registered_dags()


@asset(schedule="@daily", uri="s3://bucket/raw", group="orders", extra={"team": "etl"})
def raw(self, context):
    return self.name


@asset(schedule=raw, tags=["report"], description="The report")
def report(self, raw, limit=3):
    return limit


@asset.multi(schedule=None, outlets=[Asset("left"), Asset("right")])
def sides():
    return None


def test_an_asset_function_is_an_asset_with_a_dag_of_one_task() -> None:
    assert isinstance(raw, AssetDefinition) and isinstance(raw, Asset)
    assert (raw.name, raw.uri, raw.group, raw.extra) == (
        "raw",
        "s3://bucket/raw",
        "orders",
        {"team": "etl"},
    )
    dag = raw.dag
    assert dag.dag_id == "raw" and not dag.catchup
    assert isinstance(dag.timetable, Timetable)
    (only,) = dag.tasks
    assert only.task_id == "raw"
    assert only.outlets == [raw]
    assert only.inlets == []


def test_parameters_that_name_assets_are_inlets_and_the_decorated_name_schedules() -> None:
    dag = report.dag
    assert dag.schedule == raw  # the upstream @asset, usable in schedule=
    assert list(dag.tags) == ["report"]
    assert dag.description == "The report"
    (only,) = dag.tasks
    assert only.inlets == [raw]  # found in the module: its uri is the real one
    assert only.asset_inlets == {"raw": raw}  # limit has a default: not an asset


def test_a_multi_asset_function_updates_every_outlet_and_is_their_all_condition() -> None:
    assert isinstance(sides, MultiAssetDefinition) and isinstance(sides, AssetAll)
    assert sides.asset_names() == ["left", "right"]
    (only,) = sides.dag.tasks
    assert sides.dag.dag_id == "sides"
    assert [a.name for a in only.outlets] == ["left", "right"]
    with DAG("waits", schedule=sides) as waiting:
        pass
    assert waiting.schedule == sides


def _downstream(elsewhere):
    return elsewhere


def test_an_unknown_parameter_name_is_an_asset_of_that_name() -> None:
    downstream = asset(schedule=None, name="downstream")(_downstream)
    assert downstream.name == "downstream" and downstream.dag.dag_id == "downstream"
    (only,) = downstream.dag.tasks
    assert only.task_id == "_downstream"
    assert only.inlets == [Asset("elsewhere")]


def test_the_arguments_of_the_task_run_the_function_as_airflow_passes_them() -> None:
    (only,) = report.dag.tasks
    values = only._arguments({"outlet_events": "events"})
    assert values == {"self": report, "raw": raw, "limit": 3}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(*args): ...", r"\*args is not supported"),
        ("def f(**kwargs): ...", r"\*\*kwargs is not supported"),
        ("def f(x, /): ...", "positional-only parameter 'x' needs a default"),
    ],
)
def test_wildcards_and_positional_only_parameters_are_refused(source: str, message: str) -> None:
    names: dict[str, object] = {}
    exec(source, names)
    with pytest.raises(DagDefinitionError, match=message):
        asset(schedule=None)(names["f"])  # type: ignore[arg-type]


def test_nested_functions_unknown_arguments_and_bad_outlets_are_refused() -> None:
    def nested(): ...

    with pytest.raises(DagDefinitionError, match="nested functions are not supported"):
        asset(schedule=None)(nested)
    with pytest.raises(DagDefinitionError, match=r"unknown arguments \['catchup'\]"):
        asset(schedule=None, catchup=True)
    with pytest.raises(DagDefinitionError, match="needs outlets"):
        asset.multi(schedule=None, outlets=[])
    with pytest.raises(DagDefinitionError, match="'self' names one asset"):
        asset.multi(schedule=None, outlets=[Asset("x")])(_uses_self)


def _uses_self(self): ...
