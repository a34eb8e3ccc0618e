"""One pass over a running run, written in the caller's transaction (``advance_run``).

The run's row is locked first (``SKIP LOCKED`` on PostgreSQL; SQLite serialises writers):
whoever holds it advances the run, and the other caller passes (``None``). The executor's
pass right after it recorded a task step therefore never races the scheduler's loop over the
same run; when it passes, the scheduler's next loop (which the executor then asks for)
decides what the step made ready.

A pass asks the trigger rules about the run's waiting tasks (``expansion.decide_tasks``),
writes their new states (a ``start_from_trigger`` task goes to the triggerer at once), and
ends the run when every task finished (``rules.run_outcome``), with its DAG callback request
and its DAG's next time run computed again (a run held by ``max_active_runs`` may go now).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.advancing.expansion import decide_tasks
from engine.advancing.rules import run_outcome
from engine.db import models
from engine.db.queries import callbacks, deferrals, runs, time_schedules
from engine.states import DagRunState, TaskState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from engine.crypto import KwargsCipher

__all__ = ("Advanced", "advance_run")


@dataclass(frozen=True, slots=True)
class Advanced:
    """What one pass did: task instances made ``scheduled`` (for an executor), whether a
    decision left tasks below it to decide in another pass at once (``decided``: a mapped
    task skipped, failed or expanded), whether the run ended, and ``start_from_trigger``
    tasks deferred (for a triggerer)."""

    scheduled: int
    decided: bool
    ended: bool
    deferred: int = 0


def advance_run(session: Session, cipher: KwargsCipher, run_pk: int) -> Advanced | None:
    """Advance run ``run_pk`` once; None when it is not running (ended since it was listed:
    cancelled, timed out) or another transaction holds it."""
    state = runs.load_run_state(session, run_pk)
    if state is None or state.state != DagRunState.RUNNING:
        return None
    now = models.utcnow()
    advance = decide_tasks(session, state, now=now)
    changes = advance.changes
    to_trigger = [
        t for t, s in changes.items() if s == TaskState.SCHEDULED and t in state.start_from_trigger
    ]
    runs.set_task_states(session, run_pk, changes, now=now)
    for task_id in to_trigger:
        deferrals.start_from_trigger(session, cipher, state.ti_ids[task_id])
    scheduled = advance.scheduled + sum(s == TaskState.SCHEDULED for s in changes.values())
    scheduled -= len(to_trigger)  # deferred at once: a triggerer's, not an executor's
    ended = False
    outcome = run_outcome(advance.states, state.downstream, state.ignored_teardowns)
    if outcome is not None and runs.end_running_run(session, run_pk, outcome, now=now):
        # (when someone else ended it in the meantime, their state stands)
        callbacks.request_dag_callback(session, run_pk, outcome, now=now)  # if it has one
        time_schedules.recompute_next_dagrun(session, state.dag_id)  # a held time run may go
        ended = True
    return Advanced(
        scheduled=scheduled, decided=advance.decided, ended=ended, deferred=len(to_trigger)
    )
