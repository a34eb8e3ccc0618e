"""Pure scheduling decisions: which tasks become ready, which runs end, which DAGs run.

No database, no clock: the scheduler reads state, asks these functions, writes the answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from engine.db.models import DagRunState, TaskState

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence, Set

    from engine.authoring.assets import BaseAsset

FINISHED: Final = frozenset(
    {TaskState.SUCCESS, TaskState.FAILED, TaskState.SKIPPED, TaskState.UPSTREAM_FAILED}
)
_BLOCKING: Final = frozenset({TaskState.FAILED, TaskState.UPSTREAM_FAILED})
_DONE_OK: Final = frozenset({TaskState.SUCCESS, TaskState.SKIPPED})


def upstream_of(downstream: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Invert ``task -> downstream tasks`` into ``task -> upstream tasks``."""
    upstream: dict[str, list[str]] = {task: [] for task in downstream}
    for task, children in downstream.items():
        for child in children:
            upstream.setdefault(child, []).append(task)
    return upstream


def next_task_states(
    downstream: Mapping[str, Sequence[str]], states: Mapping[str, str]
) -> dict[str, str]:
    """New states of tasks still in ``none`` (rule: all upstream succeeded).

    A task whose upstream failed becomes ``upstream_failed`` (transitively, in one call); one
    whose upstream all finished with at least one skipped becomes ``skipped``; one whose
    upstream all succeeded becomes ``scheduled``.
    """
    upstream = upstream_of(downstream)
    current = dict(states)
    changes: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for task, state in current.items():
            if state != TaskState.NONE:
                continue
            new = _decide(upstream.get(task, []), current)
            if new is not None:
                current[task] = changes[task] = new
                changed = True
    return changes


def _decide(upstream: Sequence[str], states: Mapping[str, str]) -> str | None:
    up = [states.get(task, TaskState.NONE) for task in upstream]
    if any(state in _BLOCKING for state in up):
        return TaskState.UPSTREAM_FAILED
    if not all(state in _DONE_OK for state in up):
        return None
    return TaskState.SKIPPED if TaskState.SKIPPED in up else TaskState.SCHEDULED


def run_outcome(states: Mapping[str, str]) -> str | None:
    """The final state of a DAG run once every task finished; None while any is not."""
    if not states or not all(state in FINISHED for state in states.values()):
        return None
    ok = all(state in _DONE_OK for state in states.values())
    return DagRunState.SUCCESS if ok else DagRunState.FAILED


def is_condition_met(
    condition: BaseAsset | None, updated: Set[str], aliases: Set[str] = frozenset()
) -> bool:
    """Whether a DAG scheduled on ``condition`` runs, given the assets updated since its last
    asset-triggered run (and the aliases those assets belong to). A DAG with no asset
    schedule is never asset-triggered."""
    return condition is not None and bool(updated) and condition.evaluate(updated, aliases)
