"""SQL of the operator views: jobs, triggers and who serves them, deferred tasks, failing
watchers, and the doctor's facts.

The CLI (``engine.cli.ops``, ``engine.cli.inspect``) and the doctor (``engine.doctor``)
decide what the rows mean. Ages are computed here against one ``now`` so a whole view is
consistent.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import func, select

from engine.db.models import Asset, AssetWatcher, DagRun, Job, TaskInstance, Trigger
from engine.db.queries.browse import fetch_page
from engine.db.queries.dags import list_parse_errors
from engine.db.queries.jobs import TRIGGERER_JOB, age_s, is_alive
from engine.db.queries.triggers import LOAD_FAILURE_PREFIX
from engine.states import JobState, TaskState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


#: A watcher that failed this recently is reported by the doctor (the runner's restart
#: backoff is at most 60 s, so one that keeps failing fails well within it).
FAILING_WATCHER_WINDOW_S: Final = 300.0


_HELD_STATES: Final = (TaskState.QUEUED, TaskState.RUNNING)

#: At most this many of one executor job's running tries are listed (its load counts all).
RUNNING_TRIES_SHOWN: Final = 100


#: job type -> seconds of heartbeat age after which it counts as dead
Thresholds = dict[str, float]


def _loads(session: Session) -> tuple[dict[int, int], dict[int, int]]:
    """Trigger rows per triggerer and held task instances per executor job."""
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


def list_jobs(
    session: Session,
    *,
    now: datetime,
    thresholds: Thresholds,
    default_threshold_s: float,
    include_ended: bool = False,
) -> list[dict[str, Any]]:
    """Engine parts with heartbeat age, liveness and load (triggers or tasks they hold)."""
    return job_page(
        session,
        now=now,
        thresholds=thresholds,
        default_threshold_s=default_threshold_s,
        include_ended=include_ended,
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
) -> tuple[list[dict[str, Any]], int]:
    """A page of ``list_jobs`` (by type, then id), of one ``job_type``, and the total; the
    jobs that ended at or after ``ended_since`` are listed too. Each executor job (local or
    a Celery worker) also has the tries it is running (``running_tries``, the first
    ``RUNNING_TRIES_SHOWN``)."""
    query = select(Job).order_by(Job.job_type, Job.id)
    if ended_since is not None and not include_ended:
        query = query.where((Job.state == JobState.RUNNING) | (Job.end_date >= ended_since))
    elif not include_ended:
        query = query.where(Job.state == JobState.RUNNING)
    if job_type is not None:
        query = query.where(Job.job_type == job_type)
    triggers, tasks = _loads(session)
    found, total = fetch_page(session, query, limit=limit, offset=offset)
    executors = [job.id for (job,) in found if _runs_tasks(job)]
    running = _running_tries(session, executors)
    rows = []
    for (job,) in found:
        threshold = thresholds.get(job.job_type, default_threshold_s)
        load: int | None = None
        if job.job_type == TRIGGERER_JOB:
            load = triggers.get(job.id, 0)
        elif job.capacity is not None:
            load = tasks.get(job.id, 0)
        rows.append(
            {
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
                "ended": None if job.end_date is None else job.end_date.isoformat(),
                "running_tries": running.get(job.id, []) if _runs_tasks(job) else None,
            }
        )
    return rows, total


def _runs_tasks(job: Job) -> bool:
    """An executor job (local, a Celery sender or worker): one with slots, not a triggerer."""
    return job.job_type != TRIGGERER_JOB and job.capacity is not None


def _running_tries(session: Session, job_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Executor job id -> the tries it runs (``running`` under it), oldest first, at most
    ``RUNNING_TRIES_SHOWN`` each: where to find each one's page and since when it runs."""
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
    found: dict[int, list[dict[str, Any]]] = {}
    for job_id, dag_id, run_id, task_id, map_index, try_number, started in session.execute(query):
        mine = found.setdefault(job_id or 0, [])  # never None: filtered by job id above
        if len(mine) < RUNNING_TRIES_SHOWN:
            mine.append(
                {
                    "dag_id": dag_id,
                    "run_id": run_id,
                    "task_id": task_id,
                    "map_index": map_index,
                    "try_number": try_number,
                    "started": None if started is None else started.isoformat(),
                }
            )
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


def _trigger_servers(session: Session) -> tuple[dict[int, str], dict[int, str]]:
    """trigger id -> the deferred task(s) it resumes / the watcher(s) it backs."""
    tasks: dict[int, str] = {}
    ti_query = (
        select(TaskInstance.trigger_id, TaskInstance.dag_id, DagRun.run_id, TaskInstance.task_id)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(TaskInstance.trigger_id.is_not(None), TaskInstance.state == TaskState.DEFERRED)
    )
    for trigger_id, dag_id, run_id, task_id in session.execute(ti_query):
        if trigger_id is not None:
            _append(tasks, trigger_id, f"task {dag_id}/{run_id}/{task_id}")
    watchers: dict[int, str] = {}
    w_query = select(AssetWatcher.trigger_id, Asset.name, AssetWatcher.name).join(
        Asset, Asset.id == AssetWatcher.asset_id
    )
    for trigger_id, asset, name in session.execute(w_query):
        _append(watchers, int(trigger_id), f"watcher {asset}/{name}")
    return tasks, watchers


def _append(into: dict[int, str], key: int, text: str) -> None:
    into[key] = f"{into[key]}, {text}" if key in into else text


