"""All SQL of the metadata database lives here (procrastinate's ``JobManager`` pattern).

Functions take a ``Session`` (one transaction, opened by ``engine.db.Database``) and plain
values; they never decide policy, only read and write. Bulk paths use Core statements so a
triggerer can claim thousands of rows per second.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import and_, delete, func, insert, select, text, update

from engine.models import (
    Asset,
    AssetEvent,
    AssetWatcher,
    Dag,
    DagFile,
    DagParseError,
    DagScheduleAsset,
    DagTask,
    Job,
    JobState,
    TaskInstance,
    TaskState,
    Trigger,
    TriggerKind,
)
from triggers.serde import dumps

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from sqlalchemy.orm import Session

    from engine.crypto import KwargsCipher
    from triggers.base import BaseTrigger

logger = logging.getLogger(__name__)

TRIGGERER_JOB: str = "triggerer"
DAG_PROCESSOR_JOB: Final = "dag_processor"
FAIL_METHOD: str = "__fail__"


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class TriggerRow:
    """A claimed trigger row, still encrypted."""

    id: int
    classpath: str
    kwargs: str
    kind: str
    has_error: bool = False  # a failure is recorded on the row (e.g. it failed to load)
    stream_digest: str | None = None  # its shared-stream group (engine.store_claims)


#: The columns of a ``TriggerRow``, in its field order.
TRIGGER_ROW_COLUMNS: Final = (
    Trigger.id,
    Trigger.classpath,
    Trigger.kwargs,
    Trigger.kind,
    # The column itself, not ``last_error IS NOT NULL``: SQLite (3.40) evaluates such an
    # expression wrongly in UPDATE ... RETURNING (every row came back "has an error").
    Trigger.last_error,
    Trigger.stream_digest,
)


def trigger_row(row: Any) -> TriggerRow:
    """A ``TriggerRow`` from a result of ``TRIGGER_ROW_COLUMNS``."""
    trigger_id, classpath, kwargs, kind, last_error, digest = row
    return TriggerRow(int(trigger_id), classpath, kwargs, kind, last_error is not None, digest)


@dataclass(frozen=True, slots=True)
class DecryptFailure:
    trigger_id: int | None
    error: str


# --- jobs -------------------------------------------------------------------------------


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


# --- triggers ---------------------------------------------------------------------------


def add_trigger(
    session: Session, cipher: KwargsCipher, trigger: BaseTrigger, *, kind: TriggerKind
) -> int:
    """Store a trigger with its kwargs encrypted (and its shared-stream digest); its id."""
    from engine.loader import trigger_stream_digest

    classpath, kwargs = trigger.serialize()
    digest = trigger_stream_digest(trigger, strict=False)
    return add_trigger_row(session, cipher, classpath, kwargs, kind=kind, stream_digest=digest)


def add_trigger_row(
    session: Session,
    cipher: KwargsCipher,
    classpath: str,
    kwargs: dict[str, Any],
    *,
    kind: TriggerKind,
    stream_digest: str | None = None,
) -> int:
    token = cipher.encrypt_kwargs(kwargs, owner=classpath)
    result = session.execute(
        insert(Trigger)
        .values(
            classpath=classpath,
            kwargs=token,
            kind=kind,
            created_date=utcnow(),
            stream_digest=stream_digest,
        )
        .returning(Trigger.id)
    )
    return int(result.scalar_one())


def fetch_trigger_rows(session: Session, ids: Iterable[int]) -> list[TriggerRow]:
    wanted = list(ids)
    if not wanted:
        return []
    rows = session.execute(select(*TRIGGER_ROW_COLUMNS).where(Trigger.id.in_(wanted)))
    return [trigger_row(row) for row in rows]


def owned_checksum(session: Session, *, triggerer_id: int) -> tuple[int, int]:
    """(count, sum of ids) of the rows assigned to ``triggerer_id``: a cheap change detector."""
    count, total = session.execute(
        select(func.count(Trigger.id), func.coalesce(func.sum(Trigger.id), 0)).where(
            Trigger.triggerer_id == triggerer_id
        )
    ).one()
    return int(count), int(total)


def owned_trigger_ids(session: Session, *, triggerer_id: int) -> set[int]:
    rows = session.execute(select(Trigger.id).where(Trigger.triggerer_id == triggerer_id))
    return set(rows.scalars())


@dataclass(frozen=True, slots=True)
class Served:
    """What a trigger serves: log fields, and for a watcher its (asset id, watcher name)."""

    log_fields: dict[str, object]
    watcher: tuple[int, str] | None = None


def triggers_served(session: Session, ids: Iterable[int]) -> dict[int, Served]:
    """For each trigger: ``dag_id``/``run_id``/``task_id`` of its deferred task (several
    tasks: the first), or ``asset``/``watcher`` of its watcher with the watcher's identity,
    which its fired events keep even if the watcher moves to a new trigger meanwhile."""
    from engine.models import DagRun, TaskInstance

    wanted = sorted(ids)
    served: dict[int, Served] = {}
    if not wanted:
        return served
    tasks = session.execute(
        select(TaskInstance.trigger_id, DagRun.dag_id, DagRun.run_id, TaskInstance.task_id)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(TaskInstance.trigger_id.in_(wanted))
        .order_by(TaskInstance.id)
    )
    for trigger_id, dag_id, run_id, task_id in tasks:
        if trigger_id is not None and trigger_id not in served:  # IN excludes NULL anyway
            # Interned: kept for the trigger's life, and repeated across a run's triggers.
            fields: dict[str, object] = {
                "dag_id": sys.intern(dag_id),
                "run_id": sys.intern(run_id),
                "task_id": sys.intern(task_id),
            }
            served[int(trigger_id)] = Served(fields)
    watchers = session.execute(
        select(AssetWatcher.trigger_id, AssetWatcher.asset_id, Asset.name, AssetWatcher.name)
        .join(Asset, Asset.id == AssetWatcher.asset_id)
        .where(AssetWatcher.trigger_id.in_(wanted))
    )
    for trigger_id, asset_id, asset, watcher in watchers:
        fields = {"asset": asset, "watcher": watcher}
        served.setdefault(int(trigger_id), Served(fields, (int(asset_id), str(watcher))))
    return served


def release_triggers(session: Session, *, triggerer_id: int) -> int:
    """Unassign every row of ``triggerer_id`` so another triggerer takes them at once."""
    result = session.execute(
        update(Trigger).where(Trigger.triggerer_id == triggerer_id).values(triggerer_id=None)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def rotate_trigger_kwargs(
    session: Session, cipher: KwargsCipher
) -> tuple[int, list[DecryptFailure]]:
    """Re-encrypt every encrypted value with the first key; values that fail are reported.

    Covers trigger kwargs, the stored last good parse of each DAG file and the start
    arguments of ``start_from_trigger`` tasks. ``DecryptFailure.trigger_id`` is None for a
    value that is not a trigger row (its error names what it is).
    """
    from engine.models import DagFile, DagTask

    failures: list[DecryptFailure] = []
    counts = [
        _rotate(row, "kwargs", cipher, failures, trigger_id=row.id)
        for row in session.execute(select(Trigger)).scalars()
    ]
    for dag_file in session.execute(select(DagFile)).scalars():
        what = f"parse result of {dag_file.fileloc}"
        counts.append(_rotate(dag_file, "result", cipher, failures, what=what))
    tasks = select(DagTask).where(DagTask.start_trigger.is_not(None))
    for task in session.execute(tasks).scalars():
        what = f"start trigger of task {task.dag_id}.{task.task_id}"
        counts.append(_rotate(task, "start_trigger", cipher, failures, what=what))
    return sum(counts), failures


def _rotate(
    row: Any,
    attribute: str,
    cipher: KwargsCipher,
    failures: list[DecryptFailure],
    *,
    trigger_id: int | None = None,
    what: str = "",
) -> int:
    from engine.exceptions import DecryptionError

    try:
        setattr(row, attribute, cipher.rotate(getattr(row, attribute), trigger_id=trigger_id))
    except DecryptionError as exc:
        failures.append(DecryptFailure(trigger_id, f"{what}: {exc}" if what else str(exc)))
        return 0
    return 1


#: How the triggerer's reason for a trigger it cannot load (import, kwargs, decrypt) starts.
LOAD_FAILURE_PREFIX: Final = "cannot load trigger"


def clear_load_errors(session: Session, trigger_ids: Iterable[int]) -> None:
    """Forget the load failure of triggers that now load and run (e.g. the Fernet key was
    fixed): ``sluice triggers list`` and ``sluice doctor`` must not keep reporting it."""
    wanted = sorted(trigger_ids)
    if wanted:
        session.execute(
            update(Trigger)
            .where(Trigger.id.in_(wanted), Trigger.last_error.startswith(LOAD_FAILURE_PREFIX))
            .values(last_error=None)
        )


def record_trigger_failure(session: Session, trigger_id: int, error: str) -> None:
    session.execute(
        update(Trigger)
        .where(Trigger.id == trigger_id)
        .values(
            failure_count=Trigger.failure_count + 1,
            last_error=error[:10_000],
            last_failure_date=utcnow(),
        )
    )


def delete_unreferenced_triggers(session: Session) -> int:
    """Delete trigger rows no deferred task and no asset watcher references."""
    deferred = select(TaskInstance.trigger_id).where(
        TaskInstance.trigger_id.is_not(None), TaskInstance.state == TaskState.DEFERRED
    )
    watched = select(AssetWatcher.trigger_id)
    result = session.execute(
        delete(Trigger).where(Trigger.id.not_in(deferred), Trigger.id.not_in(watched))
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def count_triggers(session: Session) -> int:
    return int(session.execute(select(func.count()).select_from(Trigger)).scalar_one())


# --- task instances resumed / failed by their trigger -----------------------------------


def resume_deferred_tasks(
    session: Session, trigger_id: int, *, next_method: str | None, next_kwargs: dict[str, Any]
) -> int:
    """Move every task still deferred on ``trigger_id`` to ``scheduled``; 0 if none left.

    ``next_method=None`` keeps each task's own ``next_method``.
    """
    values: dict[str, Any] = {
        "state": TaskState.SCHEDULED,
        "next_kwargs": dumps(next_kwargs, where="next_kwargs"),
        "trigger_id": None,
        "trigger_timeout": None,
    }
    if next_method is not None:
        values["next_method"] = next_method
    result = session.execute(
        update(TaskInstance)
        .where(TaskInstance.trigger_id == trigger_id, TaskInstance.state == TaskState.DEFERRED)
        .values(**values)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def end_deferred_tasks(
    session: Session, trigger_id: int, *, state: str, xcoms: dict[str, Any] | None = None
) -> int:
    """End tasks deferred on ``trigger_id`` from the triggerer (``end_from_trigger``).

    ``xcoms`` (tagged JSON per key, as the executor stores a returned value) become the
    tasks' results; None leaves them as they are.
    """
    values: dict[str, Any] = {
        "state": state,
        "end_date": utcnow(),
        "trigger_id": None,
        "trigger_timeout": None,
    }
    if xcoms is not None:
        values["xcoms"] = xcoms
    result = session.execute(
        update(TaskInstance)
        .where(TaskInstance.trigger_id == trigger_id, TaskInstance.state == TaskState.DEFERRED)
        .values(**values)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def fail_timed_out_deferrals(session: Session, *, now: datetime | None = None) -> list[int]:
    """Fail (``__fail__``, "trigger timeout") tasks deferred past their timeout.

    Their triggers go at once (unless something else still uses them), so the triggerer
    stops them at its next sync instead of running a trigger nobody waits for until the
    periodic clean-up.
    """
    now = now or utcnow()
    expired = and_(
        TaskInstance.state == TaskState.DEFERRED,
        TaskInstance.trigger_timeout.is_not(None),
        TaskInstance.trigger_timeout <= now,
    )
    rows = session.execute(select(TaskInstance.id, TaskInstance.trigger_id).where(expired)).all()
    ids = [int(row.id) for row in rows]
    if ids:
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.id.in_(ids), expired)
            .values(
                state=TaskState.SCHEDULED,
                next_method=FAIL_METHOD,
                next_kwargs=dumps({"error": "trigger timeout"}),
                trigger_id=None,
                trigger_timeout=None,
            )
        )
        _delete_unused_triggers(session, {int(r.trigger_id) for r in rows if r.trigger_id})
    return ids


def _delete_unused_triggers(session: Session, trigger_ids: set[int]) -> None:
    if not trigger_ids:
        return
    deferred = select(TaskInstance.trigger_id).where(
        TaskInstance.trigger_id.is_not(None), TaskInstance.state == TaskState.DEFERRED
    )
    watched = select(AssetWatcher.trigger_id)
    session.execute(
        delete(Trigger).where(
            Trigger.id.in_(trigger_ids), Trigger.id.not_in(deferred), Trigger.id.not_in(watched)
        )
    )


def delete_trigger(session: Session, trigger_id: int) -> None:
    session.execute(delete(Trigger).where(Trigger.id == trigger_id))


# --- asset events from watchers ---------------------------------------------------------


def watcher_assets(session: Session, trigger_ids: Iterable[int]) -> dict[int, tuple[int, str]]:
    """Map trigger id -> (asset id, watcher name) for watcher triggers."""
    rows = session.execute(
        select(AssetWatcher.trigger_id, AssetWatcher.asset_id, AssetWatcher.name).where(
            AssetWatcher.trigger_id.in_(list(trigger_ids))
        )
    )
    return {int(t): (int(a), str(n)) for t, a, n in rows}


def insert_asset_events(session: Session, rows: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """Insert asset events, skipping any whose (asset, dedup_key) exists.

    A row whose dedup_key is None is always inserted (a unique constraint never matches
    NULLs, on PostgreSQL and SQLite alike). Returns (event id, asset id) of the rows
    actually inserted.
    """
    if not rows:
        return []
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert  # type: ignore[assignment]
    stmt = (
        dialect_insert(AssetEvent)
        .on_conflict_do_nothing(index_elements=["asset_id", "dedup_key"])
        .returning(AssetEvent.id, AssetEvent.asset_id)
    )
    return [(int(i), int(a)) for i, a in session.execute(stmt, list(rows)).all()]


# --- DAG processing: parse results, DAGs, tasks, assets, watchers -----------------------
# Added by the DAG processor work (engine.dag_sync decides, these functions read and write).


@dataclass(frozen=True, slots=True)
class DagRowState:
    dag_id: str
    fileloc: str
    is_active: bool
    is_paused: bool
    schedule: Any
    description: str | None


@dataclass(frozen=True, slots=True)
class AssetRowState:
    id: int
    name: str
    uri: str
    extra: Any
    is_active: bool


@dataclass(frozen=True, slots=True)
class WatcherRowState:
    """An asset watcher and its trigger row (``kwargs`` still encrypted)."""

    id: int
    asset_id: int
    name: str
    trigger_id: int
    classpath: str
    kwargs: str
    stream_digest: str | None = None


@dataclass(frozen=True, slots=True)
class ParseErrorRow:
    fileloc: str
    error: str
    lineno: int | None
    stacktrace: str | None
    timestamp: datetime


#: Key of the PostgreSQL advisory lock that serializes DAG sync passes across processes.
DAG_SYNC_LOCK_KEY: Final = 0x51_01CE


def lock_dag_sync(session: Session) -> None:
    """Hold the DAG-sync lock until the transaction ends (PostgreSQL; no-op on SQLite)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": DAG_SYNC_LOCK_KEY})


