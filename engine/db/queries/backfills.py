"""SQL of backfills (``sluice dags backfill``): the backfill row, the runs at its dates,
and when it ends; plus the schedule columns of DAGs as the backfill, ``dags show`` and
``dags list`` read them.

A backfill stands for the runs of one DAG between two logical dates (or, for a partitioned
DAG, for a list of partition keys: one run per key); the command hands
them over in batches, each in its own transaction, and what a backfill does with each date
is the scheduler's rule (``engine.scheduler.backfills``). Running the same command again
resumes the same backfill (``create_or_resume_backfill``); the unique (dag_id,
logical_date) of ``dag_run`` makes a repeated or concurrent insert do nothing.

A backfill is complete once it has runs and none of them is queued or running
(``complete_finished_backfills``, each scheduler loop). One without runs (every date was
skipped) is completed by the command itself (``complete_backfill_if_done``): the scheduler
must not complete a backfill whose first batch is still being written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import and_, exists, insert, select, update

from engine.db.database import is_postgres
from engine.db.models import Backfill, Dag, DagRun
from engine.states import DagRunState

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from sqlalchemy import Select
    from sqlalchemy.orm import Session


#: What a backfill does with a date whose run has finished (Airflow 3's ``--reprocess``):
#: leave it, queue it again if it failed, or if it failed or succeeded.
REPROCESS_NONE: Final = "none"
REPROCESS_FAILED: Final = "failed"
REPROCESS_COMPLETED: Final = "completed"
REPROCESS_BEHAVIORS: Final = (REPROCESS_NONE, REPROCESS_FAILED, REPROCESS_COMPLETED)

_ACTIVE: Final = (DagRunState.QUEUED, DagRunState.RUNNING)


class BackfillConflictError(ValueError):
    """The DAG has an unfinished backfill of another date range."""


@dataclass(frozen=True, slots=True)
class BackfillRow:
    id: int
    dag_id: str
    from_date: datetime | None  # None for a partition backfill
    to_date: datetime | None
    reprocess: str
    max_active_runs: int
    created_at: datetime
    completed_at: datetime | None
    partition_keys: tuple[str, ...] | None = None  # a partition backfill's keys

    def describe(self) -> str:
        """What the backfill runs: its date range, or its partition keys."""
        if self.partition_keys is not None:
            return f"of partition keys {', '.join(self.partition_keys)}"
        assert self.from_date is not None and self.to_date is not None
        return f"from {self.from_date.isoformat()} to {self.to_date.isoformat()}"


@dataclass(frozen=True, slots=True)
class DagSchedule:
    """A DAG's schedule columns: what it runs on, its time bounds and its next time run."""

    dag_id: str
    is_paused: bool
    is_active: bool
    timetable: Any  # serialized timetable (engine.authoring.timetables) or None
    timetable_summary: str | None
    asset_condition: Any  # the asset condition JSON or None
    timezone: str
    start_date: datetime | None
    end_date: datetime | None
    catchup: bool
    max_active_runs: int
    tags: list[str]
    next_dagrun_computed: bool
    next_dagrun: datetime | None
    next_dagrun_data_interval: tuple[datetime, datetime] | None
    next_dagrun_create_after: datetime | None


def dag_schedules(session: Session, dag_ids: Iterable[str] | None = None) -> dict[str, DagSchedule]:
    """dag_id -> its schedule columns, for the given DAGs (all when None)."""
    stmt = select(Dag).order_by(Dag.dag_id)
    if dag_ids is not None:
        stmt = stmt.where(Dag.dag_id.in_(list(dag_ids)))
    return {d.dag_id: _dag_schedule(d) for d in session.execute(stmt).scalars()}


