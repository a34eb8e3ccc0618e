"""SQL of scheduling: DAG runs (created, admitted under ``max_active_runs``, advanced,
ended) and runs' triggering events (a DAG's queue of asset events is in ``asset_queue``,
the run listings in ``browse``, the next run of time-scheduled DAGs in ``time_schedules``).

A run is created ``queued``; ``start_queued_runs`` admits it (``running``) once its DAG has
room under ``max_active_runs`` (a backfill's runs count against the backfill's own limit
instead, as in Airflow 3) and its ``run_after`` has passed; only running runs get tasks.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, func, insert, or_, select, update

from engine.db.database import is_postgres, read_rows, rowcount, upsert_insert, write_rows
from engine.db.listen import notify_scheduler
from engine.db.models import (
    Backfill,
    Dag,
    DagRun,
    DagRunAssetEvent,
    DagTask,
    TaskInstance,
)
from engine.db.queries import asset_queue
from engine.db.queries import mapping as mapping_sql
from engine.states import DagRunState, TaskState

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session


ASSET_TRIGGERED = "asset_triggered"
MANUAL = "manual"
SCHEDULED = "scheduled"
BACKFILL = "backfill"
_ACTIVE = (DagRunState.QUEUED, DagRunState.RUNNING)


def run_id_for(run_type: str, *, logical_date: datetime | None, now: datetime) -> str:
    """Airflow's run ids: ``scheduled__<logical date>`` for a time run (one per interval);
    a unique suffix for the others."""
    if run_type in (SCHEDULED, BACKFILL) and logical_date is not None:
        return f"{run_type}__{logical_date.isoformat()}"
    stamp = (logical_date or now).isoformat(timespec="microseconds")
    return f"{run_type}__{stamp}_{uuid.uuid4().hex[:6]}"


def create_run(
    session: Session,
    dag_id: str,
    *,
    run_type: str,
    now: datetime,
    asset_event_ids: Sequence[int] = (),
    conf: Any = None,
    logical_date: datetime | None = None,
    data_interval: tuple[datetime, datetime] | None = None,
    run_after: datetime | None = None,
    backfill_id: int | None = None,
    partition_key: str | None = None,
    run_id: str | None = None,
    keep_queued: Collection[int] = (),
) -> int | None:
    """A queued DAG run with its task instances; consumes the given queued asset events
    (but those of ``keep_queued``, which stay queued: a partitioned DAG's event that other
    keys still wait for).

    ``partition_key``: the slice a partitioned run stands for. ``run_id``: its own (default:
    ``run_id_for``); a partition backfill gives one per key, so a repeated insert does
    nothing.

    None when the DAG already has a run for ``logical_date`` (unique per DAG: two schedulers
    never create one interval twice; the loser's insert does nothing), or ``run_id`` (given
    by the caller instead of made from the run type).
    """
    values = {
        "dag_id": dag_id,
        "run_id": run_id or run_id_for(run_type, logical_date=logical_date, now=now),
        "run_type": run_type,
        "conf": conf,
        "queued_at": now,
        "logical_date": logical_date,
        "data_interval_start": None if data_interval is None else data_interval[0],
        "data_interval_end": None if data_interval is None else data_interval[1],
        "run_after": run_after or now,
        "backfill_id": backfill_id,
        "partition_key": partition_key,
    }
    stmt = upsert_insert(session, DagRun).values(values)
    if logical_date is not None or run_id is not None:
        # No conflict target: a run of a logical date also has a deterministic run_id, and
        # PostgreSQL may meet either unique index first when two writers race.
        stmt = stmt.on_conflict_do_nothing()
    found = session.execute(stmt.returning(DagRun.id)).scalar()
    if found is None:
        return None
    run_pk = int(found)
    notify_scheduler(session)  # a scheduler elsewhere admits it now
    if asset_event_ids:
        session.execute(
            insert(DagRunAssetEvent),
            [{"dag_run_id": run_pk, "asset_event_id": e} for e in asset_event_ids],
        )
        asset_queue.dequeue_asset_events(
            session, dag_id, [e for e in asset_event_ids if e not in set(keep_queued)]
        )
    tasks = session.execute(
        select(DagTask.task_id, DagTask.retries).where(DagTask.dag_id == dag_id)
    ).all()
    if tasks:
        session.execute(
            insert(TaskInstance),
            [
                {
                    "dag_run_id": run_pk,
                    "dag_id": dag_id,
                    "task_id": t,
                    "max_tries": r,
                    "state": TaskState.NONE,
                }
                for t, r in tasks
            ],
        )
    return run_pk


def rerun_run(session: Session, run_pk: int, *, now: datetime, backfill_id: int | None) -> None:
    """Queue a finished run again (backfill ``--reprocess``): every task starts over.

    ``try_number`` goes on counting (logs of earlier tries stay apart) and each task gets
    its retries again (``max_tries`` = tries so far + the task's retries, as Airflow's clear).
    """
    session.execute(
        update(DagRun)
        .where(DagRun.id == run_pk)
        .values(
            state=DagRunState.QUEUED,
            queued_at=now,
            start_date=None,
            end_date=None,
            backfill_id=backfill_id,
        )
    )
    session.execute(
        update(TaskInstance)
        .where(TaskInstance.dag_run_id == run_pk)
        .values(
            state=TaskState.NONE,
            start_date=None,
            end_date=None,
            next_method=None,
            next_kwargs=None,
            trigger_id=None,
            trigger_timeout=None,
            executor_job_id=None,
            queued_at=None,
            next_retry_at=None,
            max_tries=TaskInstance.try_number
            + func.coalesce(
                select(DagTask.retries)
                .where(
                    DagTask.dag_id == TaskInstance.dag_id, DagTask.task_id == TaskInstance.task_id
                )
                .scalar_subquery(),
                0,
            ),
        )
    )


def count_active_runs(session: Session, dag_id: str) -> int:
    """Queued and running runs of the DAG that count against its ``max_active_runs``."""
    return int(
        session.execute(
            select(func.count())
            .select_from(DagRun)
            .where(
                DagRun.dag_id == dag_id,
                DagRun.state.in_(_ACTIVE),
                DagRun.backfill_id.is_(None),
            )
        ).scalar_one()
    )


# --- admission ----------------------------------------------------------------------------


def dags_with_queued_runs(session: Session, *, now: datetime) -> list[str]:
    """Unpaused DAGs with queued runs that may start (a paused DAG's wait, as in Airflow)."""
    rows = session.execute(
        select(DagRun.dag_id)
        .join(Dag, Dag.dag_id == DagRun.dag_id)
        .where(
            DagRun.state == DagRunState.QUEUED,
            Dag.is_paused.is_(False),
            or_(DagRun.run_after.is_(None), DagRun.run_after <= now),
        )
        .distinct()
    )
    return sorted(str(r) for r in rows.scalars())


def start_queued_runs(
    session: Session, dag_id: str, *, now: datetime | Callable[[], datetime]
) -> list[int]:
    """Admit the DAG's queued runs while it has room; returns the runs now ``running``.
    ``now``: the time, or a clock read in the transaction, the start stamped after the read
    of the runs (a run another transaction ended before it ended before these start, by
    their timestamps too).

    Ordinary runs: at most ``max_active_runs`` running at once, in ``run_after`` order
    (asset-triggered runs, without a logical date, wait their turn like the others). A
    backfill's runs: at most the backfill's own ``max_active_runs``, in the same order (their
    run_after is their logical date's).
    """
    stmt = select(Dag.max_active_runs).where(Dag.dag_id == dag_id)
    if is_postgres(session):
        stmt = stmt.with_for_update(skip_locked=True)
    limit = session.execute(stmt).scalar()
    clock = now if callable(now) else lambda: now
    if limit is None:
        return []
    rows = session.execute(
        select(DagRun.id, DagRun.state, DagRun.backfill_id, Backfill.max_active_runs)
        .outerjoin(Backfill, Backfill.id == DagRun.backfill_id)
        .where(
            DagRun.dag_id == dag_id,
            DagRun.state.in_(_ACTIVE),
            or_(DagRun.run_after.is_(None), DagRun.run_after <= clock()),
        )
        .order_by(func.coalesce(DagRun.run_after, DagRun.queued_at), DagRun.id)
    ).all()
    running: dict[int | None, int] = {}
    for _, state, backfill_id, _ in rows:
        if state == DagRunState.RUNNING:
            running[backfill_id] = running.get(backfill_id, 0) + 1
    started: list[int] = []
    for run_pk, state, backfill_id, backfill_limit in rows:
        if state != DagRunState.QUEUED:
            continue
        cap = int(limit) if backfill_id is None else int(backfill_limit or 1)
        if running.get(backfill_id, 0) >= cap:
            continue
        running[backfill_id] = running.get(backfill_id, 0) + 1
        started.append(int(run_pk))
    if started:
        session.execute(
            update(DagRun)
            .where(DagRun.id.in_(started), DagRun.state == DagRunState.QUEUED)
            .values(state=DagRunState.RUNNING, start_date=clock())  # after the read
        )
    return started


def release_due_retries(session: Session, *, now: datetime) -> list[int]:
    """Tasks ``up_for_retry`` whose ``next_retry_at`` has passed go back to ``scheduled``:
    an executor starts their next try. Only in the runs whose tasks advance (running, DAG
    not paused: a paused DAG's retry waits like its other tasks). Returns their ids.

    One guarded ``UPDATE``: two schedulers never release a task twice.
    """
    advancing = (
        select(DagRun.id)
        .join(Dag, Dag.dag_id == DagRun.dag_id)
        .where(DagRun.state == DagRunState.RUNNING, Dag.is_paused.is_(False))
    )
    released = session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.state == TaskState.UP_FOR_RETRY,
            # None: put in up_for_retry by hand, without a time: due at once
            or_(TaskInstance.next_retry_at.is_(None), TaskInstance.next_retry_at <= now),
            TaskInstance.dag_run_id.in_(advancing),
        )
        .values(state=TaskState.SCHEDULED, next_retry_at=None)
        .returning(TaskInstance.id)
    )
    return sorted(int(i) for i in released.scalars())


