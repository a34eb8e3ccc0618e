"""What a running task sees (hydrate_context, name injection) and the asset events it reports
(collect_outlet_events, Metadata, aliases)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pendulum
import pytest

from engine import (
    DAG,
    Asset,
    AssetAlias,
    AssetAll,
    BaseAsset,
    Metadata,
    Param,
    PythonOperator,
    task,
)
from engine.authoring.dag import take_registered_dags
from engine.exceptions import ParamValidationError
from engine.execution.context import AssetEvent, DagRun, hydrate_context
from engine.execution.outlets import collect_outlet_events
from engine.execution.results import RuntimeTaskInstance

ORDERS = Asset("orders", uri="s3://bucket/orders")
REPORT = Asset("report")
BY_DAY = AssetAlias("orders_by_day")
LOGICAL = datetime(2026, 3, 8, 7, 30, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _clean_registry():
    take_registered_dags()
    yield
    take_registered_dags()


def raw_context(**overrides: Any) -> dict[str, Any]:
    run = {
        "run_id": "scheduled__2026-03-08",
        "run_type": "scheduled",
        "logical_date": LOGICAL,
        "data_interval_start": LOGICAL,
        "data_interval_end": LOGICAL,
        "run_after": LOGICAL,
        "conf": {"limit": 3},
        "queued_at": datetime(2026, 3, 8, 7, 30, 1, tzinfo=UTC),
        "start_date": None,
    }
    raw = {
        "dag_id": "ctx",
        "task_id": "work",
        "run_id": run["run_id"],
        "try_number": 2,
        "map_index": -1,
        "default_deferrable": False,
        "triggering_asset_events": {},
        "inlet_events": {},
        "run": run,
    }
    return {**raw, **overrides}


def event(**fields: Any) -> dict[str, Any]:
    return {
        "id": 7,
        "asset": "orders",
        "uri": "s3://bucket/orders",
        "extra": {"rows": 10},
        "payload": None,
        "timestamp": datetime(2026, 3, 8, 6, tzinfo=UTC),
        "source": "task",
        "source_dag_id": "producer",
        "source_run_id": "r1",
        "source_task_id": "load",
        "source_try_number": 1,
        **fields,
    }


def build(**operator_kwargs: Any) -> PythonOperator:
    with DAG("ctx", params={"limit": Param(10, type="integer", minimum=1), "tag": "a"}):
        return PythonOperator(task_id="work", python_callable=lambda: None, **operator_kwargs)


# --- hydrate_context ----------------------------------------------------------------------------


def test_hydrate_context_gives_airflow_keys_with_pendulum_datetimes() -> None:
    op = build(params={"tag": "b"})
    context = hydrate_context(raw_context(), op)
    assert context["task"] is op and context["dag"] is op.dag
    assert isinstance(context["logical_date"], pendulum.DateTime)
    assert context["logical_date"] == LOGICAL and context["logical_date"].timezone_name == "UTC"
    assert (context["ds"], context["ds_nodash"]) == ("2026-03-08", "20260308")
    assert context["ts"] == "2026-03-08T07:30:00+00:00"
    assert context["task_instance_key_str"] == "ctx__work__20260308"  # a @task may take it
    assert (context["ts_nodash"], context["ts_nodash_with_tz"]) == (
        "20260308T073000",
        "20260308T073000+0000",
    )
    assert context["params"] == {"limit": 3, "tag": "b"}  # DAG < task < conf
    run = context["dag_run"]
    assert isinstance(run, DagRun) and run.dag_id == "ctx" and run.run_type == "scheduled"
    assert run.conf == {"limit": 3} and isinstance(run.queued_at, pendulum.DateTime)
    assert run.start_date is None
    for key in ("data_interval_start", "data_interval_end", "run_after"):
        assert isinstance(context[key], pendulum.DateTime)
    ti = context["ti"]
    assert isinstance(ti, RuntimeTaskInstance) and context["task_instance"] is ti
    assert (ti.dag_id, ti.task_id, ti.run_id, ti.try_number, ti.map_index) == (
        "ctx",
        "work",
        "scheduled__2026-03-08",
        2,
        -1,
    )
    ti.xcom_push("k", 1)  # results: tests/unit/authoring/test_xcom.py
    assert ti.xcom_pull(key="k") == 1 and ti.xcom_pull(task_ids="x") is None
    assert context["default_deferrable"] is False  # raw keys stay


def test_a_run_without_logical_date_has_no_date_strings() -> None:
    raw = raw_context()
    raw["run"] = {**raw["run"], "logical_date": None, "conf": None}
    context = hydrate_context(raw, build())
    assert context["logical_date"] is None
    assert all(context[key] is None for key in ("ds", "ds_nodash", "ts", "ts_nodash"))
    assert "task_instance_key_str" not in context
    assert context["dag_run"].conf == {} and context["params"] == {"limit": 10, "tag": "a"}


def test_a_conf_value_that_fails_its_param_fails_the_task() -> None:
    raw = raw_context()
    raw["run"] = {**raw["run"], "conf": {"limit": 0, "extra": "kept"}}
    with pytest.raises(ParamValidationError, match=r"param 'limit'.*less than the minimum 1"):
        hydrate_context(raw, build())
    raw["run"] = {**raw["run"], "conf": {"extra": "kept"}}
    assert hydrate_context(raw, build())["params"]["extra"] == "kept"


def test_asset_events_read_by_name_asset_item_and_attribute() -> None:
    raw = raw_context(triggering_asset_events={"orders": [event(), event(id=8, extra=None)]})
    events = hydrate_context(raw, build())["triggering_asset_events"]
    first = events[ORDERS][0]
    assert isinstance(first, AssetEvent) and events["orders"] == events[ORDERS]
    assert (first.extra, first["extra"], first.asset.name, first.asset.uri) == (
        {"rows": 10},
        {"rows": 10},
        "orders",
        "s3://bucket/orders",
    )
    assert (first.source_dag_id, first["source_task_id"], first.created_by) == (
        "producer",
        "load",
        None,
    )
    assert isinstance(first.timestamp, pendulum.DateTime)
    assert events[ORDERS][1].extra == {}
    assert ORDERS in events and REPORT not in events and events.get(REPORT, []) == []
    assert sorted(events) == ["orders"]
    with pytest.raises(AttributeError):
        _ = first.no_such_field
    with pytest.raises(KeyError):
        events[REPORT]


def test_inlet_events_of_a_declared_inlet_without_events_are_empty() -> None:
    op = build(inlets=[ORDERS, REPORT])
    raw = raw_context(inlet_events={"orders": [event(id=1), event(id=2)]})
    inlets = hydrate_context(raw, op)["inlet_events"]
    assert [e.id for e in inlets[ORDERS]] == [1, 2]
    assert inlets[REPORT] == [] and inlets["report"] == []
    with pytest.raises(KeyError, match="not one of its inlets"):
        inlets[Asset("elsewhere")]


def test_an_old_style_event_dict_still_reads() -> None:
    old = {"id": 1, "payload": {"k": 1}, "timestamp": LOGICAL, "source_watcher": "w"}
    raw = raw_context(triggering_asset_events={"flag": [old]})
    (view,) = hydrate_context(raw, build())["triggering_asset_events"]["flag"]
    assert (view["payload"], view.asset.name, view.uri, view.source) == (
        {"k": 1},
        "flag",
        "flag",
        None,
    )


# --- name injection -------------------------------------------------------------------------------


def test_a_task_gets_the_context_values_it_names() -> None:
    seen: dict[str, Any] = {}

    @task(outlets=[ORDERS])
    def named(ti, dag_run, params, ds, logical_date, outlet_events, own=1) -> str:
        seen.update(ti=ti, dag_run=dag_run, params=params, logical_date=logical_date, own=own)
        outlet_events[ORDERS].extra["day"] = ds
        return ds

    with DAG("inject", params={"limit": 10}):
        op = named()
    context = hydrate_context(raw_context(), op)
    assert op.execute(context) == "2026-03-08"
    assert seen["ti"] is context["ti"] and seen["dag_run"] is context["dag_run"]
    assert seen["params"] == {"limit": 3} and seen["own"] == 1
    assert seen["logical_date"] == LOGICAL
    assert collect_outlet_events(context, op) == [
        {
            "asset": "orders",
            "uri": "s3://bucket/orders",
            "extra": {"day": "2026-03-08"},
            "alias": None,
            "partition_key": None,
        }
    ]


def test_a_task_with_kwargs_gets_the_whole_context_minus_bound_names() -> None:
    @task
    def everything(ds: str, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        return ds, kwargs

    with DAG("kw"):
        op = everything("mine")
    context = hydrate_context(raw_context(), op)
    ds, kwargs = op.execute(context)
    assert ds == "mine"  # bound by the call, not by the context
    assert "ds" not in kwargs and kwargs["ti"] is context["ti"]
    assert set(context) - set(kwargs) == {"ds"}


def test_op_kwargs_win_over_context_values() -> None:
    op = PythonOperator(
        task_id="p", python_callable=lambda params, ds: (params, ds), op_kwargs={"ds": "given"}
    )
    assert op.execute({"params": {"a": 1}, "ds": "context"}) == ({"a": 1}, "given")


# --- outlet events ------------------------------------------------------------------------------


def test_outlet_extras_alias_additions_and_metadata() -> None:
    def work(outlet_events: Any) -> Any:
        outlet_events[ORDERS].extra = {"rows": 5}
        outlet_events[BY_DAY].add(Asset("s3://bucket/2026-03-08"), extra={"day": 8})
        outlet_events["orders_by_day"].add(Asset("s3://bucket/2026-03-08"), extra={"day": 8})
        yield Metadata(REPORT, {"pages": 2})
        yield Metadata("orders", {"checked": True})
        yield "not metadata"  # ignored with a warning, as in Airflow
        yield Metadata(Asset("s3://bucket/2026-03-09"), {"day": 9}, alias=BY_DAY)
        return "done"

    op = build(outlets=[ORDERS, REPORT, BY_DAY])
    op.python_callable = work
    context = hydrate_context(raw_context(), op)
    assert op.execute(context) == "done"
    assert collect_outlet_events(context, op) == [
        {
            "asset": "orders",
            "uri": "s3://bucket/orders",
            "extra": {"rows": 5, "checked": True},
            "alias": None,
            "partition_key": None,
        },
        {
            "asset": "report",
            "uri": "report",
            "extra": {"pages": 2},
            "alias": None,
            "partition_key": None,
        },
        {
            "asset": "s3://bucket/2026-03-08",
            "uri": "s3://bucket/2026-03-08",
            "extra": {"day": 8},
            "alias": "orders_by_day",
            "partition_key": None,
        },
        {
            "asset": "s3://bucket/2026-03-09",
            "uri": "s3://bucket/2026-03-09",
            "extra": {"day": 9},
            "alias": "orders_by_day",
            "partition_key": None,
        },
    ]


def test_returned_metadata_sets_the_extra_and_the_result_is_none() -> None:
    op = build(outlets=[ORDERS])
    op.python_callable = lambda: Metadata(ORDERS, {"rows": 1})
    context = hydrate_context(raw_context(), op)
    assert op.execute(context) is None
    assert collect_outlet_events(context, op)[0]["extra"] == {"rows": 1}


def test_metadata_returned_by_a_custom_execute_is_collected() -> None:
    op = build(outlets=[ORDERS, BY_DAY])
    context = hydrate_context(raw_context(), op)
    returned = [Metadata(ORDERS, {"a": 1}), Metadata("x", {"b": 2}, alias="orders_by_day")]
    events = collect_outlet_events(context, op, returned)
    assert [(e["asset"], e["extra"], e["alias"]) for e in events] == [
        ("orders", {"a": 1}, None),
        ("x", {"b": 2}, "orders_by_day"),
    ]


def test_defaults_aliases_without_additions_and_plain_contexts() -> None:
    op = build(outlets=[ORDERS, BY_DAY])
    assert collect_outlet_events({}, op) == [
        {
            "asset": "orders",
            "uri": "s3://bucket/orders",
            "extra": {},
            "alias": None,
            "partition_key": None,
        }
    ]
    assert collect_outlet_events({}, build()) == []


def test_outlet_event_errors_name_the_task_and_the_asset() -> None:
    op = build(outlets=[ORDERS])
    context = hydrate_context(raw_context(), op)
    context["outlet_events"][ORDERS].extra = {"when": datetime(2026, 1, 1)}
    with pytest.raises(TypeError, match=r"task 'work'.*asset 'orders' is not JSON"):
        collect_outlet_events(context, op)
    context["outlet_events"][ORDERS].extra = {"x": math.nan}
    with pytest.raises(TypeError, match="asset 'orders' is not JSON"):
        collect_outlet_events(context, op)
    with pytest.raises(TypeError, match=r"outlet_events\[.*'orders'.*\]\.extra must be a dict"):
        context["outlet_events"][ORDERS].extra = ["not", "a", "dict"]
    context["outlet_events"][ORDERS].extra = {1: "int key"}
    with pytest.raises(TypeError, match="must have string keys"):
        collect_outlet_events(context, op)
    context["outlet_events"][ORDERS].extra = {}
    with pytest.raises(ValueError, match="AssetAlias 'elsewhere' is not in its outlets"):
        context["outlet_events"][AssetAlias("elsewhere")].add(REPORT)
    with pytest.raises(TypeError, match="add\\(\\) attaches events through an AssetAlias"):
        context["outlet_events"][ORDERS].add(REPORT)
    with pytest.raises(ValueError, match="AssetAlias 'undeclared' is not in its outlets"):
        collect_outlet_events(context, op, Metadata(ORDERS, {}, alias="undeclared"))


# --- aliases in conditions ---------------------------------------------------------------------


def test_asset_alias_in_conditions_and_json() -> None:
    condition = ORDERS & BY_DAY
    assert not condition.evaluate({"orders"})
    assert condition.evaluate({"orders"}, aliases={"orders_by_day"})
    assert BY_DAY.evaluate(set(), frozenset({"orders_by_day"}))
    assert condition.asset_names() == ["orders"] and condition.alias_names() == ["orders_by_day"]
    assert list(BY_DAY.iter_assets()) == [] and list(ORDERS.iter_aliases()) == []
    data = condition.to_json()
    assert data["objects"][1] == {"__type": "asset_alias", "name": "orders_by_day"}
    assert BaseAsset.from_json(data) == AssetAll(Asset("orders", uri="s3://bucket/orders"), BY_DAY)
    dag = DAG("on_alias", schedule=[BY_DAY], auto_register=False)
    assert dag.schedule == BY_DAY and dag.timetable is None


def test_asset_takes_airflow_arguments() -> None:
    by_uri = Asset(uri="s3://bucket/x", group="raw")
    assert (by_uri.name, by_uri.uri, by_uri.group) == ("s3://bucket/x", "s3://bucket/x", "raw")
    assert Asset("n").group == "asset"
    assert Metadata("a", {"k": 1}) == Metadata(Asset("a"), {"k": 1})
    with pytest.raises(TypeError, match="Metadata extra must be a dict"):
        Metadata("a", ["k"])  # type: ignore[arg-type]


def test_without_pendulum_datetimes_are_aware_stdlib_ones(monkeypatch) -> None:
    from engine.authoring import context as runtime_context

    monkeypatch.setattr(runtime_context, "_pendulum", lambda: None)
    moment = runtime_context.as_moment(datetime(2026, 1, 1, 12))  # naive: read as UTC
    assert type(moment) is datetime and moment == datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert runtime_context.as_moment("2026-01-01T13:00:00+01:00") == moment
    with pytest.raises(TypeError, match="expected a datetime"):
        runtime_context.as_moment(12)
