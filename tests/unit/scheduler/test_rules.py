"""Pure scheduling decisions."""

from __future__ import annotations

import pytest

from engine.advancing.rules import is_condition_met, next_task_states, run_outcome, upstream_of
from engine.authoring.assets import Asset
from engine.states import DagRunState, TaskState

N, SCH, OK, FAIL, SKIP, UF = (
    TaskState.NONE,
    TaskState.SCHEDULED,
    TaskState.SUCCESS,
    TaskState.FAILED,
    TaskState.SKIPPED,
    TaskState.UPSTREAM_FAILED,
)
CHAIN = {"a": ["b"], "b": ["c"], "c": []}
DIAMOND = {"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}


def test_upstream_is_the_inverse_of_downstream() -> None:
    assert upstream_of(DIAMOND) == {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}


@pytest.mark.parametrize(
    ("graph", "states", "expected"),
    [
        (CHAIN, {"a": N, "b": N, "c": N}, {"a": SCH}),
        (CHAIN, {"a": OK, "b": N, "c": N}, {"b": SCH}),
        (CHAIN, {"a": FAIL, "b": N, "c": N}, {"b": UF, "c": UF}),  # transitive
        (CHAIN, {"a": SKIP, "b": N, "c": N}, {"b": SKIP, "c": SKIP}),
        (DIAMOND, {"a": OK, "b": OK, "c": N, "d": N}, {"c": SCH}),
        (DIAMOND, {"a": OK, "b": OK, "c": OK, "d": N}, {"d": SCH}),
        (DIAMOND, {"a": OK, "b": FAIL, "c": N, "d": N}, {"c": SCH, "d": UF}),
        (DIAMOND, {"a": OK, "b": SCH, "c": N, "d": N}, {"c": SCH}),
        (CHAIN, {"a": TaskState.DEFERRED, "b": N, "c": N}, {}),
    ],
)
def test_next_task_states(graph, states, expected) -> None:
    assert next_task_states(graph, states) == expected


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({"a": OK, "b": OK}, DagRunState.SUCCESS),
        ({"a": OK, "b": SKIP}, DagRunState.SUCCESS),
        ({"a": FAIL, "b": UF}, DagRunState.FAILED),
        ({"a": OK, "b": TaskState.DEFERRED}, None),
        ({"a": OK, "b": N}, None),
        ({}, None),
    ],
)
def test_run_outcome(states, expected) -> None:
    assert run_outcome(states) == expected


def test_condition_needs_updates_and_a_condition() -> None:
    a, b, c = Asset("a"), Asset("b"), Asset("c")
    assert not is_condition_met(None, {"a"})
    assert not is_condition_met(a, set())
    assert is_condition_met(a, {"a"})
    assert not is_condition_met(a & b, {"a"})
    assert is_condition_met(a & b, {"a", "b"})
    assert is_condition_met((a & b) | c, {"c"})
