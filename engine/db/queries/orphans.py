"""SQL of the task instances of dead executors (what the scheduler's orphan recovery,
``engine.scheduler.orphans``, reads and writes; Airflow's "task instance heartbeat
timeout", once "zombie tasks").

An executor is alive while its job row heartbeats (``jobs.alive_job_ids``); the callers
pass the ids of the live ones, and every statement here matches only task instances held
by none of them (``executor_job_id``), so a write never takes a try from an executor that
came back meanwhile:

- ``orphaned_tries``: the ``queued`` and ``running`` tries of dead executors (locked,
  ``SKIP LOCKED`` on PostgreSQL);
- ``requeue_orphans``: queued tries back to ``scheduled`` (no process started: no try
  consumed);
- ``lost_try_facts`` / ``end_lost_try``: a running try's row with its task's retry settings
  and its executor's last heartbeat, and the end the scheduler decided for it.

Deferred tries are held by no executor (their trigger waits in the triggerer): untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, or_, select, true, update

from engine.db.database import is_postgres, rowcount
from engine.db.models import DagRun, DagTask, Job, TaskInstance
from engine.db.queries import tasks
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Collection
    from datetime import datetime

    from sqlalchemy.orm import Session
    from sqlalchemy.sql.elements import ColumnElement


def _held_by_none_of(alive: Collection[int]) -> ColumnElement[bool]:
    """Task instances held by no executor in ``alive`` (the live executors' job ids)."""
    if not alive:
        return true()
    return or_(
        TaskInstance.executor_job_id.is_(None), TaskInstance.executor_job_id.not_in(list(alive))
    )


def orphaned_tries(
    session: Session, *, queued_alive: Collection[int], running_alive: Collection[int]
) -> tuple[list[int], list[int]]:
    """(queued, running) task instance ids held by no executor of ``queued_alive`` /
    ``running_alive`` respectively (each sorted), locked for this transaction."""
    candidates = select(TaskInstance.id, TaskInstance.state).where(
        or_(
            and_(TaskInstance.state == TaskState.QUEUED, _held_by_none_of(queued_alive)),
            and_(TaskInstance.state == TaskState.RUNNING, _held_by_none_of(running_alive)),
        )
    )
    if is_postgres(session):
        candidates = candidates.with_for_update(skip_locked=True)
    rows = session.execute(candidates).all()
    queued = sorted(int(i) for i, state in rows if state == TaskState.QUEUED)
    running = sorted(int(i) for i, state in rows if state == TaskState.RUNNING)
    return queued, running


def requeue_orphans(session: Session, ti_ids: list[int], *, alive: Collection[int]) -> list[int]:
    """Queued tries of dead executors back to ``scheduled``, their try not consumed; returns
    those moved."""
    if not ti_ids:
        return []
    held = and_(
        TaskInstance.id.in_(ti_ids),
        TaskInstance.state == TaskState.QUEUED,
        _held_by_none_of(alive),
    )
    rows = session.execute(
        update(TaskInstance).where(held).values(**tasks.requeue_values()).returning(TaskInstance.id)
    )
    return sorted(int(i) for i in rows.scalars())


@dataclass(frozen=True, slots=True)
class LostTryFacts:
    """A running try of a dead executor: its task instance, its task's retry settings (None:
    the task left its DAG) and the executor's job row (None: gone)."""

    ti_id: int
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    max_tries: int
    executor_job_id: int | None
    retry_delay_s: float | None
    retry_exponential_backoff: bool
    max_retry_delay_s: float | None
    hostname: str | None
    latest_heartbeat: datetime | None


def lost_try_facts(session: Session, ti_id: int) -> LostTryFacts | None:
    """What deciding the end of try ``ti_id`` needs; None if the task instance is gone."""
    row = session.execute(
        select(
            TaskInstance,
            DagRun.run_id,
            DagTask.retry_delay_s,
            DagTask.retry_exponential_backoff,
            DagTask.max_retry_delay_s,
            Job.hostname,
            Job.latest_heartbeat,
        )
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .outerjoin(
            DagTask,
            and_(DagTask.dag_id == TaskInstance.dag_id, DagTask.task_id == TaskInstance.task_id),
        )
        .outerjoin(Job, Job.id == TaskInstance.executor_job_id)
        .where(TaskInstance.id == ti_id)
    ).first()
    if row is None:
        return None
    ti, run_id, delay_s, backoff, max_delay_s, hostname, heartbeat = row
    return LostTryFacts(
        ti_id=ti.id,
        dag_id=ti.dag_id,
        run_id=str(run_id),
        task_id=ti.task_id,
        map_index=ti.map_index,
        try_number=ti.try_number,
        max_tries=ti.max_tries,
        executor_job_id=ti.executor_job_id,
        retry_delay_s=None if delay_s is None else float(delay_s),
        retry_exponential_backoff=bool(backoff),
        max_retry_delay_s=None if max_delay_s is None else float(max_delay_s),
        hostname=hostname,
        latest_heartbeat=heartbeat,
    )


def end_lost_try(
    session: Session,
    ti_id: int,
    *,
    state: str,
    retry_at: datetime | None,
    alive: Collection[int],
    now: datetime,
) -> bool:
    """End a running try of a dead executor as ``state`` (``failed`` or ``up_for_retry``
    until ``retry_at``); guarded: still running and held by none of ``alive``."""
    values: dict[str, Any] = {
        "state": state,
        "next_method": None,
        "next_kwargs": None,
        "trigger_timeout": None,
        "executor_job_id": None,
        "queued_at": None,
        "pid": None,
        "end_date": now,
        "next_retry_at": retry_at,
    }
    held = and_(
        TaskInstance.id == ti_id,
        TaskInstance.state == TaskState.RUNNING,
        _held_by_none_of(alive),
    )
    return rowcount(session.execute(update(TaskInstance).where(held).values(**values))) == 1
