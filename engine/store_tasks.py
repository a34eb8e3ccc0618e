"""SQL of task execution: claiming, running, finishing, deferring and recovering tasks.

Split from ``engine.store`` by domain, like ``engine.store_runs``. Every write to a task
instance the executor holds is guarded by ``executor_job_id`` and the state it expects, so
an executor that was presumed dead (and whose tasks were recovered) cannot overwrite what
another executor did since. The scheduler reaches ``start_from_trigger`` and
``recover_orphaned_tasks`` through ``engine.store``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import and_, case, or_, select, true, update

from engine import store
from engine.exceptions import DecryptionError
from engine.models import (
    Asset,
    AssetEvent,
    Dag,
    DagRun,
    DagRunAssetEvent,
    DagTask,
    TaskInstance,
    TaskState,
    TriggerKind,
)
from engine.task_runner import EventRow
from triggers.exceptions import SerializationError
from triggers.serde import dumps, loads, loads_kwargs

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session
    from sqlalchemy.sql.elements import ColumnElement

    from engine.crypto import KwargsCipher
    from engine.task_runner import Deferral

logger = logging.getLogger(__name__)

EXECUTOR_JOB: Final = "executor"
_HELD: Final = (TaskState.QUEUED, TaskState.RUNNING)


def _is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _rowcount(result: Any) -> int:
    return int(result.rowcount)


def deferral_deadline(
    now: datetime,
    timeout_s: float | None,
    try_started: datetime | None,
    execution_timeout_s: float | None,
) -> datetime | None:
    """When a deferral times out: the earlier of ``defer(timeout=)`` and the try's
    ``execution_timeout`` deadline (which counts deferrals); None when neither is set."""
    candidates = []
    if timeout_s is not None:
        candidates.append(now + timedelta(seconds=timeout_s))
    if execution_timeout_s is not None:
        candidates.append((try_started or now) + timedelta(seconds=execution_timeout_s))
    return min(candidates) if candidates else None


# --- claiming and starting ------------------------------------------------------------------


def claim_task_instances(session: Session, *, job_id: int, limit: int, now: datetime) -> list[int]:
    """Move up to ``limit`` ``scheduled`` task instances to ``queued`` for executor ``job_id``.

    ``SKIP LOCKED`` on PostgreSQL: two executors never take the same row; on SQLite the
    ``BEGIN IMMEDIATE`` transaction serializes claims.
    """
    if limit <= 0:
        return []
    candidates = (
        select(TaskInstance.id)
        .where(TaskInstance.state == TaskState.SCHEDULED)
        .order_by(TaskInstance.id)
        .limit(limit)
    )
    if _is_postgres(session):
        candidates = candidates.with_for_update(skip_locked=True)
    ids = list(session.execute(candidates).scalars())
    if not ids:
        return []
    rows = session.execute(
        update(TaskInstance)
        .where(TaskInstance.id.in_(ids), TaskInstance.state == TaskState.SCHEDULED)
        .values(state=TaskState.QUEUED, executor_job_id=job_id, queued_at=now)
        .returning(TaskInstance.id)
    )
    return sorted(int(i) for i in rows.scalars())


@dataclass(frozen=True, slots=True)
class TaskRun:
    """A task instance just marked ``running``, with what its child process needs."""

    ti_id: int
    dag_id: str
    run_id: str
    task_id: str
    fileloc: str
    try_number: int
    max_tries: int
    try_started_at: datetime
    next_method: str | None
    next_kwargs: str | None
    deferral_count: int
    execution_timeout_s: int | None
    events: tuple[EventRow, ...]

    def log_fields(self) -> dict[str, object]:
        """The structured fields every log line about this try carries."""
        return {
            "ti_id": self.ti_id,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "try_number": self.try_number,
        }


def _held_by(ti_id: int, job_id: int, state: str) -> ColumnElement[bool]:
    return and_(
        TaskInstance.id == ti_id,
        TaskInstance.executor_job_id == job_id,
        TaskInstance.state == state,
    )


def start_task_run(
    session: Session, ti_id: int, *, job_id: int, pid: int | None, hostname: str, now: datetime
) -> TaskRun | None:
    """Mark a task instance this executor queued as ``running``; None if it is not ours.

    A fresh try (no ``next_method``) increments ``try_number`` and restarts the try's clock
    (``start_date``, ``runtime_s``, ``deferral_count``); a resumed one keeps them.
    """
    ti = session.execute(
        select(TaskInstance).where(_held_by(ti_id, job_id, TaskState.QUEUED))
    ).scalar_one_or_none()
    if ti is None:
        return None
    fresh = ti.next_method is None
    values: dict[str, Any] = {
        "state": TaskState.RUNNING,
        "hostname": hostname,
        "pid": pid,
        "end_date": None,
    }
    if fresh:
        values.update(try_number=ti.try_number + 1, start_date=now, runtime_s=0.0, deferral_count=0)
    elif ti.start_date is None:
        values["start_date"] = now
    session.execute(update(TaskInstance).where(TaskInstance.id == ti_id).values(**values))
    run_id, fileloc = session.execute(
        select(DagRun.run_id, Dag.fileloc)
        .join(Dag, Dag.dag_id == DagRun.dag_id)
        .where(DagRun.id == ti.dag_run_id)
    ).one()  # foreign keys: a task instance's run and DAG exist
    timeout_s = session.execute(
        select(DagTask.execution_timeout_s).where(
            DagTask.dag_id == ti.dag_id, DagTask.task_id == ti.task_id
        )
    ).scalar()
    return TaskRun(
        ti_id=ti_id,
        dag_id=ti.dag_id,
        run_id=str(run_id),
        task_id=ti.task_id,
        fileloc=str(fileloc),
        try_number=values.get("try_number", ti.try_number),
        max_tries=ti.max_tries,
        try_started_at=values.get("start_date") or ti.start_date or now,
        next_method=ti.next_method,
        next_kwargs=ti.next_kwargs,
        deferral_count=ti.deferral_count,
        execution_timeout_s=None if timeout_s is None else int(timeout_s),
        events=tuple(triggering_events(session, ti.dag_run_id)),
    )


def triggering_events(session: Session, dag_run_id: int) -> list[EventRow]:
    """The asset events that triggered the run, in id order."""
    rows = session.execute(
        select(
            AssetEvent.id,
            Asset.name,
            AssetEvent.payload,
            AssetEvent.timestamp,
            AssetEvent.source_watcher,
        )
        .join(DagRunAssetEvent, DagRunAssetEvent.asset_event_id == AssetEvent.id)
        .join(Asset, Asset.id == AssetEvent.asset_id)
        .where(DagRunAssetEvent.dag_run_id == dag_run_id)
        .order_by(AssetEvent.id)
    )
    return [EventRow(int(i), str(n), p, t, w) for i, n, p, t, w in rows]


# --- outcomes -------------------------------------------------------------------------------


def finish_task(
    session: Session,
    ti_id: int,
    *,
    job_id: int,
    state: str,
    elapsed_s: float,
    now: datetime,
    xcoms: dict[str, Any] | None = None,
) -> bool:
    """End the try: ``success`` / ``failed``, or ``scheduled`` for a retry (a fresh try)."""
    values: dict[str, Any] = {
        "state": state,
        "runtime_s": TaskInstance.runtime_s + elapsed_s,
        "next_method": None,
        "next_kwargs": None,
        "trigger_timeout": None,
        "executor_job_id": None,
    }
    if state == TaskState.SCHEDULED:
        values["queued_at"] = None
    else:
        values["end_date"] = now
    if xcoms is not None:
        values["xcoms"] = xcoms
    result = session.execute(
        update(TaskInstance).where(_held_by(ti_id, job_id, TaskState.RUNNING)).values(**values)
    )
    return _rowcount(result) == 1


def defer_task(
    session: Session,
    cipher: KwargsCipher,
    ti_id: int,
    *,
    job_id: int,
    deferral: Deferral,
    trigger_timeout: datetime | None,
    elapsed_s: float,
) -> int | None:
    """Store the trigger (kwargs encrypted) and move the task to ``deferred``, in one
    transaction; returns the trigger id, or None if the task is no longer ours."""
    held = session.execute(
        select(TaskInstance.id).where(_held_by(ti_id, job_id, TaskState.RUNNING))
    ).scalar()
    if held is None:
        return None
    trigger_id = store.add_trigger_row(
        session,
        cipher,
        deferral.classpath,
        loads_kwargs(deferral.trigger_kwargs),
        kind=TriggerKind.TASK,
    )
    session.execute(
        update(TaskInstance)
        .where(TaskInstance.id == ti_id)
        .values(
            state=TaskState.DEFERRED,
            trigger_id=trigger_id,
            next_method=deferral.method_name,
            next_kwargs=deferral.kwargs,
            trigger_timeout=trigger_timeout,
            runtime_s=TaskInstance.runtime_s + elapsed_s,
            deferral_count=TaskInstance.deferral_count + 1,
            executor_job_id=None,
            pid=None,
        )
    )
    return trigger_id


def fail_held_task(session: Session, ti_id: int, *, job_id: int) -> bool:
    """Fail a task this executor holds whose step could not be run or recorded."""
    result = session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.id == ti_id,
            TaskInstance.executor_job_id == job_id,
            TaskInstance.state.in_(_HELD),
        )
        .values(state=TaskState.FAILED, end_date=store.utcnow(), executor_job_id=None)
    )
    return _rowcount(result) == 1


def _requeue_values(*, same_try: bool) -> dict[str, Any]:
    """Back to ``scheduled``. A running try either reruns its step as the same try
    (``same_try``) or starts over as a fresh try; a queued one is untouched otherwise."""
    running = TaskInstance.state == TaskState.RUNNING
    values: dict[str, Any] = {
        "state": TaskState.SCHEDULED,
        "executor_job_id": None,
        "queued_at": None,
        "pid": None,
    }
    if same_try:
        fresh = and_(running, TaskInstance.next_method.is_(None))
        values["try_number"] = case(
            (fresh, TaskInstance.try_number - 1), else_=TaskInstance.try_number
        )
    else:
        values["next_method"] = case((running, None), else_=TaskInstance.next_method)
        values["next_kwargs"] = case((running, None), else_=TaskInstance.next_kwargs)
    return values


def requeue_task(session: Session, ti_id: int, *, job_id: int) -> bool:
    """Give back a task this executor holds (shutdown): it reruns its step as the same try."""
    result = session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.id == ti_id,
            TaskInstance.executor_job_id == job_id,
            TaskInstance.state.in_(_HELD),
        )
        .values(**_requeue_values(same_try=True))
    )
    return _rowcount(result) == 1


def recover_orphaned_tasks(session: Session, *, threshold_s: float) -> list[int]:
    """Queued / running task instances whose executor is dead go back to ``scheduled``.

    Dead: no executor job with a heartbeat newer than ``threshold_s`` holds them. A running
    one starts over as a fresh try (its process is gone with its executor).
    """
    alive = store.alive_job_ids(session, job_type=EXECUTOR_JOB, threshold_s=threshold_s)
    not_alive = (
        or_(TaskInstance.executor_job_id.is_(None), TaskInstance.executor_job_id.not_in(alive))
        if alive
        else true()
    )
    orphaned = and_(TaskInstance.state.in_(_HELD), not_alive)
    candidates = select(TaskInstance.id).where(orphaned)
    if _is_postgres(session):
        candidates = candidates.with_for_update(skip_locked=True)
    ids = sorted(int(i) for i in session.execute(candidates).scalars())
    if ids:
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.id.in_(ids), orphaned)
            .values(**_requeue_values(same_try=False))
        )
        logger.warning(
            "Recovered %d task instance(s) of dead executors: %s",
            len(ids),
            ids,
            extra={"action": "tasks_recovered", "ti_ids": ids},
        )
    return ids


# --- deferral without a worker, and resumption ----------------------------------------------


def _decode_start_trigger(cipher: KwargsCipher, token: str, where: str) -> dict[str, Any] | None:
    try:
        document = loads(cipher.decrypt(token))
        if not isinstance(document, dict):
            raise SerializationError("not a mapping")
        document["kwargs"] = loads_kwargs(str(document["kwargs"]))
        return document
    except (DecryptionError, SerializationError, KeyError) as exc:
        logger.warning(
            "Cannot read the stored start_trigger_args of %s (%s); it will start on a worker",
            where,
            exc,
            extra={"action": "start_trigger_unreadable"},
        )
        return None


def start_from_trigger(session: Session, cipher: KwargsCipher, ti_id: int) -> bool:
    """Defer a ``scheduled`` start_from_trigger task straight to the triggerer (no worker).

    Writes its trigger row and the ``deferred`` state; this starts a fresh try. False when
    the task has no stored trigger args (or they cannot be read): the executor then runs
    it, and the task defers through ``deferral_at_start`` instead.
    """
    row = session.execute(
        select(TaskInstance.state, DagTask.start_trigger, DagTask.execution_timeout_s)
        .join(
            DagTask,
            and_(DagTask.dag_id == TaskInstance.dag_id, DagTask.task_id == TaskInstance.task_id),
        )
        .where(TaskInstance.id == ti_id)
    ).first()
    if row is None or row[0] != TaskState.SCHEDULED or row[1] is None:
        return False
    args = _decode_start_trigger(cipher, row[1], f"task instance {ti_id}")
    if args is None:
        return False
    now = store.utcnow()
    trigger_id = store.add_trigger_row(
        session, cipher, str(args["classpath"]), args["kwargs"], kind=TriggerKind.TASK
    )
    result = session.execute(
        update(TaskInstance)
        .where(TaskInstance.id == ti_id, TaskInstance.state == TaskState.SCHEDULED)
        .values(
            state=TaskState.DEFERRED,
            trigger_id=trigger_id,
            next_method=str(args["next_method"]),
            next_kwargs=str(args["next_kwargs"]),
            trigger_timeout=deferral_deadline(now, args["timeout_s"], now, row[2]),
            try_number=TaskInstance.try_number + 1,
            start_date=now,
            end_date=None,
            runtime_s=0.0,
            deferral_count=1,
        )
    )
    return _rowcount(result) == 1


def resume_deferred_tasks_with_event(session: Session, trigger_id: int, payload: Any) -> int:
    """Move the tasks deferred on ``trigger_id`` to ``scheduled``; each resumes with the
    kwargs it gave ``defer(kwargs=...)`` plus ``event=payload``."""
    rows = session.execute(
        select(TaskInstance.id, TaskInstance.next_kwargs).where(
            TaskInstance.trigger_id == trigger_id, TaskInstance.state == TaskState.DEFERRED
        )
    ).all()
    resumed = 0
    for ti_id, stored in rows:
        kwargs = _stored_kwargs(stored, ti_id)
        result = session.execute(
            update(TaskInstance)
            .where(TaskInstance.id == ti_id, TaskInstance.state == TaskState.DEFERRED)
            .values(
                state=TaskState.SCHEDULED,
                next_kwargs=dumps({**kwargs, "event": payload}, where="next_kwargs"),
                trigger_id=None,
                trigger_timeout=None,
            )
        )
        resumed += _rowcount(result)
    return resumed


def _stored_kwargs(stored: str | None, ti_id: int) -> dict[str, Any]:
    if not stored:
        return {}
    try:
        value = loads(stored)
    except SerializationError as exc:
        logger.warning(
            "Task instance %s has unreadable defer kwargs (%s); resuming with the event only",
            ti_id,
            exc,
            extra={"action": "next_kwargs_unreadable", "ti_id": ti_id},
        )
        return {}
    return dict(value) if isinstance(value, dict) else {}


def load_start_triggers(session: Session) -> dict[tuple[str, str], str]:
    """(dag_id, task_id) -> encrypted start trigger, for tasks that have one."""
    rows = session.execute(
        select(DagTask.dag_id, DagTask.task_id, DagTask.start_trigger).where(
            DagTask.start_trigger.is_not(None)
        )
    )
    return {(str(d), str(t)): str(token) for d, t, token in rows}
