"""SQL of task execution: queueing the task instances a claim admitted, starting,
finishing (or leaving ``up_for_retry``) and requeueing those the executor holds. Which ones
a claim admits is ``engine.executor.admission``'s decision; deferral is
``engine.db.queries.deferrals``; the task instances of dead executors are recovered by
``engine.scheduler.orphans`` (a running try whose executor died counts as a failed try).

Every write to a task instance the executor holds is guarded by ``executor_job_id`` and the
state it expects, so an executor that was presumed dead (and whose tasks were recovered)
cannot overwrite what another executor did since.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from sqlalchemy import and_, bindparam, case, func, select, update

from engine.db import models
from engine.db.database import read_rows, rowcount, write_rows
from engine.db.listen import notify_scheduler
from engine.db.models import Dag, DagRun, DagTask, TaskInstance
from engine.db.queries import assets, run_context
from engine.db.queries.assets import EventRow
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session
    from sqlalchemy.sql.elements import ColumnElement

    from engine.db.queries.assets import EventRow
    from engine.db.queries.pools import Candidate


logger = logging.getLogger(__name__)


EXECUTOR_JOB: Final = "executor"
#: The PostgreSQL channel notified (by migration 0019's row triggers) at the commit of a
#: transaction that made task instances ``scheduled``.
SCHEDULED_TASKS_CHANNEL: Final = "sluice_scheduled_tasks"
#: Run on a connection of its own in autocommit mode (``engine.db.listen``).
LISTEN_SCHEDULED_TASKS: Final = f"LISTEN {SCHEDULED_TASKS_CHANNEL}"


_HELD: Final = (TaskState.QUEUED, TaskState.RUNNING)


def scheduled_tasks_digest(session: Session) -> tuple[int, int]:
    """(count, sum of ids) of the task instances waiting for an executor: one indexed read,
    the cheap answer to a wake-up signal before a claim takes the write lock. (0, 0): none;
    the same digest as before: most likely the same rows (e.g. ones no pool admits)."""
    count, total = session.execute(
        select(func.count(TaskInstance.id), func.coalesce(func.sum(TaskInstance.id), 0)).where(
            TaskInstance.state == TaskState.SCHEDULED
        )
    ).one()
    return int(count), int(total)


def queue_task_instances(
    session: Session, admitted: Iterable[Candidate], *, job_id: int, now: datetime
) -> list[int]:
    """Move the ``admitted`` task instances (``engine.executor.admission`` chose them) that
    are still ``scheduled`` to ``queued`` for executor ``job_id``, stamped with their pool
    and slots; returns their ids, sorted."""
    groups: dict[tuple[str, int], list[int]] = {}
    for candidate in admitted:
        groups.setdefault((candidate.pool, candidate.pool_slots), []).append(candidate.ti_id)
    claimed: list[int] = []
    for (pool, slots), ids in groups.items():
        rows = write_rows(
            session,
            update(TaskInstance)
            .where(TaskInstance.id.in_(ids), TaskInstance.state == TaskState.SCHEDULED)
            .values(
                state=TaskState.QUEUED,
                executor_job_id=job_id,
                queued_at=now,
                pool=pool,
                pool_slots=slots,
            )
            .returning(TaskInstance.id),
        )
        claimed.extend(int(i) for i in rows.scalars())
    return sorted(claimed)


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
    #: the run as the task context shows it (``dag_run``): run_id, run_type, logical_date,
    #: data_interval_start / _end, run_after, conf, queued_at, start_date
    run: dict[str, Any] = field(default_factory=dict)
    #: the latest events of each inlet asset, oldest first (``inlet_events``)
    inlet_events: dict[str, tuple[EventRow, ...]] = field(default_factory=dict)
    #: how long a failed try waits for the next (``engine.task_retries.retry_wait_s``)
    retry_delay_s: float = 300.0
    retry_exponential_backoff: bool = False
    max_retry_delay_s: float | None = None
    #: the results of the run's succeeded tasks: {task_id: {key: tagged JSON}}
    xcoms: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the copy of a mapped task this is (-1: an unmapped task)
    map_index: int = -1
    #: the results of the run's succeeded copies of mapped tasks:
    #: {task_id: {map_index (as text): {key: tagged JSON}}}
    mapped_xcoms: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    #: the primary key of the task instance's run (None: not known, e.g. a try read back
    #: from a message)
    run_pk: int | None = None

    def log_fields(self) -> dict[str, object]:
        """The structured fields every log line about this try carries."""
        return try_log_fields(self)


class ATry(Protocol):
    """What names one try of a task instance."""

    @property
    def ti_id(self) -> int: ...
    @property
    def dag_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def try_number(self) -> int: ...
    @property
    def map_index(self) -> int: ...


def try_log_fields(a_try: ATry) -> dict[str, object]:
    """The structured fields every log line about a try carries."""
    return {
        "ti_id": a_try.ti_id,
        "dag_id": a_try.dag_id,
        "run_id": a_try.run_id,
        "task_id": a_try.task_id,
        "try_number": a_try.try_number,
        "map_index": a_try.map_index,
    }


def held_by(ti_id: int, job_id: int, state: str) -> ColumnElement[bool]:
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
        select(TaskInstance).where(held_by(ti_id, job_id, TaskState.QUEUED))
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
    if fresh:  # a new try starts without the results of an earlier one (as in Airflow)
        values.update(
            try_number=ti.try_number + 1,
            start_date=now,
            runtime_s=0.0,
            deferral_count=0,
            xcoms=None,
        )
    elif ti.start_date is None:
        values["start_date"] = now
    session.execute(update(TaskInstance).where(TaskInstance.id == ti_id).values(**values))
    return _task_run(
        session,
        ti,
        try_number=values.get("try_number", ti.try_number),
        try_started_at=values.get("start_date") or ti.start_date or now,
    )


def load_task_run(
    session: Session, ti_id: int, *, try_number: int, now: datetime
) -> TaskRun | None:
    """Try ``try_number`` of a task instance as ``start_task_run`` gave it to its process
    (without changing the row): what a callback of that try, run after its process died,
    needs. None if the task instance is gone."""
    ti = session.get(TaskInstance, ti_id)
    if ti is None:
        return None
    return _task_run(session, ti, try_number=try_number, try_started_at=ti.start_date or now)


def _results_with_own(session: Session, ti: TaskInstance) -> dict[str, Any]:
    """``xcoms`` / ``mapped_xcoms`` of a ``TaskRun``: the run's succeeded tasks' results,
    and a resumed try's own (what it pushed before it deferred, kept as Airflow keeps them:
    its pulls see them and its final results include them)."""
    xcoms, mapped = run_context.all_run_results(session, ti.dag_run_id)
    own = ti.xcoms if ti.next_method is not None and isinstance(ti.xcoms, dict) else None
    if own and ti.map_index < 0:
        xcoms[ti.task_id] = dict(own)
    elif own:
        mapped.setdefault(ti.task_id, {})[str(ti.map_index)] = dict(own)
    return {"xcoms": xcoms, "mapped_xcoms": mapped}


_TASK_SETTINGS = select(
    DagTask.execution_timeout_s,
    DagTask.inlets,
    DagTask.inlet_aliases,
    DagTask.retry_delay_s,
    DagTask.retry_exponential_backoff,
    DagTask.max_retry_delay_s,
).where(DagTask.dag_id == bindparam("dag_id"), DagTask.task_id == bindparam("task_id"))


def _task_run(
    session: Session, ti: TaskInstance, *, try_number: int, try_started_at: datetime
) -> TaskRun:
    dag_run, fileloc = session.execute(
        select(DagRun, Dag.fileloc)
        .join(Dag, Dag.dag_id == DagRun.dag_id)
        .where(DagRun.id == ti.dag_run_id)
    ).one()  # foreign keys: a task instance's run and DAG exist
    run_id = dag_run.run_id
    task_row = read_rows(
        session, _TASK_SETTINGS, {"dag_id": ti.dag_id, "task_id": ti.task_id}
    ).first()
    timeout_s = None if task_row is None else task_row[0]
    inlets = [] if task_row is None else list(task_row[1] or [])
    inlet_aliases = [] if task_row is None else list(task_row[2] or [])
    return TaskRun(
        ti_id=ti.id,
        dag_id=ti.dag_id,
        run_id=str(run_id),
        task_id=ti.task_id,
        fileloc=str(fileloc),
        try_number=try_number,
        max_tries=ti.max_tries,
        try_started_at=try_started_at,
        next_method=ti.next_method,
        next_kwargs=ti.next_kwargs,
        deferral_count=ti.deferral_count,
        execution_timeout_s=None if timeout_s is None else int(timeout_s),
        **_retry_settings(task_row),
        map_index=ti.map_index,
        **_results_with_own(session, ti),
        run=run_context.context_run(dag_run),
        run_pk=ti.dag_run_id,
        inlet_events={
            **{
                name: tuple(run_context.event_row(event, name, uri) for event in events)
                for name, (uri, events) in assets.recent_asset_events(session, inlets).items()
            },
            **{
                alias: tuple(
                    run_context.event_row(event, asset_name, uri)
                    for event, asset_name, uri in events
                )
                for alias, events in assets.recent_alias_events(session, inlet_aliases).items()
            },
        },
    )


def _retry_settings(task_row: Any) -> dict[str, Any]:
    """The ``TaskRun`` retry fields from the task's row (``start_task_run``); the defaults
    when the task is gone from its DAG."""
    if task_row is None:
        return {}
    return {
        "retry_delay_s": float(task_row.retry_delay_s),
        "retry_exponential_backoff": bool(task_row.retry_exponential_backoff),
        "max_retry_delay_s": (
            None if task_row.max_retry_delay_s is None else float(task_row.max_retry_delay_s)
        ),
    }


def _try_ended(elapsed_s: float, now: datetime) -> dict[str, Any]:
    """What every end of a try writes: its run time, no deferral, no executor."""
    return {
        "runtime_s": TaskInstance.runtime_s + elapsed_s,
        "next_method": None,
        "next_kwargs": None,
        "trigger_timeout": None,
        "executor_job_id": None,
        "end_date": now,
    }


def retry_task(
    session: Session,
    ti_id: int,
    *,
    job_id: int,
    elapsed_s: float,
    now: datetime,
    retry_at: datetime,
) -> bool:
    """End a failed try that has tries left: ``up_for_retry`` until ``retry_at``.

    It holds no executor slot meanwhile; once ``retry_at`` has passed the scheduler makes it
    ``scheduled`` again (``runs.release_due_retries``) and an executor starts the next try.
    """
    values = {
        "state": TaskState.UP_FOR_RETRY,
        **_try_ended(elapsed_s, now),
        "queued_at": None,
        "next_retry_at": retry_at,
    }
    result = write_rows(
        session,
        update(TaskInstance).where(held_by(ti_id, job_id, TaskState.RUNNING)).values(**values),
    )
    return rowcount(result) == 1


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
    """End the try: ``success``, ``failed`` or ``skipped`` (a retry: ``retry_task``)."""
    values: dict[str, Any] = {"state": state, **_try_ended(elapsed_s, now)}
    if xcoms is not None:
        values["xcoms"] = xcoms
    result = write_rows(
        session,
        update(TaskInstance).where(held_by(ti_id, job_id, TaskState.RUNNING)).values(**values),
    )
    if rowcount(result) != 1:
        return False
    # a scheduler elsewhere decides the tasks below it now (one here is nudged by the executor)
    notify_scheduler(session, nudged_here=True)
    return True


def succeed_task(
    session: Session,
    run: TaskRun,
    *,
    job_id: int,
    elapsed_s: float,
    now: datetime,
    xcoms: dict[str, Any] | None,
    outlet_events: list[dict[str, Any]],
    keep_while_paused: bool = True,
    skip_task_ids: Sequence[str] = (),
) -> bool:
    """Record a success and, in the same transaction, the task's outlet asset events and
    the tasks of the run it skips (a branch's: ``skip_waiting_tasks``)."""
    if not finish_task(
        session,
        run.ti_id,
        job_id=job_id,
        state=TaskState.SUCCESS,
        elapsed_s=elapsed_s,
        now=now,
        xcoms=xcoms,
    ):
        return False
    source = assets.TaskTry(run.ti_id, run.dag_id, run.run_id, run.task_id, run.try_number)
    assets.record_task_outlet_events(
        session, source, outlet_events, keep_while_paused=keep_while_paused, now=now
    )
    skip_waiting_tasks(session, run.ti_id, skip_task_ids, now=now)
    return True


def skip_waiting_tasks(
    session: Session, ti_id: int, task_ids: Sequence[str], *, now: datetime
) -> list[str]:
    """Mark the tasks ``task_ids`` of task instance ``ti_id``'s run that still wait (``none``)
    as ``skipped``; returns those it marked. A task already scheduled or finished keeps its
    state (the trigger rules decided it before the branch did)."""
    if not task_ids:
        return []
    run_pk = select(TaskInstance.dag_run_id).where(TaskInstance.id == ti_id).scalar_subquery()
    rows = session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.dag_run_id == run_pk,
            TaskInstance.task_id.in_(list(task_ids)),
            TaskInstance.state == TaskState.NONE,
        )
        .values(state=TaskState.SKIPPED, end_date=now)
        .returning(TaskInstance.task_id)
    )
    return sorted(str(task_id) for task_id in rows.scalars())


