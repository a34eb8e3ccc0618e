"""SQL of ``sluice db clean``: which rows may go, counted or deleted one batch at a time.

The policy (which tables, the cut-offs, the batching loop) is ``engine.cli.db_clean``; here each
cleanable table has one condition that says what may be deleted, and the same condition is
used to count (``--dry-run``) and to delete. A batch is one statement,
``DELETE ... WHERE key IN (SELECT key ... WHERE <condition> LIMIT n)``, run in its own short
transaction, so the engine's writers wait at most one batch (SQLite has one writer at a time).

What is never deleted, whatever the cut-off (the condition of each table says it again):

- an asset event whose dedup key is younger than the dedup retention window (it is what makes
  a redelivered broker message a no-op), one still queued for a DAG (``asset_event_queue``),
  one that triggered a DAG run that has not finished;
- a DAG run that has not finished, or that still has a task scheduled, queued, running or
  deferred (its task instances go with it);
- a trigger row an asset watcher or a task instance that has not finished references;
- a job that is alive (running with a recent heartbeat), that owns trigger rows, or whose
  tasks are still queued or running; shared-stream snapshots of a live triggerer;
- a task state store entry that has not expired, or that was stored with ``NEVER_EXPIRE``
  (asset state store entries are never cleaned: they go with their asset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sqlalchemy import and_, delete, exists, func, not_, or_, select, tuple_

from engine.db.models import (
    AssetEvent,
    AssetEventQueue,
    AssetWatcher,
    Dag,
    DagRun,
    DagRunAssetEvent,
    Job,
    SharedStreamSnapshot,
    TaskInstance,
    TaskStateEntry,
    Trigger,
)
from engine.db.queries.state_store import expired_task_state
from engine.states import DagRunState, JobState, TaskState

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from sqlalchemy import ColumnElement
    from sqlalchemy.orm import Session

FINISHED_RUN_STATES: Final = (DagRunState.SUCCESS, DagRunState.FAILED)
#: Task states that still need their run, trigger or executor job.
ACTIVE_TASK_STATES: Final = (
    TaskState.SCHEDULED,
    TaskState.QUEUED,
    TaskState.RUNNING,
    TaskState.DEFERRED,
    TaskState.UP_FOR_RETRY,
)
#: Cleanable tables, in the order they are cleaned (runs first: that frees their events).
TABLES: Final = (
    "dag_run",
    "asset_event",
    "trigger",
    "shared_stream_snapshot",
    "job",
    "task_state_store",
)


@dataclass(frozen=True, slots=True)
class Cutoffs:
    """Rows older than ``before`` may go, within the limits below.

    ``dedup_before``: an asset event with a dedup key stored at or after it is kept (now
    minus the dedup retention window). ``dead_before``: a job marked running whose heartbeat
    is at or after it counts as alive (now minus the liveness threshold). ``now``: a task
    state store entry whose ``expires_at`` is at or before it has expired (whatever
    ``before``: its retention, set when it was written, is its cut-off).
    """

    before: datetime
    dedup_before: datetime
    dead_before: datetime
    now: datetime


# --- what may go, per table -------------------------------------------------------------------


def finished_runs(c: Cutoffs) -> ColumnElement[bool]:
    active_task = exists().where(
        TaskInstance.dag_run_id == DagRun.id, TaskInstance.state.in_(ACTIVE_TASK_STATES)
    )
    return and_(
        DagRun.state.in_(FINISHED_RUN_STATES),
        func.coalesce(DagRun.end_date, DagRun.queued_at) < c.before,
        not_(active_task),
    )


def old_asset_events(c: Cutoffs) -> ColumnElement[bool]:
    # A queue row of a DAG that is no longer in any DAG file (inactive) is never consumed:
    # it does not keep its event (a paused DAG is active: its events stay).
    queued = exists().where(
        AssetEventQueue.asset_event_id == AssetEvent.id,
        AssetEventQueue.dag_id == Dag.dag_id,
        Dag.is_active.is_(True),
    )
    unfinished_run = (
        exists()
        .where(DagRunAssetEvent.asset_event_id == AssetEvent.id)
        .where(DagRun.id == DagRunAssetEvent.dag_run_id)
        .where(DagRun.state.not_in(FINISHED_RUN_STATES))
    )
    return and_(
        AssetEvent.timestamp < c.before,
        or_(AssetEvent.dedup_key.is_(None), AssetEvent.timestamp < c.dedup_before),
        not_(queued),
        not_(unfinished_run),
    )


def unused_triggers(c: Cutoffs) -> ColumnElement[bool]:
    by_task = exists().where(
        TaskInstance.trigger_id == Trigger.id, TaskInstance.state.in_(ACTIVE_TASK_STATES)
    )
    by_watcher = exists().where(AssetWatcher.trigger_id == Trigger.id)
    return and_(Trigger.created_date < c.before, not_(by_task), not_(by_watcher))


def _alive(c: Cutoffs) -> ColumnElement[bool]:
    return and_(Job.state == JobState.RUNNING, Job.latest_heartbeat >= c.dead_before)


def dead_snapshots(c: Cutoffs) -> ColumnElement[bool]:
    live = select(Job.id).where(_alive(c))
    return and_(
        SharedStreamSnapshot.updated_at < c.before,
        SharedStreamSnapshot.triggerer_id.not_in(live),
    )


def dead_jobs(c: Cutoffs) -> ColumnElement[bool]:
    ended = and_(
        Job.state != JobState.RUNNING,
        func.coalesce(Job.end_date, Job.latest_heartbeat) < c.before,
    )
    long_dead = and_(
        Job.state == JobState.RUNNING,
        Job.latest_heartbeat < c.before,
        Job.latest_heartbeat < c.dead_before,
    )
    owns_triggers = exists().where(Trigger.triggerer_id == Job.id)
    holds_tasks = exists().where(
        TaskInstance.executor_job_id == Job.id,
        TaskInstance.state.in_((TaskState.QUEUED, TaskState.RUNNING)),
    )
    return and_(or_(ended, long_dead), not_(owns_triggers), not_(holds_tasks))


def expired_state(c: Cutoffs) -> ColumnElement[bool]:
    return expired_task_state(c.now)


_KEYS: Final = {
    "dag_run": (DagRun.id,),
    "asset_event": (AssetEvent.id,),
    "trigger": (Trigger.id,),
    "shared_stream_snapshot": (SharedStreamSnapshot.triggerer_id, SharedStreamSnapshot.stream_key),
    "job": (Job.id,),
    "task_state_store": (TaskStateEntry.id,),
}
_CONDITIONS: Final[dict[str, Callable[[Cutoffs], ColumnElement[bool]]]] = {
    "dag_run": finished_runs,
    "asset_event": old_asset_events,
    "trigger": unused_triggers,
    "shared_stream_snapshot": dead_snapshots,
    "job": dead_jobs,
    "task_state_store": expired_state,
}


# --- counting and deleting --------------------------------------------------------------------


def count_rows(session: Session, table: str, cutoffs: Cutoffs) -> dict[str, int]:
    """Rows of ``table`` a clean would delete now; ``dag_run`` also counts the task
    instances that go with the runs."""
    condition = _CONDITIONS[table](cutoffs)
    key = _KEYS[table][0]
    counts = {table: _count(session, select(func.count(key)).where(condition))}
    if table == "dag_run":
        runs = select(DagRun.id).where(condition)
        tis = select(func.count(TaskInstance.id)).where(TaskInstance.dag_run_id.in_(runs))
        counts["task_instance"] = _count(session, tis)
    return counts


def delete_batch(session: Session, table: str, cutoffs: Cutoffs, *, limit: int) -> dict[str, int]:
    """Delete at most ``limit`` rows of ``table`` that may go; returns the rows deleted, per
    table (``dag_run`` also names its task instances)."""
    if table == "dag_run":
        return _delete_runs(session, cutoffs, limit=limit)
    keys = _KEYS[table]
    batch = select(*keys).where(_CONDITIONS[table](cutoffs)).limit(limit)
    target = keys[0].in_(batch) if len(keys) == 1 else tuple_(*keys).in_(batch)
    result = session.execute(delete(keys[0].class_).where(target))
    return {table: int(result.rowcount)}  # type: ignore[attr-defined]


def _delete_runs(session: Session, cutoffs: Cutoffs, *, limit: int) -> dict[str, int]:
    # The runs are locked first (PostgreSQL; SQLite's transaction holds the write lock): no
    # task instance can be added to them, nor their state change, until this batch commits.
    candidates = select(DagRun.id).where(finished_runs(cutoffs)).limit(limit)
    if session.get_bind().dialect.name == "postgresql":
        candidates = candidates.with_for_update(skip_locked=True)
    ids = list(session.execute(candidates).scalars())
    if not ids:
        return {"dag_run": 0, "task_instance": 0}
    tis = session.execute(delete(TaskInstance).where(TaskInstance.dag_run_id.in_(ids)))
    runs = session.execute(delete(DagRun).where(DagRun.id.in_(ids)))
    return {
        "dag_run": int(runs.rowcount),  # type: ignore[attr-defined]
        "task_instance": int(tis.rowcount),  # type: ignore[attr-defined]
    }


def _count(session: Session, query: object) -> int:
    return int(session.execute(query).scalar_one())  # type: ignore[call-overload]
