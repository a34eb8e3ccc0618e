"""SQL of job rows: start, heartbeat, end, capacity, and which jobs are alive (in Python and
as a SQL condition, against one threshold).
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from sqlalchemy import insert, select, update

from engine.db.models import Job, utcnow
from engine.exceptions import LeaseLost
from engine.states import JobState

if TYPE_CHECKING:
    from collections.abc import Collection

    from sqlalchemy import ColumnElement, Connection
    from sqlalchemy.orm import Session


logger = logging.getLogger(__name__)


TRIGGERER_JOB: str = "triggerer"


DAG_PROCESSOR_JOB: Final = "dag_processor"


SCHEDULER_JOB: Final = "scheduler"


def start_job(session: Session, *, job_type: str, capacity: int | None = None) -> int:
    now = utcnow()
    result = session.execute(
        insert(Job)
        .values(
            job_type=job_type,
            state=JobState.RUNNING,
            hostname=socket.getfqdn(),
            pid=os.getpid(),
            capacity=capacity,
            start_date=now,
            latest_heartbeat=now,
        )
        .returning(Job.id)
    )
    return int(result.scalar_one())


def heartbeat(session: Session, job_id: int) -> bool:
    """Refresh the heartbeat; False when the row is gone or no longer running."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.state == JobState.RUNNING)
        .values(latest_heartbeat=utcnow())
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def revoke_jobs(session: Session, job_ids: Collection[int]) -> None:
    """End the ``running`` rows of ``job_ids`` as ``failed``: jobs found dead whose work is
    taken over in this transaction. A resumed owner's heartbeat and guarded writes
    (``check_owner``) then see that its job id, the epoch of what it owned, is over."""
    if job_ids:
        session.execute(
            update(Job)
            .where(Job.id.in_(sorted(job_ids)), Job.state == JobState.RUNNING)
            .values(state=JobState.FAILED, end_date=utcnow())
        )


def owner_is_running(job_id: int) -> ColumnElement[bool]:
    """SQL: job ``job_id``'s row is running (the guard of an owner's writes)."""
    return select(Job.id).where(Job.id == job_id, Job.state == JobState.RUNNING).exists()


def check_owner(connection: Connection, job_id: int) -> None:
    """Raise ``LeaseLost`` unless job ``job_id`` is running; inside the caller's transaction,
    so that what it writes next is written by the owner or not at all."""
    if not connection.execute(select(owner_is_running(job_id))).scalar_one():
        raise LeaseLost(
            f"job {job_id} is no longer running: another process took over what it owned"
        )


def end_job(session: Session, job_id: int, *, state: str = JobState.SUCCESS) -> None:
    session.execute(update(Job).where(Job.id == job_id).values(state=state, end_date=utcnow()))


def set_job_capacity(session: Session, job_id: int, capacity: int) -> None:
    session.execute(update(Job).where(Job.id == job_id).values(capacity=capacity))


def alive_job_ids(
    session: Session, *, job_type: str, threshold_s: float, now: datetime | None = None
) -> list[int]:
    cutoff = (now or utcnow()) - timedelta(seconds=threshold_s)
    rows = session.execute(
        select(Job.id).where(
            Job.job_type == job_type,
            Job.state == JobState.RUNNING,
            Job.latest_heartbeat > cutoff,
        )
    )
    return [int(r) for r in rows.scalars()]


def age_s(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else round(max((now - then).total_seconds(), 0.0), 3)


def is_alive(job: Job, now: datetime, threshold_s: float) -> bool:
    return job.state == JobState.RUNNING and (now - job.latest_heartbeat).total_seconds() < (
        threshold_s
    )


def alive_clause(now: datetime, threshold_s: float) -> ColumnElement[bool]:
    """``is_alive`` as a SQL condition on ``Job``."""
    cutoff = now - timedelta(seconds=threshold_s)
    return (Job.state == JobState.RUNNING) & (Job.latest_heartbeat > cutoff)
