"""SQL of deadline alerts (``engine.authoring.deadlines``): the runs whose deadlines are not
set yet, the durations an average-runtime deadline counts from, the rows themselves, and
the due ones marked missed with their callback requested in the same transaction.

Statements, not decisions: when a deadline falls is ``engine.scheduler.deadlines``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import exists, insert, or_, select, update

from engine.db.database import rowcount, upsert_insert
from engine.db.models import CallbackRequest, Dag, DagRun, Deadline
from engine.states import DagRunState

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from sqlalchemy import ColumnElement
    from sqlalchemy.orm import Session

#: the kind of a callback request that runs a missed deadline's callback
DEADLINE_KIND: Final = "deadline"
_ACTIVE: Final = (DagRunState.QUEUED, DagRunState.RUNNING)


@dataclass(frozen=True, slots=True)
class RunToSet:
    """An active run of a DAG with deadline alerts whose deadlines are not set yet."""

    run_pk: int
    dag_id: str
    run_id: str
    logical_date: datetime | None
    queued_at: datetime | None
    alerts: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class MissedDeadline:
    """A deadline the scheduler just marked missed (its callback is requested)."""

    id: int
    dag_id: str
    run_id: str
    name: str | None
    deadline_time: datetime | None


@dataclass(frozen=True, slots=True)
class RunDeadline:
    """A run's deadline, for display."""

    alert_index: int
    name: str | None
    reference: str
    deadline_time: datetime | None
    missed: bool
    missed_at: datetime | None
    callback: str


def _to_set() -> tuple[ColumnElement[bool], ...]:
    """Conditions on ``dag_run`` joined to ``dag``: an active run of a DAG with alerts whose
    deadlines are not set."""
    return (
        Dag.deadline_alerts.is_not(None),
        DagRun.state.in_(_ACTIVE),
        ~exists().where(Deadline.dag_run_id == DagRun.id),
    )


def _due(now: datetime) -> tuple[ColumnElement[bool], ...]:
    """Conditions on ``deadline`` joined to ``dag_run``: due, not missed yet, and its run
    not finished by then."""
    return (
        Deadline.missed.is_(False),
        Deadline.deadline_time.is_not(None),
        Deadline.deadline_time <= now,
        or_(DagRun.end_date.is_(None), DagRun.end_date > Deadline.deadline_time),
    )


def has_deadline_work(session: Session, *, now: datetime) -> bool:
    """Whether a run's deadlines are to be set or one is due: a read, so that the
    scheduler's loop takes no write lock for DAGs without alerts."""
    to_set = select(DagRun.id).join(Dag, Dag.dag_id == DagRun.dag_id).where(*_to_set())
    if session.execute(to_set.limit(1)).first() is not None:
        return True
    due = select(Deadline.id).join(DagRun, DagRun.id == Deadline.dag_run_id).where(*_due(now))
    return session.execute(due.limit(1)).first() is not None


def runs_to_set(session: Session, *, limit: int = 100) -> list[RunToSet]:
    """Queued or running runs of DAGs with deadline alerts that have no deadline rows."""
    query = select(
        DagRun.id,
        DagRun.dag_id,
        DagRun.run_id,
        DagRun.logical_date,
        DagRun.queued_at,
        Dag.deadline_alerts,
    )
    query = query.join(Dag, Dag.dag_id == DagRun.dag_id).where(*_to_set())
    rows = session.execute(query.order_by(DagRun.id).limit(limit)).all()
    return [
        RunToSet(int(pk), str(dag_id), str(run_id), logical, queued, tuple(alerts or ()))
        for pk, dag_id, run_id, logical, queued, alerts in rows
    ]


def recent_durations_s(session: Session, dag_id: str, *, limit: int) -> list[float]:
    """Durations of the DAG's latest ``limit`` finished runs (started and ended), latest
    first."""
    rows = session.execute(
        select(DagRun.start_date, DagRun.end_date)
        .where(
            DagRun.dag_id == dag_id,
            DagRun.start_date.is_not(None),
            DagRun.end_date.is_not(None),
        )
        .order_by(DagRun.start_date.desc(), DagRun.id.desc())
        .limit(limit)
    ).all()
    return [(end - start).total_seconds() for start, end in rows if start and end]


def insert_deadlines(session: Session, rows: Sequence[dict[str, Any]]) -> int:
    """Insert a run's deadline rows (``dag_run_id``, ``alert_index``, ``name``,
    ``reference``, ``deadline_time``, ``alert``, ``created_at``); rows another scheduler
    inserted first are skipped. Returns how many were inserted."""
    if not rows:
        return 0
    stmt = (
        upsert_insert(session, Deadline)
        .on_conflict_do_nothing(index_elements=["dag_run_id", "alert_index"])
        .returning(Deadline.id)
    )
    return len(session.execute(stmt, list(rows)).all())


def miss_due_deadlines(
    session: Session, *, now: datetime, limit: int = 100
) -> list[MissedDeadline]:
    """Deadlines at or before ``now`` whose run had not finished by then: each marked
    missed, and a ``deadline`` callback request written for it, once (a row another
    scheduler marked first is left alone)."""
    query = select(Deadline.id, Deadline.name, Deadline.deadline_time, DagRun.dag_id, DagRun.run_id)
    query = query.join(DagRun, DagRun.id == Deadline.dag_run_id).where(*_due(now))
    due = session.execute(query.order_by(Deadline.deadline_time, Deadline.id).limit(limit)).all()
    missed = []
    for deadline_id, name, deadline_time, dag_id, run_id in due:
        marked = session.execute(
            update(Deadline)
            .where(Deadline.id == deadline_id, Deadline.missed.is_(False))
            .values(missed=True, missed_at=now)
        )
        if not rowcount(marked):
            continue
        session.execute(
            insert(CallbackRequest).values(
                kind=DEADLINE_KIND,
                dag_id=str(dag_id),
                run_id=str(run_id),
                data={"deadline_id": int(deadline_id)},
                created_at=now,
            )
        )
        missed.append(MissedDeadline(int(deadline_id), dag_id, run_id, name, deadline_time))
    return missed


def load_deadline(session: Session, deadline_id: int) -> tuple[int, datetime, dict[str, Any]]:
    """(alert index, deadline time, the alert as stored) of a deadline; ``LookupError`` when
    it is gone (its run was deleted)."""
    row = session.execute(
        select(Deadline.alert_index, Deadline.deadline_time, Deadline.alert).where(
            Deadline.id == deadline_id
        )
    ).first()
    if row is None or row[1] is None:
        raise LookupError(f"deadline {deadline_id} is gone")
    return int(row[0]), row[1], dict(row[2])


def run_deadlines(session: Session, dag_id: str, run_id: str) -> list[RunDeadline]:
    """The deadlines of one run, in the DAG's order."""
    rows = session.execute(
        select(Deadline)
        .join(DagRun, DagRun.id == Deadline.dag_run_id)
        .where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
        .order_by(Deadline.alert_index)
    ).scalars()
    return [
        RunDeadline(
            alert_index=row.alert_index,
            name=row.name,
            reference=row.reference,
            deadline_time=row.deadline_time,
            missed=row.missed,
            missed_at=row.missed_at,
            callback=str((row.alert or {}).get("callback", {}).get("path", "")),
        )
        for row in rows
    ]
