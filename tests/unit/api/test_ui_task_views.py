"""The pure parts of the task graph, Gantt and trigger-form pages: groups found in task
ids and folded, edge labels placed, a folded group's state, bars on a time axis, and the
params form read back into values with a problem per field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.api.ui import params_form
from engine.api.ui.gantt import CHART_WIDTH, MIN_BAR_PX, chart, ticks
from engine.api.ui.task_graph import GraphTask, build, folded_into, group_state, groups_of
from engine.authoring.params import Param, param_spec

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def task(task_id: str, *downstream: str, labels: dict[str, str] | None = None) -> GraphTask:
    return GraphTask(task_id, "PythonOperator", downstream, labels or {})


TASKS = [
    task("start", "load.stage", "skip", labels={"load.stage": "go on", "skip": "stop"}),
    task("skip"),
    task("load.stage", "load.inner.publish"),
    task("load.inner.publish", "end"),
    task("end"),
]


def draw(folded: set[str], states: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return build(
        TASKS,
        folded=folded,
        states=states or {},
        task_href=lambda t: f"/t/{t}",
        group_href=lambda g: f"/g/{g}",
    )


def test_groups_are_the_dotted_prefixes_of_task_ids() -> None:
    ids = [t.task_id for t in TASKS]
    assert groups_of(ids) == {
        "load": ["load.stage", "load.inner.publish"],
        "load.inner": ["load.inner.publish"],
    }
    assert folded_into("load.inner.publish", {"load.inner", "load"}) == "load"
    assert folded_into("load.inner.publish", {"load.inner"}) == "load.inner"
    assert folded_into("start", {"load"}) is None


def test_unfolded_every_task_is_a_node_and_labels_sit_on_their_edges() -> None:
    graph = draw(set(), {"start": "success"})
    assert set(graph.drawn.items) == {t.task_id for t in TASKS}
    assert graph.states["start"] == "success" and graph.states["skip"] is None
    placed = {(e.source, e.target): e for e in graph.drawn.layout.edges}
    labels = {(lb.source, lb.target): lb for lb in graph.labels}
    assert set(labels) == {("start", "load.stage"), ("start", "skip")}
    go_on = labels["start", "load.stage"]
    (x0, _), (x1, _) = placed["start", "load.stage"].points[:2]
    assert go_on.text == "go on" and x0 < go_on.x < x1
    assert [(g.group_id, g.folded) for g in graph.groups] == [
        ("load", False),
        ("load.inner", False),
    ]


def test_a_folded_group_is_one_node_linked_to_unfold_with_the_edges_merged() -> None:
    graph = draw({"load"}, {"load.stage": "success", "load.inner.publish": "failed"})
    assert set(graph.drawn.items) == {"start", "skip", "load", "end"}
    node = graph.drawn.items["load"]
    assert node.kind == "group" and node.href == "/g/load" and "2 tasks" in node.label
    assert graph.states["load"] == "failed"
    edges = {(e.source, e.target) for e in graph.drawn.edges}
    assert edges == {("start", "load"), ("start", "skip"), ("load", "end")}
    assert {(lb.source, lb.target, lb.text) for lb in graph.labels} >= {("start", "load", "go on")}
    # a group inside a folded one is not offered on its own
    assert [(g.group_id, g.folded) for g in graph.groups] == [("load", True)]


def test_folding_an_unknown_group_changes_nothing() -> None:
    assert set(draw({"nope"}).drawn.items) == set(draw(set()).drawn.items)


@pytest.mark.parametrize(
    ("states", "shown"),
    [
        ([], None),
        ([None, None], None),
        (["success", "success"], "success"),
        (["success", "running", None], "running"),
        (["running", "failed"], "failed"),
        (["success", "skipped", "skipped"], "skipped"),
        (["queued", "upstream_failed"], "upstream_failed"),
    ],
)
def test_a_group_state_is_its_most_pressing_one(
    states: list[str | None], shown: str | None
) -> None:
    assert group_state(states) == shown


def ti(name: str, state: str, queued: float | None, start: float | None, end: float | None):  # type: ignore[no-untyped-def]
    def at(seconds: float | None) -> str | None:
        return None if seconds is None else (T0 + timedelta(seconds=seconds)).isoformat()

    return {
        "task_id": name,
        "map_index": -1,
        "state": state,
        "queued_at": at(queued),
        "start_date": at(start),
        "end_date": at(end),
    }


def test_gantt_bars_wait_then_run_on_one_axis() -> None:
    instances = [
        ti("a", "success", 0, 10, 40),
        ti("b", "running", 40, 50, None),
        ti("c", "none", None, None, None),
    ]
    drawn = chart(instances, now=T0 + timedelta(seconds=100), href={"a": "/a"})
    a, b, c = drawn.rows
    assert drawn.span_s == 100
    scale = CHART_WIDTH / 100
    assert a.wait == (0, 10 * scale) and a.bar == (10 * scale, 30 * scale) and a.href == "/a"
    assert b.bar == (50 * scale, 50 * scale)  # running: to now
    assert "running for 50.0 s" in b.title and "waited 10.0 s" in b.title
    assert c.wait is None and c.bar is None
    assert [row.y for row in drawn.rows] == sorted(row.y for row in drawn.rows)


def test_a_tiny_bar_is_still_visible_and_mapped_copies_have_their_index() -> None:
    copy = {**ti("m", "success", None, 0, 0.001), "map_index": 2}
    drawn = chart([copy, ti("n", "success", None, 0, 600)], now=T0, href={})
    assert drawn.rows[0].name == "m[2]" and drawn.rows[0].bar == (0, MIN_BAR_PX)


@pytest.mark.parametrize(("span", "step"), [(5, "1 s"), (100, "15 s"), (3600, "10 min")])
def test_ticks_are_round_and_few(span: float, step: str) -> None:
    shown = ticks(span, CHART_WIDTH / span)
    assert 2 <= len(shown) <= 9 and shown[0] == (0, "0 s") and shown[1][1] == step


SPECS = {
    name: param_spec(param)
    for name, param in {
        "region": Param("eu", type="string"),
        "size": Param(10, type="integer", minimum=1),
        "rate": Param(0.5, type="number"),
        "dry": Param(False, type="boolean"),
        "mode": Param("a", enum=["a", "b"]),
        "tables": Param(["x"], type="array"),
        "limit": Param(None, type=["null", "integer"]),
        "needed": Param(type="string"),
        "untyped": Param(3),
    }.items()
}


def test_each_param_gets_the_field_of_its_type_with_its_default() -> None:
    shown = {f.name: f for f in params_form.fields(SPECS)}
    assert {name: f.widget for name, f in shown.items()} == {
        "region": "text",
        "size": "integer",
        "rate": "number",
        "dry": "checkbox",
        "mode": "select",
        "tables": "json",
        "limit": "integer",
        "needed": "text",
        "untyped": "integer",
    }
    assert shown["size"].text == "10" and shown["tables"].text == '[\n  "x"\n]'
    assert shown["mode"].options == (('"a"', "a"), ('"b"', "b")) and shown["mode"].text == '"a"'
    assert shown["needed"].required and not shown["region"].required
    assert shown["limit"].text == "" and shown["dry"].checked is False


def test_a_form_reads_back_into_typed_values() -> None:
    form = {
        "param:region": "us",
        "param:size": "25",
        "param:rate": "1e-3",
        "param:dry": "on",
        "param:mode": '"b"',
        "param:tables": '["a", "b"]',
        "param:limit": "",
        "param:needed": "yes",
        "param:untyped": "4",
    }
    values, problems, _ = params_form.read_form(SPECS, form)
    assert problems == {}
    assert values == {
        "region": "us",
        "size": 25,
        "rate": 0.001,
        "dry": True,
        "mode": "b",
        "tables": ["a", "b"],
        "limit": None,
        "needed": "yes",
        "untyped": 4,
    }


def test_each_bad_value_has_its_own_problem_and_its_text_kept() -> None:
    form = {
        "param:size": "0",
        "param:rate": "NaN",
        "param:mode": '"c"',
        "param:tables": "[1,",
        "param:needed": "",
        "param:untyped": "2.5",
    }
    values, problems, texts = params_form.read_form(SPECS, form)
    assert set(problems) == {"size", "rate", "mode", "tables", "needed", "untyped"}
    assert "less than the minimum 1" in problems["size"]
    assert "finite" in problems["rate"]
    assert "not one of" in problems["mode"]
    assert "not valid JSON" in problems["tables"]
    assert "no value passed" in problems["needed"]
    assert "whole number" in problems["untyped"]
    assert texts["rate"] == "NaN" and texts["tables"] == "[1,"
    assert "region" not in values  # a field not posted: its default applies
    again = {f.name: f for f in params_form.fields(SPECS, texts=texts, errors=problems)}
    assert again["tables"].text == "[1," and again["tables"].error == problems["tables"]


def test_a_conf_is_checked_param_by_param() -> None:
    assert params_form.check_conf(SPECS, {"needed": "x"}) == {}
    problems = params_form.check_conf(SPECS, {"size": -1, "needed": "x", "other": 1})
    assert list(problems) == ["size"]