def load_dag_files(session: Session) -> dict[str, str]:
    """fileloc -> encrypted last good parse result."""
    return {str(f): str(r) for f, r in session.execute(select(DagFile.fileloc, DagFile.result))}


def save_dag_file(session: Session, fileloc: str, token: str, *, now: datetime) -> None:
    session.execute(delete(DagFile).where(DagFile.fileloc == fileloc))
    session.execute(insert(DagFile).values(fileloc=fileloc, result=token, parsed_at=now))


def delete_dag_files(session: Session, filelocs: Iterable[str]) -> None:
    wanted = list(filelocs)
    if wanted:
        session.execute(delete(DagFile).where(DagFile.fileloc.in_(wanted)))


def parse_error_filelocs(session: Session) -> set[str]:
    return set(session.execute(select(DagParseError.fileloc)).scalars())


def replace_parse_errors(
    session: Session, clear: Iterable[str], rows: Sequence[dict[str, Any]]
) -> None:
    """Delete the errors of the files in ``clear`` (and of ``rows``), then insert ``rows``."""
    filelocs = set(clear) | {row["fileloc"] for row in rows}
    if filelocs:
        session.execute(delete(DagParseError).where(DagParseError.fileloc.in_(filelocs)))
    if rows:
        session.execute(insert(DagParseError), list(rows))


