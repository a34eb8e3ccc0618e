"""Expanding mapped tasks into their copies (``engine.authoring.mapping``).

When the trigger rule of a mapped task says it may run, the scheduler does not schedule its
unmapped row: it counts the copies (``map_length``, from the stored ``dag_task.mapping`` and
the upstream results) and writes them, ``map_index`` 0..N-1, all ``scheduled``. An empty
input skips the task, an input that cannot be mapped over fails it; either way the tasks
below it can be decided at once. A mapped task whose rule lets it start before the tasks it
maps over finished (``always``) waits for them. A copy cleared by an operator is decided
again by the trigger rule and runs alone; the task is not expanded again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from engine.authoring.mapping import map_length, mapped_source_ids
from engine.db.queries import mapping as mapping_sql
from engine.exceptions import AirflowException
from engine.scheduler.rules import FINISHED, summary_state
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from sqlalchemy.orm import Session

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
        value_of = partial(mapping_sql.upstream_value, session, state.run_pk)
        try:
            length = map_length(mapping, value_of, task_id=task_id)
        except AirflowException as exc:
            logger.error(
                "DAG %s run %s: mapped task %s cannot be expanded, it fails: %s",
                state.dag_id,
                state.run_pk,
                task_id,
                exc,
                extra={"action": "task_expand_failed", "dag_id": state.dag_id, "task_id": task_id},
            )
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
