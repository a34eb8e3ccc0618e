"""SQL of the Celery executor (``engine.executor.celery``): the sender's queued tries, a
worker taking over the try a message names, and what the metadata DB says about a message
that no longer means work.

A try the sender claimed is ``queued`` under the sender's executor job; the message it sends
names the task instance and that job. A worker runs the try only after moving it, still
``queued``, to its own executor job (``take_over_queued``): one atomic UPDATE, so of two
deliveries of one message (a redelivery after a worker died, a re-send after
``task_queued_timeout``) exactly one finds the try still waiting. From there on the try is the
worker's, guarded by its job id exactly as under the local executor
(``engine.db.queries.tasks``), and recovered like any executor's when the worker dies.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy import func, select, update

from engine.db.database import rowcount
from engine.db.models import DagTask, Job, TaskInstance
from engine.db.queries import jobs
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session


@dataclass(frozen=True, slots=True)
class HeldTry:
    """Where a task instance stands, for the log line of a message that means no work."""

    state: str
    executor_job_id: int | None
    try_number: int
    #: the holder's executor job is running with a fresh heartbeat
    holder_alive: bool


def queued_count(session: Session, *, job_id: int) -> int:
    """Tries sent by sender ``job_id`` that no worker took yet."""
    query = select(func.count()).where(
        TaskInstance.executor_job_id == job_id, TaskInstance.state == TaskState.QUEUED
    )
    return int(session.execute(query).scalar_one())


def take_over_queued(
    session: Session, ti_id: int, *, sender_job_id: int, worker_job_id: int
) -> bool:
    """Move a try still ``queued`` under the sender to the worker's job; False when it is not
    waiting for a worker any more (another delivery took it, it ran, it was recovered).

    Already queued under this worker counts as taken: a retry after a commit whose answer was
    lost (the connection dropped) finds its own take-over done. The worker runs one delivery
    of a try at a time (``CeleryWorker._run_try``), and starting it is guarded by its state.
    """
    result = session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.id == ti_id,
            TaskInstance.state == TaskState.QUEUED,
            TaskInstance.executor_job_id.in_((sender_job_id, worker_job_id)),
        )
        .values(executor_job_id=worker_job_id)
    )
    return rowcount(result) == 1


def held_try(session: Session, ti_id: int, *, now: datetime, threshold_s: float) -> HeldTry | None:
    """The task instance's state and holder (None: it is gone, its run deleted)."""
    row = session.execute(
        select(TaskInstance.state, TaskInstance.executor_job_id, TaskInstance.try_number).where(
            TaskInstance.id == ti_id
        )
    ).first()
    if row is None:
        return None
    state, holder, try_number = row
    alive = False
    if holder is not None:
        job = session.get(Job, holder)
        alive = job is not None and jobs.is_alive(job, now, threshold_s)
    return HeldTry(str(state), holder, int(try_number), alive)


def stale_queued(
    session: Session, *, job_id: int, now: datetime, timeout_s: float, limit: int
) -> list[int]:
    """Tries queued under sender ``job_id`` for longer than ``timeout_s``, their clock
    restarted (``queued_at = now``): they are sent again."""
    cutoff = now - timedelta(seconds=timeout_s)
    waiting = (
        (TaskInstance.executor_job_id == job_id)
        & (TaskInstance.state == TaskState.QUEUED)
        & (TaskInstance.queued_at < cutoff)
    )
    ids = [
        int(i)
        for i in session.execute(
            select(TaskInstance.id).where(waiting).order_by(TaskInstance.queued_at).limit(limit)
        ).scalars()
    ]
    if ids:
        session.execute(
            update(TaskInstance).where(TaskInstance.id.in_(ids), waiting).values(queued_at=now)
        )
    return ids


def task_queues(session: Session, ti_ids: Sequence[int]) -> dict[int, str | None]:
    """The queue of each task instance's task (None: the default queue)."""
    rows = session.execute(
        select(TaskInstance.id, DagTask.queue)
        .outerjoin(
            DagTask,
            (DagTask.dag_id == TaskInstance.dag_id) & (DagTask.task_id == TaskInstance.task_id),
        )
        .where(TaskInstance.id.in_(ti_ids))
    )
    return {int(ti_id): queue for ti_id, queue in rows}


def set_worker_queues(session: Session, *, job_id: int, queues: Sequence[str]) -> None:
    """Record the Celery queues worker job ``job_id`` consumes (``sluice jobs list``)."""
    session.execute(update(Job).where(Job.id == job_id).values(queues=",".join(queues)))


def queue_counts(session: Session, *, default_queue: str) -> dict[str, tuple[int, int]]:
    """Queue -> (queued, running) tries of its tasks, across the fleet."""
    queue = func.coalesce(DagTask.queue, default_queue)
    rows = session.execute(
        select(queue, TaskInstance.state, func.count())
        .select_from(TaskInstance)
        .outerjoin(
            DagTask,
            (DagTask.dag_id == TaskInstance.dag_id) & (DagTask.task_id == TaskInstance.task_id),
        )
        .where(TaskInstance.state.in_((TaskState.QUEUED, TaskState.RUNNING)))
        .group_by(queue, TaskInstance.state)
    )
    counts: dict[str, tuple[int, int]] = {}
    for name, state, count in rows:
        queued, running = counts.get(str(name), (0, 0))
        if state == TaskState.QUEUED:
            queued += int(count)
        else:
            running += int(count)
        counts[str(name)] = (queued, running)
    return counts
