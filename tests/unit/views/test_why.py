"""The pure parts of ``sluice dags why``: what an unmet asset condition still lacks, each node
judged by its own ``evaluate``, and the findings' order and verdict."""

from __future__ import annotations

import pytest

from engine.authoring.assets import Asset, AssetAlias
from engine.views import why_findings
from engine.views.why import _missing, _node

a, b, c = Asset("a"), Asset("b"), Asset("c")


@pytest.mark.parametrize(
    ("condition", "updated", "aliases", "missing"),
    [
        (a, set(), set(), "a"),
        (a, {"a"}, set(), None),
        (a & b, {"a"}, set(), "b"),
        (a & b, set(), set(), "a and b"),
        (a | b, set(), set(), "a or b"),
        (a | b, {"b"}, set(), None),
        (a & (b | c), {"a"}, set(), "b or c"),
        (a & (b | c), set(), set(), "a and (b or c)"),
        ((a & b) | c, {"a"}, set(), "b or c"),
        (a & AssetAlias("x"), {"a"}, set(), "alias x"),
        (a & AssetAlias("x"), {"a"}, {"x"}, None),
    ],
)
def test_what_a_condition_still_lacks(condition, updated, aliases, missing) -> None:
    assert _missing(condition, updated, aliases) == missing
    assert _node(condition, updated, aliases, {}, {})["satisfied"] is (missing is None)


def _view(**changes):
    view = {
        "dag_id": "d",
        "dag": {"active": True, "paused": False, "fileloc": "/d.py", "parse_error": None},
        "runs": {"active": [], "running": 0, "queued": 0, "max_active_runs": 16},
        "schedule": {"kind": "none", "assets": None, "time": None},
        "assets": [],
        "aliases": [],
        "engine": {"schedulers_alive": 1},
    }
    for key, value in changes.items():
        view[key] = {**view[key], **value}
    return view


def test_blockers_come_first_and_make_the_verdict() -> None:
    found = why_findings.findings(_view())
    assert [f["code"] for f in found] == ["manual_only"]
    assert why_findings.verdict(found).startswith("schedule=None: only manual/API triggers")

    found = why_findings.findings(_view(dag={"paused": True}, engine={"schedulers_alive": 0}))
    assert [(f["code"], f["severity"]) for f in found] == [
        ("dag_paused", "blocker"),
        ("no_scheduler", "blocker"),
        ("manual_only", "waiting"),
    ]
    assert why_findings.verdict(found) == "paused: no run starts until `sluice dags unpause d`"


def test_a_parse_error_and_a_running_run_are_notes() -> None:
    running = {"run_id": "r1", "state": "running", "start_date": "2026-01-01T00:00:00+00:00"}
    view = _view(
        dag={"parse_error": {"error": "SyntaxError: x\nmore", "line": 3}},
        runs={"active": [running], "running": 1},
    )
    found = why_findings.findings(view)
    assert [(f["code"], f["severity"]) for f in found][1:] == [
        ("parse_error", "note"),
        ("running", "note"),
    ]
    assert found[1]["message"].startswith("its file fails to parse (/d.py:3: SyntaxError: x)")