def list_triggers(session: Session, *, now: datetime, threshold_s: float) -> list[dict[str, Any]]:
    """Every trigger row: class, owner and its liveness, age, what it serves, load errors."""
    return trigger_page(session, now=now, threshold_s=threshold_s)[0]


def trigger_page(
    session: Session,
    *,
    now: datetime,
    threshold_s: float,
    kind: str | None = None,
    triggerer_id: int | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[dict[str, Any]], int]:
    """A page of ``list_triggers`` (by id), of one ``kind`` (task / watcher) or one
    triggerer, and the total; each row also has its owner's host and when it claimed it."""
    jobs = {job.id: job for job in session.execute(select(Job)).scalars()}
    tasks, watchers = _trigger_servers(session)
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
    )  # never the kwargs: they hold secrets (encrypted), and are of no use here
    query = select(*columns).order_by(Trigger.id)
    if kind is not None:
        query = query.where(Trigger.kind == kind)
    if triggerer_id is not None:
        query = query.where(Trigger.triggerer_id == triggerer_id)
    found, total = fetch_page(session, query, limit=limit, offset=offset)
    rows = []
    for trig in found:
        owner = jobs.get(trig.triggerer_id) if trig.triggerer_id is not None else None
        error = trig.last_error
        rows.append(
            {
                "id": trig.id,
                "classpath": trig.classpath,
                "kind": trig.kind,
                "triggerer_id": trig.triggerer_id,
                "owner_alive": None if owner is None else is_alive(owner, now, threshold_s),
                "age_s": age_s(now, trig.created_date),
                "serves": tasks.get(trig.id) or watchers.get(trig.id),
                "failures": trig.failure_count,
                "last_failure_age_s": age_s(now, trig.last_failure_date),
                "load_failed": bool(error and error.startswith(LOAD_FAILURE_PREFIX)),
                "last_error": error,
                "owner_hostname": None if owner is None else owner.hostname or None,
                "claimed_at": (
                    None
                    if owner is None or trig.claimed_at is None
                    else trig.claimed_at.isoformat()
                ),
                "created_date": trig.created_date.isoformat(),
            }
        )
    return rows, total


def deferred_tasks(session: Session) -> list[dict[str, Any]]:
    """Every deferred task instance with its trigger row (None fields when it is missing)."""
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
    keys = (
        "dag_id",
        "run_id",
        "task_id",
        "trigger_id",
        "trigger_timeout",
        "trigger_row",
        "trigger_created",
        "triggerer_id",
        "last_error",
    )
    return [dict(zip(keys, row, strict=True)) for row in session.execute(query)]


def failed_watchers(session: Session) -> list[dict[str, Any]]:
    """Watchers whose trigger could not be loaded (bad classpath, kwargs, key, ...)."""
    query = (
        select(Asset.name, AssetWatcher.name, Trigger.id, Trigger.last_error)
        .join(Asset, Asset.id == AssetWatcher.asset_id)
        .join(Trigger, Trigger.id == AssetWatcher.trigger_id)
        .where(Trigger.last_error.startswith(LOAD_FAILURE_PREFIX))
        .order_by(Trigger.id)
    )
    keys = ("asset", "watcher", "trigger_id", "error")
    return [dict(zip(keys, row, strict=True)) for row in session.execute(query)]


def failing_watchers(session: Session, *, now: datetime, since_s: float) -> list[dict[str, Any]]:
    """Watchers whose trigger runs but failed within the last ``since_s`` (it restarts with
    backoff: a broker that is down, a filter that raises), with their latest error."""
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
    return [
        {
            "asset": asset,
            "watcher": watcher,
            "trigger_id": trigger_id,
            "failures": failures,
            "last_failure_age_s": age_s(now, last),
            "error": error or "",
        }
        for asset, watcher, trigger_id, failures, last, error in session.execute(query)
    ]


def doctor_facts(
    session: Session, *, now: datetime, thresholds: Thresholds, default_threshold_s: float
) -> dict[str, Any]:
    """Everything the doctor judges, read in one transaction."""
    jobs = list_jobs(
        session, now=now, thresholds=thresholds, default_threshold_s=default_threshold_s
    )
    unassigned = session.execute(
        select(func.count()).select_from(Trigger).where(Trigger.triggerer_id.is_(None))
    ).scalar_one()
    return {
        "jobs": jobs,
        "deferred": deferred_tasks(session),
        "failed_watchers": failed_watchers(session),
        "failing_watchers": failing_watchers(session, now=now, since_s=FAILING_WATCHER_WINDOW_S),
        "parse_errors": [
            {"file": e.fileloc, "line": e.lineno, "error": e.error}
            for e in list_parse_errors(session)
        ],
        "unassigned_triggers": int(unassigned),
        "stream_splits": _stream_splits(session, jobs),
        "now": now,
    }


def _stream_splits(session: Session, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shared-stream groups held by more than one live triggerer, with their trigger ids."""
    from engine.db.queries import claims as store_claims

    alive = {j["id"] for j in jobs if j["type"] == TRIGGERER_JOB and j["alive"]}
    splits = store_claims.stream_splits(session, alive=alive)
    ids = store_claims.group_trigger_ids(session, digests=splits)
    return [
        {"digest": digest, "holders": holders, "trigger_ids": ids.get(digest, [])}
        for digest, holders in sorted(splits.items())
    ]