def list_parse_errors(session: Session) -> list[ParseErrorRow]:
    rows = session.execute(
        select(
            DagParseError.fileloc,
            DagParseError.error,
            DagParseError.lineno,
            DagParseError.stacktrace,
            DagParseError.timestamp,
        ).order_by(DagParseError.fileloc)
    )
    return [ParseErrorRow(*row) for row in rows]


def load_dags(session: Session) -> dict[str, DagRowState]:
    rows = session.execute(
        select(Dag.dag_id, Dag.fileloc, Dag.is_active, Dag.is_paused, Dag.schedule, Dag.description)
    )
    return {row[0]: DagRowState(*row) for row in rows}


def insert_dag(session: Session, values: dict[str, Any]) -> None:
    session.execute(insert(Dag).values({"is_paused": False, "is_active": True, **values}))


def update_dag(session: Session, dag_id: str, values: dict[str, Any]) -> None:
    session.execute(update(Dag).where(Dag.dag_id == dag_id).values(**values))


def deactivate_dags(session: Session, dag_ids: Iterable[str]) -> None:
    wanted = list(dag_ids)
    if wanted:
        session.execute(update(Dag).where(Dag.dag_id.in_(wanted)).values(is_active=False))


def load_dag_tasks(session: Session) -> dict[str, list[dict[str, Any]]]:
    """dag_id -> its task rows (as dicts, in ``position`` order)."""
    tasks: dict[str, list[dict[str, Any]]] = {}
    rows = session.execute(select(DagTask).order_by(DagTask.dag_id, DagTask.position))
    for (row,) in rows:
        tasks.setdefault(row.dag_id, []).append(
            {
                "task_id": row.task_id,
                "operator": row.operator,
                "downstream_task_ids": row.downstream_task_ids,
                "retries": row.retries,
                "start_from_trigger": row.start_from_trigger,
                "execution_timeout_s": row.execution_timeout_s,
                "position": row.position,
            }
        )
    return tasks


