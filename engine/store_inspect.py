"""SQL of the operator views: shared-stream snapshots, jobs, triggers, DAG details, doctor.

Like ``engine.store`` these functions take a ``Session`` and plain values and only read and
write; the CLI (``engine.cli_ops``) and the doctor (``engine.doctor``) decide what the rows
mean. Ages are computed here against one ``now`` so a whole view is consistent.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import delete, func, insert, select

from engine.models import (
    Asset,
    AssetWatcher,
    Dag,
    DagRun,
    DagScheduleAsset,
    DagTask,
    Job,
    JobState,
    SharedStreamSnapshot,
    TaskInstance,
    TaskState,
    Trigger,
)
from engine.store import LOAD_FAILURE_PREFIX, TRIGGERER_JOB, list_parse_errors
from shared_stream.stats import busiest_lanes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy import ColumnElement
    from sqlalchemy.orm import Session

    from shared_stream import GroupStats

STREAM_KEY_MAX_CHARS: Final = 1000
#: A watcher that failed this recently is reported by the doctor (the runner's restart
#: backoff is at most 60 s, so one that keeps failing fails well within it).
FAILING_WATCHER_WINDOW_S: Final = 300.0

LAST_RUNS: Final = 5
_HELD_STATES: Final = (TaskState.QUEUED, TaskState.RUNNING)

#: job type -> seconds of heartbeat age after which it counts as dead
Thresholds = dict[str, float]


def _age_s(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else round(max((now - then).total_seconds(), 0.0), 3)


def _is_alive(job: Job, now: datetime, threshold_s: float) -> bool:
    return job.state == JobState.RUNNING and (now - job.latest_heartbeat).total_seconds() < (
        threshold_s
    )


def stream_key_column(key: str) -> str:
    """The key as stored: a too-long repr keeps its head and a digest (still unique)."""
    if len(key) <= STREAM_KEY_MAX_CHARS:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{key[: STREAM_KEY_MAX_CHARS - 20]}...#{digest}"


# --- shared-stream snapshots ------------------------------------------------------------


#: The ``GroupStats`` fields stored as they are (``key`` and the lanes are converted).
_SNAPSHOT_FIELDS: Final = (
    "mode",
    "subscribers",
    "queue_high_water",
    "oldest_unresolved_age_s",
    "events_polled",
    "deliveries",
    "advances",
    "advanced_events",
    "last_advance_batch",
    "advance_latency_sum_s",
    "overflows",
    "ack_timeouts",
    "rejects",
)


def publish_stream_stats(
    session: Session, *, triggerer_id: int, stats: Sequence[GroupStats], now: datetime
) -> None:
    """Make this triggerer's rows exactly ``stats``: groups that are gone lose their row.

    Only this triggerer writes its rows, so replacing them in one transaction is an upsert
    that readers never see half done. ``stats`` has one entry per key, as
    ``SharedStreamManager.stats()`` returns it (a draining group and its successor merged).
    """
    delete_stream_snapshots(session, triggerer_id=triggerer_id)
    if not stats:
        return
    rows = [
        {
            **{name: getattr(group, name) for name in _SNAPSHOT_FIELDS},
            "stream_key": stream_key_column(group.key),
            "outstanding_by_lane": lanes_column(group.outstanding_by_lane),
            "triggerer_id": triggerer_id,
            "updated_at": now,
        }
        for group in stats
    ]
    session.execute(insert(SharedStreamSnapshot), rows)


def lanes_column(outstanding: dict[str, int]) -> dict[str, int]:
    """The busiest lanes as stored (bounded, as the metric labels are); the other lanes'
    events are summed under one ``"(N other lanes)"`` entry, so the backlog stays whole."""
    busiest = dict(busiest_lanes(outstanding))
    others = len(outstanding) - len(busiest)
    if others:
        rest = sum(outstanding.values()) - sum(busiest.values())
        busiest[f"({others} other lanes)"] = rest
    return busiest


def delete_stream_snapshots(session: Session, *, triggerer_id: int) -> int:
    result = session.execute(
        delete(SharedStreamSnapshot).where(SharedStreamSnapshot.triggerer_id == triggerer_id)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def delete_dead_stream_snapshots(session: Session, *, threshold_s: float, now: datetime) -> int:
    """Delete the rows of triggerers that stopped without deleting them (crashed, killed):
    job not running, or its heartbeat ``threshold_s`` old or more. Returns the rows deleted.

    A triggerer deletes its own rows only on a clean stop, and only ``sluice db clean``
    deletes job rows (long after they died): the triggerers' periodic clean-up calls this.
    """
    live = select(Job.id).where(_alive(now, threshold_s))
    result = session.execute(
        delete(SharedStreamSnapshot).where(SharedStreamSnapshot.triggerer_id.not_in(live))
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def _alive(now: datetime, threshold_s: float) -> ColumnElement[bool]:
    """``_is_alive`` as a SQL condition on ``Job``."""
    cutoff = now - timedelta(seconds=threshold_s)
    return (Job.state == JobState.RUNNING) & (Job.latest_heartbeat > cutoff)


def list_stream_snapshots(
    session: Session, *, threshold_s: float, now: datetime
) -> list[dict[str, Any]]:
    """Snapshots of live triggerers only (a dead one's rows describe nothing running)."""
    query = (
        select(SharedStreamSnapshot)
        .join(Job, Job.id == SharedStreamSnapshot.triggerer_id)
        .where(_alive(now, threshold_s))
        .order_by(SharedStreamSnapshot.triggerer_id, SharedStreamSnapshot.stream_key)
    )
    return [
        {
            "triggerer_id": snap.triggerer_id,
            "key": snap.stream_key,
            "mode": snap.mode,
            "subscribers": snap.subscribers,
            "outstanding_by_lane": snap.outstanding_by_lane,
            "oldest_unresolved_age_s": snap.oldest_unresolved_age_s,
            "queue_high_water": snap.queue_high_water,
            "events_polled": snap.events_polled,
            "deliveries": snap.deliveries,
            "advances": snap.advances,
            "advanced_events": snap.advanced_events,
            "last_advance_batch": snap.last_advance_batch,
            "advance_latency_sum_s": snap.advance_latency_sum_s,
            "overflows": snap.overflows,
            "ack_timeouts": snap.ack_timeouts,
            "rejects": snap.rejects,
            "snapshot_age_s": _age_s(now, snap.updated_at),
        }
        for snap in session.execute(query).scalars()
    ]


# --- jobs -------------------------------------------------------------------------------


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
    query = select(Job).order_by(Job.job_type, Job.id)
    if not include_ended:
        query = query.where(Job.state == JobState.RUNNING)
    triggers, tasks = _loads(session)
    rows = []
    for job in session.execute(query).scalars():
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
                "heartbeat_age_s": _age_s(now, job.latest_heartbeat),
                "alive": _is_alive(job, now, threshold),
                "load": load,
                "capacity": job.capacity,
                "started": job.start_date.isoformat(),
            }
        )
    return rows