def fail_held_task(session: Session, ti_id: int, *, job_id: int) -> bool:
    """Fail a task this executor holds whose step could not be run or recorded."""
    result = session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.id == ti_id,
            TaskInstance.executor_job_id == job_id,
            TaskInstance.state.in_(_HELD),
        )
        .values(state=TaskState.FAILED, end_date=models.utcnow(), executor_job_id=None)
    )
    return rowcount(result) == 1


def requeue_values() -> dict[str, Any]:
    """Back to ``scheduled``: a running try reruns its step as the same try (a fresh one's
    ``try_number`` is given back: ``start_task_run`` counts it again); a queued one, which
    never started, is untouched otherwise."""
    fresh = and_(TaskInstance.state == TaskState.RUNNING, TaskInstance.next_method.is_(None))
    return {
        "state": TaskState.SCHEDULED,
        "executor_job_id": None,
        "queued_at": None,
        "pid": None,
        "try_number": case((fresh, TaskInstance.try_number - 1), else_=TaskInstance.try_number),
    }


def requeue_task(session: Session, ti_id: int, *, job_id: int) -> bool:
    """Give back a task this executor holds (shutdown): it reruns its step as the same try."""
    result = session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.id == ti_id,
            TaskInstance.executor_job_id == job_id,
            TaskInstance.state.in_(_HELD),
        )
        .values(**requeue_values())
    )
    return rowcount(result) == 1