def replace_dag_tasks(session: Session, dag_id: str, rows: Sequence[dict[str, Any]]) -> None:
    session.execute(delete(DagTask).where(DagTask.dag_id == dag_id))
    if rows:
        session.execute(insert(DagTask), [{"dag_id": dag_id, **row} for row in rows])


def load_assets(session: Session) -> dict[str, AssetRowState]:
    rows = session.execute(select(Asset.id, Asset.name, Asset.uri, Asset.extra, Asset.is_active))
    return {row[1]: AssetRowState(*row) for row in rows}


def insert_asset(session: Session, *, name: str, uri: str, extra: Any, now: datetime) -> int:
    result = session.execute(
        insert(Asset)
        .values(name=name, uri=uri, extra=extra, is_active=True, created_at=now, updated_at=now)
        .returning(Asset.id)
    )
    return int(result.scalar_one())


def update_asset(session: Session, asset_id: int, values: dict[str, Any]) -> None:
    session.execute(update(Asset).where(Asset.id == asset_id).values(**values))


def load_schedule_edges(session: Session) -> set[tuple[str, int]]:
    """(dag_id, asset_id) of every schedule reference."""
    rows = session.execute(select(DagScheduleAsset.dag_id, DagScheduleAsset.asset_id))
    return {(str(d), int(a)) for d, a in rows}