# --- triggers ---------------------------------------------------------------------------


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
    jobs = {job.id: job for job in session.execute(select(Job)).scalars()}
    tasks, watchers = _trigger_servers(session)
    rows = []
    columns = (
        Trigger.id,
        Trigger.classpath,
        Trigger.kind,
        Trigger.triggerer_id,
        Trigger.created_date,
        Trigger.failure_count,
        Trigger.last_failure_date,
        Trigger.last_error,
    )  # not the kwargs: they can be large, and are of no use here
    for trig in session.execute(select(*columns).order_by(Trigger.id)):
        owner = jobs.get(trig.triggerer_id) if trig.triggerer_id is not None else None
        error = trig.last_error
        rows.append(
            {
                "id": trig.id,
                "classpath": trig.classpath,
                "kind": trig.kind,
                "triggerer_id": trig.triggerer_id,
                "owner_alive": None if owner is None else _is_alive(owner, now, threshold_s),
                "age_s": _age_s(now, trig.created_date),
                "serves": tasks.get(trig.id) or watchers.get(trig.id),
                "failures": trig.failure_count,
                "last_failure_age_s": _age_s(now, trig.last_failure_date),
                "load_failed": bool(error and error.startswith(LOAD_FAILURE_PREFIX)),
                "last_error": error,
            }
        )
    return rows


