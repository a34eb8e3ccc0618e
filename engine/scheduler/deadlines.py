"""Deadline alerts in the scheduler loop (``engine.authoring.deadlines``).

Each loop, two steps, each one transaction:

1. *set*: every queued or running run of a DAG with alerts that has no deadline rows yet
   gets one per alert, ``reference + interval`` (``deadline_time``, a pure function of the
   stored alert and the run): the logical date (none for a run without one), when the run
   was queued, a fixed moment, or when it was queued plus the average duration of the DAG's
   latest finished runs (none with fewer than ``min_runs``). A run is first seen within a
   loop of its creation, so these are the values at its creation, as Airflow sets them;
2. *miss*: deadlines at or before now (the scheduler's clock) whose run had not finished by
   then are marked missed and their callback requested in the same transaction
   (``engine.db.queries.deadlines``): an executor runs it in a callback process
   (``engine.execution.deadline_callbacks``). A run that finished by its deadline never
   fires it; one that finished after it, before a loop saw it, still does.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from engine.db.queries import deadlines as deadlines_sql

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from engine.db.database import Database
    from engine.db.queries.deadlines import MissedDeadline, RunToSet

logger = logging.getLogger(__name__)

LOGICAL_DATE: Final = "DagRunLogicalDateDeadline"
QUEUED_AT: Final = "DagRunQueuedAtDeadline"
FIXED: Final = "FixedDatetimeDeadline"
AVERAGE_RUNTIME: Final = "AverageRuntimeDeadline"


def reference_time(
    reference: dict[str, Any],
    *,
    logical_date: datetime | None,
    queued_at: datetime | None,
    durations_s: list[float] | None = None,
) -> datetime | None:
    """The moment ``reference`` (a serialized ``DeadlineReference``) names for a run; None
    when it has none for it."""
    kind = reference.get("reference_type")
    if kind == LOGICAL_DATE:
        return logical_date
    if kind == QUEUED_AT:
        return queued_at
    if kind == FIXED:
        return datetime.fromtimestamp(float(reference["datetime"]), tz=UTC)
    if kind == AVERAGE_RUNTIME:
        durations = durations_s or []
        if queued_at is None or len(durations) < int(reference["min_runs"]):
            return None
        return queued_at + timedelta(seconds=sum(durations) / len(durations))
    raise ValueError(f"unknown deadline reference {kind!r}")


def deadline_rows(
    run: RunToSet, durations: dict[int, list[float]], now: datetime
) -> list[dict[str, Any]]:
    """The deadline rows of ``run``, one per alert (``durations``: by alert index, the
    recent run durations an average-runtime alert counts from)."""
    rows = []
    for index, alert in enumerate(run.alerts):
        reference = dict(alert.get("reference") or {})
        try:
            at = reference_time(
                reference,
                logical_date=run.logical_date,
                queued_at=run.queued_at,
                durations_s=durations.get(index),
            )
        except (KeyError, TypeError, ValueError) as exc:  # stored by another version
            logger.error(
                "Run %s of DAG %s: deadline alert %d cannot be read (%s); it gets no deadline",
                run.run_id,
                run.dag_id,
                index,
                exc,
                extra={"action": "deadline_unreadable", "dag_id": run.dag_id},
            )
            at = None
        rows.append(
            {
                "dag_run_id": run.run_pk,
                "alert_index": index,
                "name": alert.get("name"),
                "reference": str(reference.get("reference_type", "?"))[:100],
                "deadline_time": (
                    None if at is None else at + timedelta(seconds=float(alert["interval_s"]))
                ),
                "alert": alert,
                "created_at": now,
            }
        )
    return rows


async def check_deadlines(db: Database, *, now: datetime) -> list[MissedDeadline]:
    """The loop's step: set the deadlines of new runs, miss the due ones (a read first: a
    loop with nothing to do takes no write transaction)."""
    if not await db.read(partial(deadlines_sql.has_deadline_work, now=now)):
        return []
    await db.run(partial(set_deadlines, now=now))
    return await db.run(partial(miss_due_deadlines, now=now))


def set_deadlines(session: Session, *, now: datetime) -> int:
    """Deadline rows for the active runs that have none yet; returns how many were set."""
    inserted = 0
    for run in deadlines_sql.runs_to_set(session):
        durations = {}
        for index, alert in enumerate(run.alerts):
            reference = alert.get("reference") or {}
            if reference.get("reference_type") == AVERAGE_RUNTIME:
                durations[index] = deadlines_sql.recent_durations_s(
                    session, run.dag_id, limit=int(reference.get("max_runs") or 10)
                )
        inserted += deadlines_sql.insert_deadlines(session, deadline_rows(run, durations, now))
    return inserted


def miss_due_deadlines(session: Session, *, now: datetime) -> list[MissedDeadline]:
    """Mark the due deadlines missed and request their callbacks (logged here)."""
    missed = deadlines_sql.miss_due_deadlines(session, now=now)
    for deadline in missed:
        logger.warning(
            "Run %s of DAG %s missed its deadline%s at %s; its callback is requested",
            deadline.run_id,
            deadline.dag_id,
            "" if deadline.name is None else f" {deadline.name!r}",
            deadline.deadline_time.isoformat() if deadline.deadline_time else "-",
            extra={
                "action": "deadline_missed",
                "dag_id": deadline.dag_id,
                "run_id": deadline.run_id,
                "deadline_id": deadline.id,
            },
        )
    return missed