def add_schedule_edges(session: Session, edges: Iterable[tuple[str, int]]) -> None:
    rows = [{"dag_id": d, "asset_id": a} for d, a in sorted(edges)]
    if rows:
        session.execute(insert(DagScheduleAsset), rows)


def delete_schedule_edges(session: Session, edges: Iterable[tuple[str, int]]) -> None:
    for dag_id, asset_id in sorted(edges):
        session.execute(
            delete(DagScheduleAsset).where(
                DagScheduleAsset.dag_id == dag_id, DagScheduleAsset.asset_id == asset_id
            )
        )


def load_asset_watchers(session: Session) -> list[WatcherRowState]:
    rows = session.execute(
        select(
            AssetWatcher.id,
            AssetWatcher.asset_id,
            AssetWatcher.name,
            AssetWatcher.trigger_id,
            Trigger.classpath,
            Trigger.kwargs,
            Trigger.stream_digest,
        )
        .join(Trigger, Trigger.id == AssetWatcher.trigger_id)
        .order_by(AssetWatcher.id)
    )
    return [WatcherRowState(*row) for row in rows]


def add_asset_watcher(session: Session, *, asset_id: int, name: str, trigger_id: int) -> int:
    result = session.execute(
        insert(AssetWatcher)
        .values(asset_id=asset_id, name=name, trigger_id=trigger_id)
        .returning(AssetWatcher.id)
    )
    return int(result.scalar_one())


