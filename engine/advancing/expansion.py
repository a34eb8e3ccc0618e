"""Expanding mapped tasks into their copies (``engine.authoring.mapping``).

When the trigger rule of a mapped task says it may run, the scheduler does not schedule its
unmapped row: it counts the copies (``map_length``, from the stored ``dag_task.mapping`` and
the upstream results) and writes them, ``map_index`` 0..N-1, all ``scheduled``. An empty
input skips the task, an input that cannot be mapped over fails it; either way the tasks
below it can be decided at once. A mapped task whose rule lets it start before the tasks it
maps over finished (``always``) waits for them. A copy cleared by an operator is decided
again by the trigger rule and runs alone; the task is not expanded again.

A task of a mapped task group whose group upstream tasks are expanded is expanded at once
into waiting copies, each then decided on its own by the rules (``apply_copy_decisions``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from engine.advancing.rules import FINISHED, next_states, summary_state
from engine.authoring.mapping import map_length, mapped_source_ids
from engine.db.queries import mapping as mapping_sql
from engine.exceptions import AirflowException
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.advancing.rules import Decisions
    from engine.db.queries.runs import RunState

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Expansion:
    """What ``expand_mapped`` did: the state changes left to write, how many copies it
    scheduled, and whether a mapped task ended (skipped or failed) so that the tasks below
    it can be decided now."""

    changes: dict[str, str]
    scheduled: int = 0
    decided: bool = False


def summarize(expanded: Mapping[str, list[str]]) -> dict[str, str]:
    """The state the trigger rules see for each expanded mapped task: ``none`` while one of
    its copies waits (a copy cleared by an operator: the rules decide it again, and
    ``set_task_states`` applies the decision to the waiting copies only), else its
    ``summary_state``."""
    return {
        task_id: TaskState.NONE if TaskState.NONE in copies else summary_state(copies)
        for task_id, copies in expanded.items()
    }


def _partly_waiting(copies: list[str] | None) -> bool:
    """Copies of which some wait and some do not: the task is expanded, not to expand again."""
    return copies is not None and any(state != TaskState.NONE for state in copies)


def expand_mapped(
    session: Session,
    state: RunState,
    states: Mapping[str, str],
    changes: Mapping[str, str],
    *,
    now: datetime,
) -> Expansion:
    """Expand each mapped task of ``changes`` that is to be ``scheduled`` (its copies are
    written here); the other changes are returned to write. ``states`` are the run's task
    states with ``changes`` applied."""
    out = dict(changes)
    scheduled = 0
    decided = False
    for task_id, new in changes.items():
        mapping = state.mappings.get(task_id)
        if mapping is None or new != TaskState.SCHEDULED:
            continue
        if _partly_waiting(state.expanded.get(task_id)):
            continue  # its waiting copies are scheduled with the other changes
        del out[task_id]
        if any(states.get(source) not in FINISHED for source in mapped_source_ids(mapping)):
            continue
        length = _map_length(session, state, task_id, mapping)
        if length is None:  # it cannot be expanded: it fails
            out[task_id] = TaskState.FAILED
            decided = True
            continue
        scheduled += len(mapping_sql.expand_task(session, state.run_pk, task_id, length, now=now))
        decided = decided or length == 0
        logger.info(
            "DAG %s run %s: mapped task %s expanded into %d cop%s",
            state.dag_id,
            state.run_pk,
            task_id,
            length,
            "y" if length == 1 else "ies",
            extra={"action": "task_expanded", "dag_id": state.dag_id, "task_id": task_id},
        )
    return Expansion(out, scheduled, decided)


def paired_tasks(mappings: Mapping[str, Mapping[str, Any]]) -> dict[str, frozenset[str]]:
    """Task of a mapped task group -> the other tasks of its group (the stored mapping's
    ``group``): the tasks whose copy ``i`` alone counts for its copy ``i``."""
    return {
        task_id: frozenset(str(t) for t in mapping["group"]) - {task_id}
        for task_id, mapping in mappings.items()
        if isinstance(mapping.get("group"), list)
    }


@dataclass(frozen=True, slots=True)
class GroupWrites:
    """What ``apply_copy_decisions`` wrote: tasks that could not be expanded (``changes``,
    failed), copies scheduled, the summary state of each task whose copies changed, and
    whether something below can be decided now (``decided``)."""

    changes: dict[str, str]
    summaries: dict[str, str]
    scheduled: int = 0
    decided: bool = False


def apply_copy_decisions(
    session: Session,
    state: RunState,
    states: Mapping[str, str],
    decisions: Decisions,
    *,
    now: datetime,
) -> GroupWrites:
    """Write the copy-by-copy decisions of mapped task groups' tasks, and expand the group
    tasks ``decisions.to_expand`` names into waiting copies (decided on the next pass)."""
    scheduled = 0
    summaries: dict[str, str] = {}
    for task_id, by_index in decisions.copies.items():
        mapping_sql.set_copy_states(session, state.run_pk, task_id, by_index, now=now)
        scheduled += sum(s == TaskState.SCHEDULED for s in by_index.values())
        copies = list(state.expanded.get(task_id, []))
        for index, new in by_index.items():
            if index < len(copies):
                copies[index] = new
        summaries.update(summarize({task_id: copies}))
    changes: dict[str, str] = {}
    decided = any(s != TaskState.SCHEDULED for c in decisions.copies.values() for s in c.values())
    for task_id in sorted(decisions.to_expand):
        mapping = state.mappings.get(task_id)
        if mapping is None:
            continue
        if any(states.get(source) not in FINISHED for source in mapped_source_ids(mapping)):
            continue
        length = _map_length(session, state, task_id, mapping)
        if length is None:  # it cannot be expanded: it fails
            changes[task_id] = TaskState.FAILED
            decided = True
            continue
        mapping_sql.expand_task(session, state.run_pk, task_id, length, now=now, waiting=True)
        decided = True  # its copies are decided one by one now
    return GroupWrites(changes, summaries, scheduled, decided)


@dataclass(frozen=True, slots=True)
class Advance:
    """One pass over a run's tasks (``decide_tasks``): the whole tasks' state changes left
    to write, the run's task states after the pass (for its outcome), how many copies were
    scheduled, and whether the tasks below can be decided at once (another pass)."""

    changes: dict[str, str]
    states: dict[str, str]
    scheduled: int
    decided: bool


def decide_tasks(session: Session, state: RunState, *, now: datetime) -> Advance:
    """Ask the trigger rules about the run's waiting tasks and copies, expand the mapped
    tasks that may run and write the copy-by-copy decisions; the rest is left to write."""
    states = {**state.task_states, **summarize(state.expanded)}
    decisions = next_states(
        state.downstream,
        states,
        state.trigger_rules,
        state.expanded,
        state.setups,
        paired_tasks(state.mappings),
    )
    tasks = decisions.tasks
    expansion = expand_mapped(session, state, {**states, **tasks}, tasks, now=now)
    groups = apply_copy_decisions(session, state, states, decisions, now=now)
    changes = {**expansion.changes, **groups.changes}
    return Advance(
        changes,
        {**states, **changes, **groups.summaries},
        expansion.scheduled + groups.scheduled,
        expansion.decided or groups.decided,
    )


def _map_length(session: Session, state: RunState, task_id: str, mapping: Any) -> int | None:
    """How many copies the mapped task gets from its upstream values; None (logged with the
    reason) when they cannot make copies: the task fails."""
    value_of = partial(mapping_sql.upstream_value, session, state.run_pk)
    try:
        return map_length(mapping, value_of, task_id=task_id)
    except AirflowException as exc:
        logger.error(
            "DAG %s run %s: mapped task %s cannot be expanded, it fails: %s",
            state.dag_id,
            state.run_pk,
            task_id,
            exc,
            extra={"action": "task_expand_failed", "dag_id": state.dag_id, "task_id": task_id},
        )
        return None
