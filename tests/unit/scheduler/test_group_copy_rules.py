"""Copies of a mapped task group's tasks decided per map_index (``rules.next_states``):
copy i waits for copy i of the group tasks upstream of it, and a task after the group
counts every copy."""

from __future__ import annotations

from engine.advancing.rules import next_states
from engine.states import TaskState

N, SCH, RUN, OK, FAIL, UF = (
    TaskState.NONE,
    TaskState.SCHEDULED,
    TaskState.RUNNING,
    TaskState.SUCCESS,
    TaskState.FAILED,
    TaskState.UPSTREAM_FAILED,
)
#: a group (first -> second) mapped over 3 items, then "reduce" after it
GRAPH = {"g.first": ["g.second"], "g.second": ["reduce"], "reduce": []}
PAIRED = {"g.first": frozenset({"g.second"}), "g.second": frozenset({"g.first"})}


def test_a_group_task_is_expanded_into_waiting_copies_once_its_group_upstream_is() -> None:
    decided = next_states(
        GRAPH,
        {"g.first": RUN, "g.second": N, "reduce": N},
        expanded={"g.first": [RUN, RUN, RUN]},
        paired=PAIRED,
    )
    assert decided.to_expand == {"g.second"}
    assert decided.tasks == {}
    assert decided.copies == {}


def test_each_copy_waits_for_its_own_index_only() -> None:
    decided = next_states(
        GRAPH,
        {"g.first": RUN, "g.second": N, "reduce": N},
        {"reduce": "all_done"},
        expanded={"g.first": [OK, FAIL, RUN], "g.second": [N, N, N]},
        paired=PAIRED,
    )
    assert decided.copies == {"g.second": {0: SCH, 1: UF}}  # copy 2 waits for first[2]
    assert decided.tasks == {}  # reduce waits for every copy


def test_a_task_after_the_group_is_decided_once_every_copy_finished() -> None:
    decided = next_states(
        GRAPH,
        {"g.first": FAIL, "g.second": N, "reduce": N},
        {"reduce": "all_done"},
        expanded={"g.first": [OK, FAIL, OK], "g.second": [OK, N, OK]},
        paired=PAIRED,
    )
    assert decided.copies == {"g.second": {1: UF}}
    assert decided.tasks == {"reduce": SCH}  # in the same call


def test_without_pairs_a_mapped_task_counts_every_copy_upstream() -> None:
    decided = next_states(
        GRAPH,
        {"g.first": FAIL, "g.second": N, "reduce": N},
        expanded={"g.first": [OK, FAIL, OK]},
    )
    assert decided.tasks == {"g.second": UF, "reduce": UF}
    assert decided.copies == {}
    assert decided.to_expand == frozenset()