@dataclass(frozen=True, slots=True)
class RunState:
    run_pk: int
    dag_id: str
    state: str
    downstream: dict[str, list[str]]
    task_states: dict[str, str]
    start_from_trigger: frozenset[str]
    ti_ids: dict[str, int]
    trigger_rules: dict[str, str]  # task id -> its trigger rule (``TriggerRule`` value)
    #: expanded mapped tasks: task id -> the states of its copies by ``map_index``
    #: (``task_states`` holds their summary, ``engine.advancing.rules.summary_state``)
    expanded: dict[str, list[str]] = field(default_factory=dict)
    #: mapped tasks: task id -> what it maps over (``dag_task.mapping``)
    mappings: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the setup tasks, and the teardowns whose failure does not fail the run
    setups: frozenset[str] = frozenset()
    ignored_teardowns: frozenset[str] = frozenset()


#: ``load_run_state``'s reads, built once (``read_rows``): the run (locked on PostgreSQL,
#: ``SKIP LOCKED``), its DAG's tasks, its unmapped task instances
_RUN_ROW = select(DagRun.dag_id, DagRun.state).where(DagRun.id == bindparam("run_pk"))
_RUN_ROW_LOCKED = _RUN_ROW.with_for_update(skip_locked=True)
_RUN_TASKS = select(
    DagTask.task_id,
    DagTask.downstream_task_ids,
    DagTask.start_from_trigger,
    DagTask.trigger_rule,
    DagTask.is_setup,
    DagTask.is_teardown,
    DagTask.on_failure_fail_dagrun,
    DagTask.mapping,
).where(DagTask.dag_id == bindparam("dag_id"))
_RUN_TIS = select(TaskInstance.task_id, TaskInstance.state, TaskInstance.id).where(
    TaskInstance.dag_run_id == bindparam("run_pk"), TaskInstance.map_index == -1
)


