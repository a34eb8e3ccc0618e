"""SQL of recovering the task instances of dead executors (the scheduler's
``_recover_orphans``; Airflow's "task instance heartbeat timeout", once "zombie tasks").

Dead: no executor job with a heartbeat newer than a threshold holds the task instance
(``executor_job_id``). What becomes of a try it held depends on whether it started:

- a ``queued`` try was claimed but never ran (no process started): after ``threshold_s``
  (the executors' health threshold) it goes back to ``scheduled`` and does not consume a try;
- a ``running`` try of an executor silent for ``running_threshold_s`` (``[scheduler]
  task_instance_heartbeat_timeout``, 300 s by default as in Airflow: an executor that only
  lost the database for a while keeps its running tries) lost its process with its executor
  (or Celery worker): it counts as a
  failed try, decided by the executor's own rule (``engine.db.queries.retries``):
  ``up_for_retry`` after the task's retry delay while tries remain, else ``failed``. A
  callback request asks a live executor to run the task's ``on_retry_callback`` /
  ``on_failure_callback`` in a fresh process and to write why the try ended into its log
  (``engine.executor.callbacks``), as for a try whose process was killed. The scheduler
  then advances the run as after any failure (trigger rules downstream, the run's end).

Deferred tries are held by no executor (their trigger waits in the triggerer): untouched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import and_, or_, select, true, update

from engine.db.database import is_postgres, rowcount
from engine.db.models import DagRun, DagTask, Job, TaskInstance
from engine.db.queries import callbacks, jobs, retries, tasks
from engine.states import TaskState

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

logger = logging.getLogger(__name__)

#: the key of a callback request's ``data`` that describes a try of a dead executor
LOST_TRY: Final = "lost_try"


@dataclass(frozen=True, slots=True)
class LostTry:
    """A running try of a dead executor, ended as ``failed`` or ``up_for_retry``."""

    ti_id: int
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    max_tries: int
    state: str
    reason: str
    retry_at: datetime | None = None
    retry_wait_s: float = 0.0

    def log_fields(self) -> dict[str, object]:
        return {
            "ti_id": self.ti_id,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "try_number": self.try_number,
            "map_index": self.map_index,
        }


@dataclass(frozen=True, slots=True)
class Recovery:
    """What ``recover_orphaned_tasks`` did: queued tries put back, running tries ended."""

    requeued: list[int] = field(default_factory=list)
    lost: list[LostTry] = field(default_factory=list)


def recover_orphaned_tasks(
    session: Session,
    *,
    threshold_s: float,
    now: datetime,
    running_threshold_s: float | None = None,
) -> Recovery:
    """Recover the queued and running task instances of dead executors (see the module
    docstring); ``now`` (the scheduler's clock) ends the failed tries and times retries.
    ``running_threshold_s`` (at least ``threshold_s``; None: the same) is how long an
    executor is silent before its running tries are failed."""
    running_threshold_s = max(threshold_s, running_threshold_s or threshold_s)
    queued_dead = _not_alive(session, threshold_s)
    running_dead = _not_alive(session, running_threshold_s)
    candidates = select(TaskInstance.id, TaskInstance.state).where(
        or_(
            and_(TaskInstance.state == TaskState.QUEUED, queued_dead),
            and_(TaskInstance.state == TaskState.RUNNING, running_dead),
        )
    )
    if is_postgres(session):
        candidates = candidates.with_for_update(skip_locked=True)
    rows = session.execute(candidates).all()
    queued = sorted(int(i) for i, state in rows if state == TaskState.QUEUED)
    running = sorted(int(i) for i, state in rows if state == TaskState.RUNNING)
    recovery = Recovery(_requeue(session, queued, queued_dead), [])
    for ti_id in running:
        lost = _end_lost_try(session, ti_id, running_dead, threshold_s=running_threshold_s, now=now)
        if lost is not None:
            recovery.lost.append(lost)
    return recovery


def _not_alive(session: Session, threshold_s: float) -> Any:
    """Task instances held by no executor with a heartbeat newer than ``threshold_s``."""
    alive = jobs.alive_job_ids(session, job_type=tasks.EXECUTOR_JOB, threshold_s=threshold_s)
    if not alive:
        return true()
    return or_(TaskInstance.executor_job_id.is_(None), TaskInstance.executor_job_id.not_in(alive))


def _requeue(session: Session, ids: list[int], not_alive: Any) -> list[int]:
    """Queued tries of dead executors back to ``scheduled``, their try not consumed."""
    if not ids:
        return []
    held = and_(TaskInstance.id.in_(ids), TaskInstance.state == TaskState.QUEUED, not_alive)
    rows = session.execute(
        update(TaskInstance).where(held).values(**tasks.requeue_values()).returning(TaskInstance.id)
    )
    return sorted(int(i) for i in rows.scalars())


def _end_lost_try(
    session: Session, ti_id: int, not_alive: Any, *, threshold_s: float, now: datetime
) -> LostTry | None:
    """End one running try of a dead executor as a failed try, and request its callback."""
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
    reason = _reason(ti.executor_job_id, hostname, heartbeat, threshold_s)
    retry = retries.next_try_at(
        dag_id=ti.dag_id,
        task_id=ti.task_id,
        run_id=str(run_id),
        try_number=ti.try_number,
        max_tries=ti.max_tries,
        delay_s=300.0 if delay_s is None else float(delay_s),  # the task left its DAG
        exponential_backoff=bool(backoff),
        max_delay_s=None if max_delay_s is None else float(max_delay_s),
        now=now,
    )
    lost = LostTry(
        ti_id=ti.id,
        dag_id=ti.dag_id,
        run_id=str(run_id),
        task_id=ti.task_id,
        map_index=ti.map_index,
        try_number=ti.try_number,
        max_tries=ti.max_tries,
        state=TaskState.FAILED if retry is None else TaskState.UP_FOR_RETRY,
        reason=reason,
        retry_at=None if retry is None else retry[0],
        retry_wait_s=0.0 if retry is None else retry[1],
    )
    if not _write_lost_try(session, lost, not_alive, now=now):
        return None
    callbacks.request_task_callback(
        session, dag_id=lost.dag_id, run_id=lost.run_id, data=_callback_data(lost, now), now=now
    )
    return lost


def _reason(
    job_id: int | None, hostname: str | None, heartbeat: datetime | None, threshold_s: float
) -> str:
    if job_id is None or heartbeat is None:
        return "its executor is gone (no executor job holds it); its process is presumed dead"
    host = f" on {hostname}" if hostname else ""
    return (
        f"its executor (job {job_id}{host}) stopped heartbeating at "
        f"{heartbeat.isoformat(timespec='milliseconds')} (no heartbeat for {threshold_s:g}s): "
        "its process is presumed dead"
    )


def _write_lost_try(session: Session, lost: LostTry, not_alive: Any, *, now: datetime) -> bool:
    """The failed try's end, guarded: still running under a dead executor."""
    values: dict[str, Any] = {
        "state": lost.state,
        "next_method": None,
        "next_kwargs": None,
        "trigger_timeout": None,
        "executor_job_id": None,
        "queued_at": None,
        "pid": None,
        "end_date": now,
        "next_retry_at": lost.retry_at,
    }
    held = and_(TaskInstance.id == lost.ti_id, TaskInstance.state == TaskState.RUNNING, not_alive)
    return rowcount(session.execute(update(TaskInstance).where(held).values(**values))) == 1


def _callback_data(lost: LostTry, now: datetime) -> dict[str, Any]:
    """A callback request's ``data`` for ``lost`` (read by ``engine.executor.callbacks``)."""
    return {
        LOST_TRY: {
            "ti_id": lost.ti_id,
            "task_id": lost.task_id,
            "map_index": lost.map_index,
            "try_number": lost.try_number,
            "state": lost.state,
            "reason": lost.reason,
            "retry_at": None if lost.retry_at is None else lost.retry_at.isoformat(),
            "retry_wait_s": lost.retry_wait_s,
            "ended_at": now.isoformat(),
        }
    }
