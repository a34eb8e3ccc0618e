"""The engine's parts as shown: jobs (host, pid, heartbeat, alive?, load, the tries an
executor runs) and the Celery queues (tries queued and running, live workers).

Liveness uses the configured health thresholds (``liveness``): ``[triggerer]
health_check_threshold_s`` for triggerers, ``[scheduler] health_check_threshold_s`` for
every other part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypedDict

from engine.db.queries import celery as celery_sql
from engine.db.queries import inspection
from engine.db.queries.jobs import TRIGGERER_JOB, age_s, is_alive
from engine.views.common import Page, check_page, iso, page

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.config import Config
    from engine.db.models import Job
    from engine.db.queries.inspection import RunningTryRow

#: job type -> seconds of heartbeat age after which it counts as dead
Thresholds = dict[str, float]

#: At most this many of one executor job's running tries are listed (its load counts all).
RUNNING_TRIES_SHOWN: Final = 100


class RunningTry(TypedDict):
    """A try an executor runs now: where to find its page and since when it runs."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    started: str | None


class JobItem(TypedDict):
    """An engine part's job row as shown."""

    id: int
    type: str  # dag_processor, scheduler, executor, triggerer, api
    hostname: str | None
    pid: int | None
    state: str
    heartbeat_age_s: float | None
    alive: bool
    load: int | None  # triggers (triggerer) or tasks (executor) it holds
    capacity: int | None
    queues: list[str] | None  # the Celery queues a worker consumes
    started: str
    ended: str | None
    running_tries: list[RunningTry] | None  # an executor's, oldest first


class QueueItem(TypedDict):
    queue: str
    queued: int  # tries sent that no worker started yet
    running: int
    workers: list[int]  # the live worker jobs that consume it


class Queues(TypedDict):
    executor_kind: str  # whether tries go through Celery at all
    items: list[QueueItem]


def liveness(config: Config) -> tuple[Thresholds, float]:
    """(heartbeat age after which a job is dead, per job type; the default for the rest)."""
    return {TRIGGERER_JOB: config.triggerer.health_check_threshold_s}, (
        config.scheduler.health_check_threshold_s
    )


def list_jobs(
    session: Session,
    *,
    now: datetime,
    config: Config,
    include_ended: bool = False,
    ended_since: datetime | None = None,
    job_type: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> Page[JobItem]:
    """A page of jobs (running ones, those ended since ``ended_since``, or all with
    ``include_ended``), by type then id: host, pid, state, heartbeat age, alive?, load
    (triggers or tasks held), capacity, when it started and ended, a Celery worker's
    queues and, for an executor job, the tries it runs now."""
    check_page(limit, offset)
    thresholds, default = liveness(config)
    rows, total = job_page(
        session,
        now=now,
        thresholds=thresholds,
        default_threshold_s=default,
        include_ended=include_ended,
        ended_since=ended_since,
        job_type=job_type,
        limit=limit,
        offset=offset,
    )
    return page(rows, total, limit, offset)


def all_jobs(
    session: Session, *, now: datetime, thresholds: Thresholds, default_threshold_s: float
) -> list[JobItem]:
    """Every running job (``job_page``'s rows): what the doctor and the health check judge."""
    return job_page(
        session, now=now, thresholds=thresholds, default_threshold_s=default_threshold_s
    )[0]


def job_page(
    session: Session,
    *,
    now: datetime,
    thresholds: Thresholds,
    default_threshold_s: float,
    include_ended: bool = False,
    ended_since: datetime | None = None,
    job_type: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[JobItem], int]:
    """A page of jobs (by type, then id) judged against ``thresholds``, and the total."""
    triggers, tasks = inspection.loads(session)
    found, total = inspection.job_page(
        session,
        include_ended=include_ended,
        ended_since=ended_since,
        job_type=job_type,
        limit=limit,
        offset=offset,
    )
    executors = [job.id for job in found if _runs_tasks(job)]
    running = inspection.running_tries(session, executors, per_job=RUNNING_TRIES_SHOWN)
    rows = []
    for job in found:
        threshold = thresholds.get(job.job_type, default_threshold_s)
        load: int | None = None
        if job.job_type == TRIGGERER_JOB:
            load = triggers.get(job.id, 0)
        elif job.capacity is not None:
            load = tasks.get(job.id, 0)
        tries = [_running_try(row) for row in running.get(job.id, [])]
        rows.append(_job(job, now, threshold, load, tries if _runs_tasks(job) else None))
    return rows, total


def _job(
    job: Job, now: datetime, threshold: float, load: int | None, tries: list[RunningTry] | None
) -> JobItem:
    return {
        "id": job.id,
        "type": job.job_type,
        "hostname": job.hostname or None,
        "pid": job.pid,
        "state": job.state,
        "heartbeat_age_s": age_s(now, job.latest_heartbeat),
        "alive": is_alive(job, now, threshold),
        "load": load,
        "capacity": job.capacity,
        "queues": job.queues.split(",") if job.queues else None,
        "started": job.start_date.isoformat(),
        "ended": iso(job.end_date),
        "running_tries": tries,
    }


def _runs_tasks(job: Job) -> bool:
    """An executor job (local, a Celery sender or worker): one with slots, not a triggerer."""
    return job.job_type != TRIGGERER_JOB and job.capacity is not None


def _running_try(row: RunningTryRow) -> RunningTry:
    return {
        "dag_id": row.dag_id,
        "run_id": row.run_id,
        "task_id": row.task_id,
        "map_index": row.map_index,
        "try_number": row.try_number,
        "started": iso(row.start_date),
    }


def list_queues(session: Session, *, now: datetime, config: Config) -> Queues:
    """The Celery queues, by name: tries ``queued`` (sent, no worker started them) and
    ``running`` of the tasks routed to each (what ``sluice_celery_queue_tries`` counts),
    and the live workers that consume it (``workers``, job ids); a queue that only a worker
    consumes shows zeros. ``executor_kind`` says whether tries go through Celery at all."""
    _, threshold_s = liveness(config)
    counts = celery_sql.queue_counts(session, default_queue=config.celery.default_queue)
    consumers = inspection.queue_consumers(session, now=now, threshold_s=threshold_s)
    items: list[QueueItem] = [
        {
            "queue": name,
            "queued": counts.get(name, (0, 0))[0],
            "running": counts.get(name, (0, 0))[1],
            "workers": consumers.get(name, []),
        }
        for name in sorted(set(counts) | set(consumers))
    ]
    return {"executor_kind": config.executor.kind, "items": items}