def load_run_state(session: Session, run_pk: int) -> RunState | None:
    run_row = _RUN_ROW_LOCKED if is_postgres(session) else _RUN_ROW
    row = read_rows(session, run_row, {"run_pk": run_pk}).first()
    if row is None:
        return None
    dag_id, state = str(row[0]), str(row[1])
    tasks = read_rows(session, _RUN_TASKS, {"dag_id": dag_id}).all()
    tis = read_rows(session, _RUN_TIS, {"run_pk": run_pk}).all()
    expanded = mapping_sql.mapped_states(session, run_pk)
    return RunState(
        run_pk=run_pk,
        dag_id=dag_id,
        state=state,
        downstream={str(t.task_id): list(t.downstream_task_ids or []) for t in tasks},
        task_states={str(t): str(s) for t, s, _ in tis},
        start_from_trigger=frozenset(str(t.task_id) for t in tasks if t.start_from_trigger),
        ti_ids={str(t): int(i) for t, _, i in tis},
        trigger_rules={str(t.task_id): str(t.trigger_rule) for t in tasks},
        expanded=expanded,
        # (``mapping_sql.task_mappings``, read with the tasks rather than again)
        mappings={str(t.task_id): dict(t.mapping) for t in tasks if isinstance(t.mapping, dict)},
        setups=frozenset(str(t.task_id) for t in tasks if t.is_setup),
        ignored_teardowns=frozenset(
            str(t.task_id) for t in tasks if t.is_teardown and not t.on_failure_fail_dagrun
        ),
    )


def set_task_states(
    session: Session, run_pk: int, changes: dict[str, str], *, now: datetime
) -> None:
    for task_id, state in changes.items():
        values: dict[str, Any] = {"state": state}
        if state in (TaskState.UPSTREAM_FAILED, TaskState.SKIPPED, TaskState.FAILED):
            values["end_date"] = now
        write_rows(
            session,
            update(TaskInstance)
            .where(
                TaskInstance.dag_run_id == run_pk,
                TaskInstance.task_id == task_id,
                TaskInstance.state == TaskState.NONE,
            )
            .values(**values),
        )


def end_running_run(session: Session, run_pk: int, state: str, *, now: datetime) -> bool:
    """End a ``running`` run as ``state``; False when it is not running any more (an
    operator cancelled it, its ``dagrun_timeout`` ended it, another scheduler finished it):
    the first writer's state stands."""
    ended = write_rows(
        session,
        update(DagRun)
        .where(DagRun.id == run_pk, DagRun.state == DagRunState.RUNNING)
        .values(state=state, end_date=now),
    )
    return rowcount(ended) > 0


def run_asset_events(session: Session, run_pks: Iterable[int]) -> dict[int, list[int]]:
    rows = session.execute(
        select(DagRunAssetEvent.dag_run_id, DagRunAssetEvent.asset_event_id).where(
            DagRunAssetEvent.dag_run_id.in_(list(run_pks))
        )
    )
    out: dict[int, list[int]] = {}
    for run_pk, event_id in rows:
        out.setdefault(int(run_pk), []).append(int(event_id))
    return out


def run_id_of(session: Session, run_pk: int) -> str:
    return str(session.execute(select(DagRun.run_id).where(DagRun.id == run_pk)).scalar_one())