def _dag_schedule(dag: Dag) -> DagSchedule:
    interval_start, interval_end = (
        dag.next_dagrun_data_interval_start,
        dag.next_dagrun_data_interval_end,
    )
    return DagSchedule(
        dag_id=dag.dag_id,
        is_paused=bool(dag.is_paused),
        is_active=bool(dag.is_active),
        timetable=dag.timetable,
        timetable_summary=dag.timetable_summary,
        asset_condition=dag.schedule,
        timezone=dag.timezone or "UTC",
        start_date=dag.start_date,
        end_date=dag.end_date,
        catchup=bool(dag.catchup),
        max_active_runs=int(dag.max_active_runs),
        tags=[str(t) for t in dag.tags or []],
        next_dagrun_computed=bool(dag.next_dagrun_computed),
        next_dagrun=dag.next_dagrun,
        next_dagrun_data_interval=(
            None
            if interval_start is None or interval_end is None
            else (interval_start, interval_end)
        ),
        next_dagrun_create_after=dag.next_dagrun_create_after,
    )


def unfinished_backfill(session: Session, dag_id: str) -> BackfillRow | None:
    """The DAG's backfill that is not complete yet (the latest, should there be several)."""
    row = session.execute(
        select(Backfill)
        .where(Backfill.dag_id == dag_id, Backfill.completed_at.is_(None))
        .order_by(Backfill.id.desc())
        .limit(1)
    ).scalar()
    return None if row is None else _backfill_row(row)


def _backfill_row(row: Backfill) -> BackfillRow:
    return BackfillRow(
        id=row.id,
        dag_id=row.dag_id,
        from_date=row.from_date,
        to_date=row.to_date,
        reprocess=row.reprocess,
        max_active_runs=row.max_active_runs,
        created_at=row.created_at,
        completed_at=row.completed_at,
        partition_keys=None if row.partition_keys is None else tuple(row.partition_keys),
    )


def create_or_resume_backfill(
    session: Session,
    dag_id: str,
    *,
    from_date: datetime | None,
    to_date: datetime | None,
    reprocess: str,
    max_active_runs: int,
    created_by: str | None,
    now: datetime,
    partition_keys: Sequence[str] | None = None,
) -> int:
    """The id of the DAG's unfinished backfill of this range (resumed, with this
    ``reprocess`` and ``max_active_runs``), or of a new one. A partition backfill gives
    ``partition_keys`` and no dates; it resumes one of the same keys.

    Raises ``BackfillConflictError`` when the DAG has an unfinished backfill of another
    range (or other keys). On PostgreSQL the DAG's row is locked first, so two commands
    racing for one DAG create one backfill.
    """
    if reprocess not in REPROCESS_BEHAVIORS:
        raise ValueError(f"reprocess must be one of {REPROCESS_BEHAVIORS}, got {reprocess!r}")
    if is_postgres(session):
        session.execute(select(Dag.dag_id).where(Dag.dag_id == dag_id).with_for_update())
    keys = None if partition_keys is None else tuple(partition_keys)
    current = unfinished_backfill(session, dag_id)
    if current is not None:
        if (current.from_date, current.to_date, current.partition_keys) != (
            from_date,
            to_date,
            keys,
        ):
            raise BackfillConflictError(
                f"DAG {dag_id!r} has an unfinished backfill (id {current.id}) "
                f"{current.describe()}: wait until its runs have finished, or run the command "
                "again with that range (or those keys) to resume it"
            )
        session.execute(
            update(Backfill)
            .where(Backfill.id == current.id)
            .values(reprocess=reprocess, max_active_runs=max_active_runs)
        )
        return current.id
    return int(
        session.execute(
            insert(Backfill)
            .values(
                dag_id=dag_id,
                from_date=from_date,
                to_date=to_date,
                reprocess=reprocess,
                max_active_runs=max_active_runs,
                created_by=created_by,
                created_at=now,
                partition_keys=None if keys is None else list(keys),
            )
            .returning(Backfill.id)
        ).scalar_one()
    )


def backfill_dag_id(session: Session, backfill_id: int) -> str:
    return str(
        session.execute(select(Backfill.dag_id).where(Backfill.id == backfill_id)).scalar_one()
    )


