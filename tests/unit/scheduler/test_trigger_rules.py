"""Trigger rules, rule by rule, against Airflow's documented table, and the leaf rule.

Each case gives a rule and the states of a task's direct upstream tasks; the expected answer
is Airflow 3's: ``run`` (the task becomes ``scheduled``), ``wait`` (stays ``none``), or the
state it ends in when the rule can no longer be met (``skipped`` / ``upstream_failed``).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.advancing.rules import (
    DECIDED_RULES,
    FINISHED,
    UpstreamCounts,
    decide,
    next_task_states,
    run_outcome,
)
from engine.authoring.arguments import SUPPORTED_TRIGGER_RULES, TriggerRule
from engine.states import DagRunState, TaskState

N, SCH, RUNNING, DEF, RETRY = (
    TaskState.NONE,
    TaskState.SCHEDULED,
    TaskState.RUNNING,
    TaskState.DEFERRED,
    TaskState.UP_FOR_RETRY,
)
OK, FAIL, SKIP, UF = (
    TaskState.SUCCESS,
    TaskState.FAILED,
    TaskState.SKIPPED,
    TaskState.UPSTREAM_FAILED,
)
RUN, WAIT = TaskState.SCHEDULED, None
R = TriggerRule


def _decide(rule: TriggerRule, *upstream: str) -> TaskState | None:
    """A task ``t`` under ``rule`` below upstream tasks in ``upstream`` states."""
    ups = {f"u{i}": state for i, state in enumerate(upstream)}
    graph = {name: ["t"] for name in ups} | {"t": []}
    changes = next_task_states(graph, {**ups, "t": N}, {"t": rule})
    return changes.get("t")


TABLE = [
    # all_success: every upstream succeeded; a failure -> upstream_failed, a skip -> skipped
    (R.ALL_SUCCESS, (OK, OK), RUN),
    (R.ALL_SUCCESS, (OK, RUNNING), WAIT),
    (R.ALL_SUCCESS, (OK, SKIP), SKIP),
    (R.ALL_SUCCESS, (FAIL, RUNNING), UF),  # does not wait for the others
    (R.ALL_SUCCESS, (UF, OK), UF),
    (R.ALL_SUCCESS, (SKIP, FAIL), UF),  # a failure wins over a skip
    (R.ALL_SUCCESS, (OK, RETRY), WAIT),  # up_for_retry is not finished
    (R.ALL_SUCCESS, (OK, DEF), WAIT),
    # all_failed: every upstream failed or upstream_failed; a success or skip -> skipped
    (R.ALL_FAILED, (FAIL, UF), RUN),
    (R.ALL_FAILED, (FAIL, RUNNING), WAIT),
    (R.ALL_FAILED, (FAIL, RETRY), WAIT),
    (R.ALL_FAILED, (FAIL, OK), SKIP),
    (R.ALL_FAILED, (SKIP, RUNNING), SKIP),
    # all_done: every upstream finished, whatever its state; never skipped or failed
    (R.ALL_DONE, (OK, FAIL, SKIP, UF), RUN),
    (R.ALL_DONE, (SKIP, SKIP), RUN),
    (R.ALL_DONE, (FAIL, RUNNING), WAIT),
    (R.ALL_DONE, (FAIL, RETRY), WAIT),
    # all_done_setup_success: all_done when no upstream is a setup task (Sluice has none)
    (R.ALL_DONE_SETUP_SUCCESS, (OK, FAIL), RUN),
    (R.ALL_DONE_SETUP_SUCCESS, (OK, RUNNING), WAIT),
    # all_done_min_one_success: all done, one success; Airflow skips on any skipped upstream
    (R.ALL_DONE_MIN_ONE_SUCCESS, (OK, FAIL), RUN),
    (R.ALL_DONE_MIN_ONE_SUCCESS, (OK, RUNNING), WAIT),
    (R.ALL_DONE_MIN_ONE_SUCCESS, (FAIL, UF), UF),
    (R.ALL_DONE_MIN_ONE_SUCCESS, (OK, SKIP), SKIP),
    # all_skipped: every upstream skipped; anything else finished -> skipped
    (R.ALL_SKIPPED, (SKIP, SKIP), RUN),
    (R.ALL_SKIPPED, (SKIP, RUNNING), WAIT),
    (R.ALL_SKIPPED, (SKIP, OK), SKIP),
    (R.ALL_SKIPPED, (FAIL, RUNNING), SKIP),
    (R.ALL_SKIPPED, (UF, SKIP), SKIP),
    # one_success: runs at the first success; all done without one -> skipped if all were
    # skipped, else upstream_failed
    (R.ONE_SUCCESS, (OK, RUNNING), RUN),
    (R.ONE_SUCCESS, (FAIL, RUNNING), WAIT),
    (R.ONE_SUCCESS, (SKIP, SKIP), SKIP),
    (R.ONE_SUCCESS, (SKIP, FAIL), UF),
    (R.ONE_SUCCESS, (UF, UF), UF),
    # one_failed: runs at the first failure (failed or upstream_failed); none -> skipped
    (R.ONE_FAILED, (FAIL, RUNNING), RUN),
    (R.ONE_FAILED, (UF, RUNNING), RUN),
    (R.ONE_FAILED, (OK, RUNNING), WAIT),
    (R.ONE_FAILED, (OK, RETRY), WAIT),  # the retry may still fail
    (R.ONE_FAILED, (OK, SKIP), SKIP),
    # one_done: runs at the first success or failure; upstream_failed and skipped do not count
    (R.ONE_DONE, (OK, RUNNING), RUN),
    (R.ONE_DONE, (FAIL, RUNNING), RUN),
    (R.ONE_DONE, (SKIP, RUNNING), WAIT),
    (R.ONE_DONE, (SKIP, UF), SKIP),
    # none_failed: every upstream succeeded or was skipped; a failure -> upstream_failed
    (R.NONE_FAILED, (OK, SKIP), RUN),
    (R.NONE_FAILED, (SKIP, SKIP), RUN),
    (R.NONE_FAILED, (OK, RUNNING), WAIT),
    (R.NONE_FAILED, (FAIL, RUNNING), UF),
    (R.NONE_FAILED, (UF, OK), UF),
    # none_failed_min_one_success: none_failed, and all skipped -> skipped
    (R.NONE_FAILED_MIN_ONE_SUCCESS, (OK, SKIP), RUN),
    (R.NONE_FAILED_MIN_ONE_SUCCESS, (SKIP, RUNNING), WAIT),
    (R.NONE_FAILED_MIN_ONE_SUCCESS, (SKIP, SKIP), SKIP),
    (R.NONE_FAILED_MIN_ONE_SUCCESS, (SKIP, FAIL), UF),
    # none_skipped: every upstream finished, none skipped; a skip -> skipped at once
    (R.NONE_SKIPPED, (OK, FAIL, UF), RUN),
    (R.NONE_SKIPPED, (OK, RUNNING), WAIT),
    (R.NONE_SKIPPED, (SKIP, RUNNING), SKIP),
    # always: runs at once, whatever the upstream tasks do
    (R.ALWAYS, (N, RUNNING), RUN),
    (R.ALWAYS, (FAIL, UF, SKIP), RUN),
]


@pytest.mark.parametrize(
    ("rule", "upstream", "expected"),
    TABLE,
    ids=[f"{rule}-{'-'.join(up)}" for rule, up, _ in TABLE],
)
def test_rule_table(rule, upstream, expected) -> None:
    assert _decide(rule, *upstream) == expected


def test_every_rule_is_in_the_table_and_decided() -> None:
    assert {rule for rule, _, _ in TABLE} == set(TriggerRule)
    assert DECIDED_RULES == SUPPORTED_TRIGGER_RULES == set(TriggerRule)


@pytest.mark.parametrize("rule", list(TriggerRule))
def test_a_task_without_upstream_runs_whatever_its_rule(rule) -> None:
    assert next_task_states({"t": []}, {"t": N}, {"t": rule}) == {"t": RUN}


def test_a_task_missing_from_the_rules_has_all_success() -> None:
    assert next_task_states({"a": ["t"], "t": []}, {"a": SKIP, "t": N}) == {"t": SKIP}


def test_an_unknown_rule_leaves_its_task_waiting() -> None:
    assert decide("sometimes", UpstreamCounts.of([OK])) is None


def test_only_tasks_in_none_are_decided() -> None:
    graph = {"a": ["b", "c"], "b": [], "c": []}
    states = {"a": FAIL, "b": RUNNING, "c": TaskState.QUEUED}
    assert next_task_states(graph, states, {"b": R.ALWAYS, "c": R.ONE_FAILED}) == {}


def test_skips_and_failures_propagate_through_rules_in_one_call() -> None:
    # a fails -> b upstream_failed -> c (one_failed) runs; d (all_success below a skipped
    # e) is skipped, and f below d (none_failed_min_one_success) is skipped too
    graph = {"a": ["b"], "b": ["c"], "c": [], "e": ["d"], "d": ["f"], "f": []}
    states = {"a": FAIL, "b": N, "c": N, "e": SKIP, "d": N, "f": N}
    rules = {"c": R.ONE_FAILED, "f": R.NONE_FAILED_MIN_ONE_SUCCESS}
    assert next_task_states(graph, states, rules) == {"b": UF, "c": RUN, "d": SKIP, "f": SKIP}


def test_a_join_after_a_branch_runs_with_none_failed_min_one_success() -> None:
    # the branch ran "left", "right" was skipped: the join runs (all_success would skip)
    graph = {"branch": ["left", "right"], "left": ["join"], "right": ["join"], "join": []}
    states = {"branch": OK, "left": OK, "right": SKIP, "join": N}
    join = {"join": R.NONE_FAILED_MIN_ONE_SUCCESS}
    assert next_task_states(graph, states, join) == {"join": RUN}
    assert next_task_states(graph, states) == {"join": SKIP}


# --- the leaf rule --------------------------------------------------------------------------

CHAIN = {"a": ["b"], "b": []}  # b is the only leaf
FORK = {"a": ["b", "c"], "b": [], "c": []}  # b and c are leaves


@pytest.mark.parametrize(
    ("graph", "states", "expected"),
    [
        (CHAIN, {"a": OK, "b": OK}, DagRunState.SUCCESS),
        (CHAIN, {"a": FAIL, "b": OK}, DagRunState.SUCCESS),  # b ran under all_done
        (CHAIN, {"a": FAIL, "b": SKIP}, DagRunState.SUCCESS),  # b was one_success, say
        (CHAIN, {"a": OK, "b": FAIL}, DagRunState.FAILED),
        (CHAIN, {"a": FAIL, "b": UF}, DagRunState.FAILED),
        (CHAIN, {"a": SKIP, "b": SKIP}, DagRunState.SUCCESS),
        (FORK, {"a": OK, "b": OK, "c": UF}, DagRunState.FAILED),
        (FORK, {"a": OK, "b": OK, "c": SKIP}, DagRunState.SUCCESS),
        (CHAIN, {"a": FAIL, "b": RUNNING}, None),
        (CHAIN, {"a": OK, "b": RETRY}, None),  # a task waiting to retry is not finished
        (CHAIN, {"a": OK, "b": DEF}, None),
        (CHAIN, {"a": OK, "b": N}, None),
        (CHAIN, {}, None),
    ],
)
def test_run_outcome_follows_the_leaf_rule(graph, states, expected) -> None:
    assert run_outcome(states, graph) == expected


def test_a_task_instance_without_a_known_task_counts_as_a_leaf() -> None:
    assert run_outcome({"a": OK, "gone": FAIL}, CHAIN) == DagRunState.FAILED


# --- invariants -----------------------------------------------------------------------------

_ANY_STATE = st.sampled_from([N, SCH, RUNNING, DEF, RETRY, OK, FAIL, SKIP, UF])


@given(rule=st.sampled_from(list(TriggerRule)), upstream=st.lists(_ANY_STATE, max_size=5))
def test_a_decision_once_made_is_one_of_three_states(rule, upstream) -> None:
    assert _decide(rule, *upstream) in (None, RUN, SKIP, UF)


@given(
    rule=st.sampled_from(list(TriggerRule)),
    upstream=st.lists(st.sampled_from(sorted(FINISHED)), min_size=1, max_size=5),
)
def test_every_rule_decides_once_all_upstream_tasks_finished(rule, upstream) -> None:
    """So a run never hangs: with finished upstream tasks no rule waits."""
    assert _decide(rule, *upstream) is not None


@given(
    rule=st.sampled_from(list(TriggerRule)),
    done=st.lists(st.sampled_from(sorted(FINISHED)), max_size=4),
    pending=st.lists(st.sampled_from([N, SCH, RUNNING, DEF, RETRY]), min_size=1, max_size=3),
)
def test_an_early_decision_stands_whatever_the_pending_tasks_become(rule, done, pending) -> None:
    """A rule decides before every upstream task finished only when no outcome of the others
    could turn "run" into "not run" or back (Airflow's "does not wait for all upstream
    tasks"). Which "not run" may differ: all_success skips at a skip without waiting to see
    whether another upstream task fails."""
    early = _decide(rule, *done, *pending)
    if early is None:
        return
    for outcome in sorted(FINISHED):
        later = _decide(rule, *done, *[outcome] * len(pending))
        assert (later == RUN) == (early == RUN)
