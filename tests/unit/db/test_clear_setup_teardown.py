"""Clearing a task clears the setups it needs and their teardowns (Airflow's rule), a pure
function of the DAG's edges and roles (``engine.db.queries.actions``)."""

from __future__ import annotations

import pytest

from engine.db.queries.task_graph import with_setups_and_teardowns

# create >> work >> report >> delete (teardown of create); create >> delete;
# cache (a setup without teardown) >> work; unrelated: other
GRAPH = {
    "create": ["work", "delete"],
    "cache": ["work"],
    "work": ["report"],
    "report": ["delete"],
    "delete": [],
    "other": [],
    "after": [],
}
SETUPS, TEARDOWNS = {"create", "cache"}, {"delete"}


@pytest.mark.parametrize(
    ("cleared", "expected"),
    [
        ({"work"}, {"work", "create", "delete", "cache"}),
        ({"report"}, {"report", "create", "delete", "cache"}),  # cache is upstream of report
        ({"create"}, {"create", "delete"}),  # a setup: its teardown too
        ({"delete"}, {"delete", "create", "cache"}),  # a teardown: the setups above it
        ({"other"}, {"other"}),
    ],
)
def test_clearing_a_task_adds_the_setups_it_needs_and_their_teardowns(
    cleared: set[str], expected: set[str]
) -> None:
    assert with_setups_and_teardowns(GRAPH, cleared, SETUPS, TEARDOWNS) == expected


def test_a_setup_whose_teardown_is_not_below_the_task_is_left_alone() -> None:
    graph = {"s": ["w1", "t"], "w1": ["t"], "t": ["w2"], "w2": []}
    # w2 is below the teardown t: clearing it does not need s (its teardown is above w2)
    assert with_setups_and_teardowns(graph, {"w2"}, {"s"}, {"t"}) == {"w2"}
