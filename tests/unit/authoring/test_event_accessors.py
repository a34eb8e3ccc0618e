"""Airflow's accessor methods on a running task's context: ``inlet_events.for_asset(name=,
uri=)`` / ``for_asset_alias(name=)`` (in code and in templates, as Airflow's
``example_inlet_event_extra`` uses them), ``outlet_events.for_asset(...)``, and
``task.render_template(content, context)`` (``tutorial_taskflow_templates``)."""

from __future__ import annotations

from typing import Any

import pytest

from engine import Asset, AssetAlias
from engine.authoring.dag import take_registered_dags
from engine.execution.context import hydrate_context
from engine.execution.outlets import collect_outlet_events
from tests.unit.authoring.test_runtime_context import (  # the same context and operator
    ORDERS,
    REPORT,
    build,
    event,
    raw_context,
)

BY_DAY = AssetAlias("orders_by_day")


@pytest.fixture(autouse=True)
def _clean_registry():
    take_registered_dags()
    yield
    take_registered_dags()


def _context(**operator_kwargs: Any) -> dict[str, Any]:
    op = build(**operator_kwargs)
    raw = raw_context(
        inlet_events={
            "orders": [event(id=1), event(id=2, extra={"hi": "bye"})],
            "orders_by_day": [event(id=3, asset="s3://bucket/2026-03-08")],
        }
    )
    return hydrate_context(raw, op)


def test_inlet_events_for_asset_by_name_uri_or_both() -> None:
    inlets = _context(inlets=[ORDERS, REPORT, BY_DAY])["inlet_events"]
    by_uri = inlets.for_asset(uri="s3://bucket/orders")
    assert [e.id for e in by_uri] == [1, 2]
    assert inlets.for_asset(name="orders") == by_uri
    assert inlets.for_asset(name="orders", uri="s3://bucket/orders") == by_uri
    assert inlets.for_asset(name="report") == []  # a declared inlet without events
    assert [e.id for e in inlets.for_asset_alias(name="orders_by_day")] == [3]


def test_inlet_events_for_asset_refuses_what_is_not_an_inlet() -> None:
    inlets = _context(inlets=[ORDERS])["inlet_events"]
    with pytest.raises(KeyError, match="no inlet asset has the URI 's3://elsewhere'"):
        inlets.for_asset(uri="s3://elsewhere")
    with pytest.raises(KeyError, match="no inlet asset named 'report' has the URI"):
        inlets.for_asset(name="report", uri="s3://bucket/orders")
    with pytest.raises(TypeError, match="needs name= or uri="):
        inlets.for_asset()


def test_a_template_reads_inlet_events_for_asset() -> None:
    context = _context(inlets=[ORDERS])
    task = context["task"]
    template = "{{ inlet_events.for_asset(uri='s3://bucket/orders')[-1].extra | tojson }}"
    assert task.render_template(template, context) == '{"hi": "bye"}'


def test_outlet_events_for_asset_sets_that_outlets_extra() -> None:
    context = _context(outlets=[ORDERS, BY_DAY])
    context["outlet_events"].for_asset(uri="s3://bucket/orders").extra = {"rows": 4}
    context["outlet_events"].for_asset_alias(name="orders_by_day").add(Asset("s3://b/d"))
    events = collect_outlet_events(context, context["task"])
    assert [(e["asset"], e["extra"], e["alias"]) for e in events] == [
        ("orders", {"rows": 4}, None),
        ("s3://b/d", {}, "orders_by_day"),
    ]
    with pytest.raises(KeyError, match="matches none of its outlet assets"):
        context["outlet_events"].for_asset(name="report")


def test_render_template_renders_with_the_tasks_context() -> None:
    context = _context(params={"tag": "b"})
    task = context["task"]
    rendered = task.render_template(["{{ run_id }}", {"p": "{{ params.tag }}"}], context)
    assert rendered == ["scheduled__2026-03-08", {"p": "b"}]
    with pytest.raises(TypeError, match="jinja_env= is not supported"):
        task.render_template("{{ run_id }}", context, jinja_env=object())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="needs the context of a running task"):
        task.render_template("{{ run_id }}", {})  # type: ignore[arg-type]