@dataclass(frozen=True, slots=True)
class ExistingRun:
    """The run a DAG already has at a logical date."""

    pk: int
    state: str
    backfill_id: int | None


def existing_runs(
    session: Session, dag_id: str, dates: Sequence[datetime], *, lock: bool
) -> dict[datetime, ExistingRun]:
    """logical date -> the DAG's run at it, for the given dates (``lock``: ``FOR UPDATE``
    on PostgreSQL, for a transaction that re-queues some of them)."""
    if not dates:
        return {}
    stmt = select(DagRun.id, DagRun.logical_date, DagRun.state, DagRun.backfill_id).where(
        DagRun.dag_id == dag_id, DagRun.logical_date.in_(list(dates))
    )
    if lock and is_postgres(session):
        stmt = stmt.with_for_update()
    rows = session.execute(stmt).all()
    return {
        date: ExistingRun(int(pk), str(state), None if backfill is None else int(backfill))
        for pk, date, state, backfill in rows
        if date is not None
    }


def existing_runs_by_key(
    session: Session, dag_id: str, keys: Sequence[str], *, lock: bool
) -> dict[str, ExistingRun]:
    """partition key -> the DAG's latest run of that key, for the given keys (``lock``: ``FOR
    UPDATE`` on PostgreSQL, for a transaction that re-queues some of them)."""
    if not keys:
        return {}
    stmt = (
        select(DagRun.id, DagRun.partition_key, DagRun.state, DagRun.backfill_id)
        .where(DagRun.dag_id == dag_id, DagRun.partition_key.in_(list(keys)))
        .order_by(DagRun.id)
    )
    if lock and is_postgres(session):
        stmt = stmt.with_for_update()
    found: dict[str, ExistingRun] = {}
    for pk, key, state, backfill in session.execute(stmt).all():
        found[str(key)] = ExistingRun(
            int(pk), str(state), None if backfill is None else int(backfill)
        )
    return found


def lock_dag(session: Session, dag_id: str) -> None:
    """Hold the DAG's row until the transaction ends (PostgreSQL; SQLite's writer holds the
    whole database): a partition backfill's batch reads which keys have runs and creates
    the others without a concurrent command doing the same in between."""
    if is_postgres(session):
        session.execute(select(Dag.dag_id).where(Dag.dag_id == dag_id).with_for_update())


def _has_active_run() -> Any:
    return exists().where(DagRun.backfill_id == Backfill.id, DagRun.state.in_(_ACTIVE))


def _finished_backfills() -> Select[int]:
    return select(Backfill.id).where(
        Backfill.completed_at.is_(None),
        exists().where(DagRun.backfill_id == Backfill.id),
        ~_has_active_run(),
    )


def has_finished_backfills(session: Session) -> bool:
    """Whether ``complete_finished_backfills`` has one to complete (a read: a scheduler
    loop looks each time, since the runs of a backfill also end in executors)."""
    return session.execute(_finished_backfills().limit(1)).first() is not None


def complete_finished_backfills(session: Session, *, now: datetime) -> list[int]:
    """Complete the unfinished backfills that have runs, none queued or running; returns
    their ids. (A backfill without runs may still be getting its first batch.)"""
    ids = [int(i) for i in session.execute(_finished_backfills()).scalars()]
    if ids:
        session.execute(
            update(Backfill)
            .where(Backfill.id.in_(ids), Backfill.completed_at.is_(None))
            .values(completed_at=now)
        )
    return ids


def complete_backfill_if_done(session: Session, backfill_id: int, *, now: datetime) -> bool:
    """Complete the backfill if none of its runs is queued or running (also when it has no
    runs: the command that wrote it calls this when it is done); whether it is complete."""
    session.execute(
        update(Backfill)
        .where(
            and_(Backfill.id == backfill_id, Backfill.completed_at.is_(None), ~_has_active_run())
        )
        .values(completed_at=now)
    )
    done = session.execute(select(Backfill.completed_at).where(Backfill.id == backfill_id)).scalar()
    return done is not None
