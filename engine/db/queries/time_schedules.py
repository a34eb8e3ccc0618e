"""SQL of time-scheduled DAGs: which are due, the earliest next run, the row the scheduler
locks while it decides a DAG's due run (``engine.scheduler.time_runs``), the interval of the
last scheduled run, and the next run stored on the DAG row (``next_dagrun*``), which a run
that ends has the scheduler compute again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, or_, select, update

from engine.db.database import is_postgres, write_rows
from engine.db.models import Dag, DagRun
from engine.db.queries import runs

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session


@dataclass(frozen=True, slots=True)
class TimeDag:
    """A time-scheduled DAG's row as the scheduler needs it (locked while it decides)."""

    dag_id: str
    timetable: Any
    start_date: datetime | None
    end_date: datetime | None
    catchup: bool
    max_active_runs: int
    next_dagrun_computed: bool
    next_dagrun: datetime | None
    next_data_interval: tuple[datetime, datetime] | None
    next_dagrun_create_after: datetime | None


def _due(now: datetime) -> Any:
    return and_(
        Dag.timetable.is_not(None),
        Dag.is_active.is_(True),
        Dag.is_paused.is_(False),
        or_(
            Dag.next_dagrun_computed.is_(False),
            and_(Dag.next_dagrun_create_after.is_not(None), Dag.next_dagrun_create_after <= now),
        ),
    )


def dags_due_for_time_runs(session: Session, *, now: datetime) -> list[str]:
    """Active, unpaused time-scheduled DAGs whose next run is due (or not yet computed)."""
    rows = session.execute(select(Dag.dag_id).where(_due(now)).order_by(Dag.dag_id))
    return [str(r) for r in rows.scalars()]


def next_time_run_at(session: Session) -> datetime | None:
    """When the earliest next time run of an active, unpaused DAG is due (None: none is)."""
    value = session.execute(
        select(func.min(Dag.next_dagrun_create_after)).where(
            Dag.timetable.is_not(None), Dag.is_active.is_(True), Dag.is_paused.is_(False)
        )
    ).scalar()
    return value if value is None else _aware(value)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def lock_time_dag(session: Session, dag_id: str, *, now: datetime) -> TimeDag | None:
    """Lock a due DAG's row (skipped when another scheduler holds it) and read it."""
    stmt = select(
        Dag.dag_id,
        Dag.timetable,
        Dag.start_date,
        Dag.end_date,
        Dag.catchup,
        Dag.max_active_runs,
        Dag.next_dagrun_computed,
        Dag.next_dagrun,
        Dag.next_dagrun_data_interval_start,
        Dag.next_dagrun_data_interval_end,
        Dag.next_dagrun_create_after,
    ).where(Dag.dag_id == dag_id, _due(now))
    if is_postgres(session):
        stmt = stmt.with_for_update(skip_locked=True)
    row = session.execute(stmt).first()
    if row is None:
        return None
    interval_start, interval_end = row[8], row[9]
    return TimeDag(
        dag_id=str(row[0]),
        timetable=row[1],
        start_date=row[2],
        end_date=row[3],
        catchup=bool(row[4]),
        max_active_runs=int(row[5]),
        next_dagrun_computed=bool(row[6]),
        next_dagrun=row[7],
        next_data_interval=_interval(interval_start, interval_end),
        next_dagrun_create_after=row[10],
    )


def _interval(start: datetime | None, end: datetime | None) -> tuple[datetime, datetime] | None:
    return None if start is None or end is None else (start, end)


def last_automated_interval(session: Session, dag_id: str) -> tuple[datetime, datetime] | None:
    """The data interval of the DAG's latest scheduled run (None before the first)."""
    row = session.execute(
        select(DagRun.data_interval_start, DagRun.data_interval_end)
        .where(
            DagRun.dag_id == dag_id,
            DagRun.run_type == runs.SCHEDULED,
            DagRun.data_interval_start.is_not(None),
        )
        .order_by(DagRun.logical_date.desc())
        .limit(1)
    ).first()
    return None if row is None else _interval(row[0], row[1])


def set_next_dagrun(
    session: Session,
    dag_id: str,
    *,
    logical_date: datetime | None,
    data_interval: tuple[datetime, datetime] | None,
    run_after: datetime | None,
) -> None:
    """Store the DAG's next time run (all None: there is none)."""
    session.execute(
        update(Dag)
        .where(Dag.dag_id == dag_id)
        .values(
            next_dagrun_computed=True,
            next_dagrun=logical_date,
            next_dagrun_data_interval_start=None if data_interval is None else data_interval[0],
            next_dagrun_data_interval_end=None if data_interval is None else data_interval[1],
            next_dagrun_create_after=run_after,
        )
    )


def recompute_next_dagrun(session: Session, dag_id: str) -> None:
    """Have the scheduler compute a time-scheduled DAG's next run again (a run ended)."""
    write_rows(
        session,
        update(Dag)
        .where(Dag.dag_id == dag_id, Dag.timetable.is_not(None), Dag.next_dagrun_computed)
        .values(next_dagrun_computed=False),
    )