def set_watcher_trigger(session: Session, watcher_id: int, trigger_id: int) -> None:
    session.execute(
        update(AssetWatcher).where(AssetWatcher.id == watcher_id).values(trigger_id=trigger_id)
    )


def delete_asset_watchers(session: Session, watcher_ids: Iterable[int]) -> None:
    wanted = list(watcher_ids)
    if wanted:
        session.execute(delete(AssetWatcher).where(AssetWatcher.id.in_(wanted)))


def delete_triggers(session: Session, trigger_ids: Iterable[int]) -> None:
    wanted = list(trigger_ids)
    if wanted:
        session.execute(delete(Trigger).where(Trigger.id.in_(wanted)))


def dags_scheduled_on(session: Session, asset_ids: Iterable[int]) -> dict[str, Any]:
    """dag_id -> stored schedule of the active, unpaused DAGs scheduled on any of the assets."""
    wanted = list(asset_ids)
    if not wanted:
        return {}
    rows = session.execute(
        select(Dag.dag_id, Dag.schedule)
        .join(DagScheduleAsset, DagScheduleAsset.dag_id == Dag.dag_id)
        .where(
            DagScheduleAsset.asset_id.in_(wanted),
            Dag.is_active.is_(True),
            Dag.is_paused.is_(False),
        )
    )
    return {str(dag_id): schedule for dag_id, schedule in rows}


# --- task execution (engine.executor) ---------------------------------------------------
# Added by the executor work. The SQL lives in engine.store_tasks; the scheduler calls these.


def start_from_trigger(session: Session, cipher: KwargsCipher, ti_id: int) -> bool:
    """Defer a ``scheduled`` start_from_trigger task to the triggerer without a worker.

    See ``engine.store_tasks.start_from_trigger``.
    """
    from engine import store_tasks

    return store_tasks.start_from_trigger(session, cipher, ti_id)


def recover_orphaned_tasks(session: Session, *, threshold_s: float) -> list[int]:
    """Queued / running task instances of dead executors go back to ``scheduled``.

    See ``engine.store_tasks.recover_orphaned_tasks``.
    """
    from engine import store_tasks

    return store_tasks.recover_orphaned_tasks(session, threshold_s=threshold_s)
