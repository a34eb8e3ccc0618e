"""SQL of the operator views (``engine.views``: jobs, triggers, the doctor's facts): job
rows and what each holds, the tries an executor runs, the consumers of Celery queues,
trigger rows and what they serve, deferred task instances, and the watchers whose trigger
fails. The views decide what the rows mean.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import func, select

from engine.db.models import Asset, AssetWatcher, DagRun, Job, TaskInstance, Trigger
from engine.db.queries.browse import fetch_page
from engine.db.queries.jobs import is_alive
from engine.db.queries.triggers import LOAD_FAILURE_PREFIX
from engine.states import JobState, TaskState

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime
    from typing import TypeAlias

    from sqlalchemy import Row
    from sqlalchemy.orm import Session

    #: executor_job_id, dag_id, run_id, task_id, map_index, try_number, start_date
    RunningTryRow: TypeAlias = Row[int | None, str, str, str, int, int, datetime | None]
    #: dag_id, run_id, task_id, trigger_id, trigger_timeout, trigger_row, trigger_created,
    #: triggerer_id, last_error
    DeferredRow: TypeAlias = Row[
        str,
        str,
        str,
        int | None,
        datetime | None,
        int | None,
        datetime | None,
        int | None,
        str | None,
    ]


_HELD_STATES: Final = (TaskState.QUEUED, TaskState.RUNNING)


def loads(session: Session) -> tuple[dict[int, int], dict[int, int]]:
    """(trigger rows per triggerer, held task instances per executor job)."""
    triggers = session.execute(
        select(Trigger.triggerer_id, func.count())
        .where(Trigger.triggerer_id.is_not(None))
        .group_by(Trigger.triggerer_id)
    )
    tasks = session.execute(
        select(TaskInstance.executor_job_id, func.count())
        .where(TaskInstance.executor_job_id.is_not(None), TaskInstance.state.in_(_HELD_STATES))
        .group_by(TaskInstance.executor_job_id)
    )
    return (
        {k: int(v) for k, v in triggers if k is not None},
        {k: int(v) for k, v in tasks if k is not None},
    )


def job_page(
    session: Session,
    *,
    include_ended: bool = False,
    ended_since: datetime | None = None,
    job_type: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[Job], int]:
    """A page of job rows by type, then id (running ones, those that ended at or after
    ``ended_since``, or all with ``include_ended``; of one ``job_type``), and the total."""
    query = select(Job).order_by(Job.job_type, Job.id)
    if ended_since is not None and not include_ended:
        query = query.where((Job.state == JobState.RUNNING) | (Job.end_date >= ended_since))
    elif not include_ended:
        query = query.where(Job.state == JobState.RUNNING)
    if job_type is not None:
        query = query.where(Job.job_type == job_type)
    found, total = fetch_page(session, query, limit=limit, offset=offset)
    return [job for (job,) in found], total


def running_tries(
    session: Session, job_ids: list[int], *, per_job: int
) -> dict[int, list[RunningTryRow]]:
    """Executor job id -> the tries it runs (``running`` under it), oldest first, at most
    ``per_job`` each: ``dag_id``, ``run_id``, ``task_id``, ``map_index``, ``try_number``,
    ``start_date``."""
    if not job_ids:
        return {}
    query = (
        select(
            TaskInstance.executor_job_id,
            TaskInstance.dag_id,
            DagRun.run_id,
            TaskInstance.task_id,
            TaskInstance.map_index,
            TaskInstance.try_number,
            TaskInstance.start_date,
        )
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(TaskInstance.executor_job_id.in_(job_ids), TaskInstance.state == TaskState.RUNNING)
        .order_by(TaskInstance.executor_job_id, TaskInstance.id)
    )
    found: dict[int, list[RunningTryRow]] = {}
    for row in session.execute(query):
        mine = found.setdefault(row.executor_job_id or 0, [])  # never None: filtered above
        if len(mine) < per_job:
            mine.append(row)
    return found


def queue_consumers(session: Session, *, now: datetime, threshold_s: float) -> dict[str, list[int]]:
    """Celery queue -> the live worker jobs that consume it (by id)."""
    query = (
        select(Job).where(Job.state == JobState.RUNNING, Job.queues.is_not(None)).order_by(Job.id)
    )
    consumers: dict[str, list[int]] = {}
    for job in session.execute(query).scalars():
        if job.queues and is_alive(job, now, threshold_s):
            for queue in job.queues.split(","):
                consumers.setdefault(queue, []).append(job.id)
    return consumers


def jobs_by_id(session: Session) -> dict[int, Job]:
    return {job.id: job for job in session.execute(select(Job)).scalars()}


def deferred_trigger_tasks(session: Session) -> Sequence[Row[int | None, str, str, str]]:
    """(trigger_id, dag_id, run_id, task_id) of the deferred task instances."""
    query = (
        select(TaskInstance.trigger_id, TaskInstance.dag_id, DagRun.run_id, TaskInstance.task_id)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(TaskInstance.trigger_id.is_not(None), TaskInstance.state == TaskState.DEFERRED)
    )
    return session.execute(query).all()


def watcher_triggers(session: Session) -> Sequence[Row[int, str, str]]:
    """(trigger_id, asset name, watcher name) of every watcher."""
    query = select(AssetWatcher.trigger_id, Asset.name, AssetWatcher.name).join(
        Asset, Asset.id == AssetWatcher.asset_id
    )
    return session.execute(query).all()


def trigger_page(
    session: Session,
    *,
    kind: str | None = None,
    triggerer_id: int | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[Row[Any]], int]:
    """A page of trigger rows by id (of one ``kind``, task / watcher, or one triggerer) and
    the total: ``id``, ``classpath``, ``kind``, ``triggerer_id``, ``claimed_at``,
    ``created_date``, ``failure_count``, ``last_failure_date``, ``last_error``; never the
    kwargs (they hold secrets, encrypted, and are of no use here)."""
    columns = (
        Trigger.id,
        Trigger.classpath,
        Trigger.kind,
        Trigger.triggerer_id,
        Trigger.claimed_at,
        Trigger.created_date,
        Trigger.failure_count,
        Trigger.last_failure_date,
        Trigger.last_error,
    )
    query = select(*columns).order_by(Trigger.id)
    if kind is not None:
        query = query.where(Trigger.kind == kind)
    if triggerer_id is not None:
        query = query.where(Trigger.triggerer_id == triggerer_id)
    return fetch_page(session, query, limit=limit, offset=offset)


def deferred_tasks(session: Session) -> Sequence[DeferredRow]:
    """Every deferred task instance with its trigger row (None columns when it is missing):
    (dag_id, run_id, task_id, trigger_id, trigger_timeout, the trigger row's id, created
    date, triggerer_id and last error)."""
    query = (
        select(
            TaskInstance.dag_id,
            DagRun.run_id,
            TaskInstance.task_id,
            TaskInstance.trigger_id,
            TaskInstance.trigger_timeout,
            Trigger.id,
            Trigger.created_date,
            Trigger.triggerer_id,
            Trigger.last_error,
        )
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .outerjoin(Trigger, Trigger.id == TaskInstance.trigger_id)
        .where(TaskInstance.state == TaskState.DEFERRED)
        .order_by(TaskInstance.id)
    )
    return session.execute(query).all()


def failed_watchers(session: Session) -> Sequence[Row[str, str, int, str | None]]:
    """(asset, watcher, trigger id, error) of the watchers whose trigger could not be loaded
    (bad classpath, kwargs, key, ...)."""
    query = (
        select(Asset.name, AssetWatcher.name, Trigger.id, Trigger.last_error)
        .join(Asset, Asset.id == AssetWatcher.asset_id)
        .join(Trigger, Trigger.id == AssetWatcher.trigger_id)
        .where(Trigger.last_error.startswith(LOAD_FAILURE_PREFIX))
        .order_by(Trigger.id)
    )
    return session.execute(query).all()


def failing_watchers(
    session: Session, *, now: datetime, since_s: float
) -> Sequence[Row[str, str, int, int, datetime | None, str | None]]:
    """(asset, watcher, trigger id, failures, last failure, last error) of the watchers
    whose trigger runs but failed within the last ``since_s``."""
    query = (
        select(
            Asset.name,
            AssetWatcher.name,
            Trigger.id,
            Trigger.failure_count,
            Trigger.last_failure_date,
            Trigger.last_error,
        )
        .join(Asset, Asset.id == AssetWatcher.asset_id)
        .join(Trigger, Trigger.id == AssetWatcher.trigger_id)
        .where(Trigger.last_failure_date >= now - timedelta(seconds=since_s))
        .where(~func.coalesce(Trigger.last_error, "").startswith(LOAD_FAILURE_PREFIX))
        .order_by(Trigger.id)
    )
    return session.execute(query).all()


def unassigned_trigger_count(session: Session) -> int:
    """Trigger rows no triggerer holds."""
    count = session.execute(
        select(func.count()).select_from(Trigger).where(Trigger.triggerer_id.is_(None))
    ).scalar_one()
    return int(count)