# --- DAG details ------------------------------------------------------------------------


def dag_details(session: Session, dag_id: str) -> dict[str, Any] | None:
    """One DAG as last parsed: file, schedule, tasks, the watchers of its assets, runs."""
    dag = session.get(Dag, dag_id)
    if dag is None:
        return None
    return {
        "dag_id": dag.dag_id,
        "fileloc": dag.fileloc,
        "description": dag.description,
        "paused": dag.is_paused,
        "active": dag.is_active,
        "last_parsed": None if dag.last_parsed_time is None else dag.last_parsed_time.isoformat(),
        "schedule": dag.schedule,
        "assets": _schedule_assets(session, dag_id),
        "tasks": _dag_tasks(session, dag_id),
        "watchers": _dag_watchers(session, dag_id),
        "last_runs": _last_runs(session, dag_id),
    }


def _schedule_assets(session: Session, dag_id: str) -> list[str]:
    query = (
        select(Asset.name)
        .join(DagScheduleAsset, DagScheduleAsset.asset_id == Asset.id)
        .where(DagScheduleAsset.dag_id == dag_id)
        .order_by(Asset.name)
    )
    return list(session.execute(query).scalars())


def _dag_tasks(session: Session, dag_id: str) -> list[dict[str, Any]]:
    query = select(DagTask).where(DagTask.dag_id == dag_id).order_by(DagTask.position)
    return [
        {
            "task_id": t.task_id,
            "operator": t.operator,
            "downstream": list(t.downstream_task_ids or []),
            "retries": t.retries,
            "start_from_trigger": t.start_from_trigger,
        }
        for t in session.execute(query).scalars()
    ]


def _dag_watchers(session: Session, dag_id: str) -> list[dict[str, Any]]:
    query = (
        select(Asset.name, AssetWatcher.name, Trigger)
        .join(DagScheduleAsset, DagScheduleAsset.asset_id == Asset.id)
        .join(AssetWatcher, AssetWatcher.asset_id == Asset.id)
        .join(Trigger, Trigger.id == AssetWatcher.trigger_id)
        .where(DagScheduleAsset.dag_id == dag_id)
        .order_by(Asset.name, AssetWatcher.name)
    )
    return [
        {
            "asset": asset,
            "name": name,
            "trigger_id": trig.id,
            "classpath": trig.classpath,
            "triggerer_id": trig.triggerer_id,
            "last_error": trig.last_error,
        }
        for asset, name, trig in session.execute(query)
    ]


def _last_runs(session: Session, dag_id: str) -> list[dict[str, Any]]:
    query = (
        select(DagRun)
        .where(DagRun.dag_id == dag_id)
        .order_by(DagRun.queued_at.desc(), DagRun.id.desc())
        .limit(LAST_RUNS)
    )
    return [
        {
            "run_id": run.run_id,
            "run_type": run.run_type,
            "state": run.state,
            "queued_at": run.queued_at.isoformat(),
            "end_date": None if run.end_date is None else run.end_date.isoformat(),
        }
        for run in session.execute(query).scalars()
    ]


# --- what the doctor examines -----------------------------------------------------------


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
            "last_failure_age_s": _age_s(now, last),
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
    from engine import store_claims

    alive = {j["id"] for j in jobs if j["type"] == TRIGGERER_JOB and j["alive"]}
    splits = store_claims.stream_splits(session, alive=alive)
    ids = store_claims.group_trigger_ids(session, digests=splits)
    return [
        {"digest": digest, "holders": holders, "trigger_ids": ids.get(digest, [])}
        for digest, holders in sorted(splits.items())
    ]
