"""SQL of ``TriggerDagRunOperator``'s requests (served by the executor): the run a trigger
would collide with, and the state of a triggered run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import or_, select

from engine.db.models import DagRun

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session


@dataclass(frozen=True, slots=True)
class ExistingRun:
    run_id: str
    logical_date: datetime | None
    state: str


def existing_run(
    session: Session, dag_id: str, *, run_id: str | None, logical_date: datetime | None
) -> ExistingRun | None:
    """The run of ``dag_id`` with run id ``run_id`` or at ``logical_date`` (either is unique
    per DAG: a new run with them would not be created), the run id's first."""
    matches = []
    if run_id is not None:
        matches.append(DagRun.run_id == run_id)
    if logical_date is not None:
        matches.append(DagRun.logical_date == logical_date)
    if not matches:
        return None
    match = or_(*matches)
    rows = session.execute(
        select(DagRun.run_id, DagRun.logical_date, DagRun.state).where(
            DagRun.dag_id == dag_id, match
        )
    ).all()
    if not rows:
        return None
    row = next((r for r in rows if r.run_id == run_id), rows[0])
    return ExistingRun(str(row.run_id), row.logical_date, str(row.state))


def run_state(session: Session, dag_id: str, run_id: str) -> str | None:
    """The state of run ``run_id`` of ``dag_id``; None if there is no such run."""
    state = session.execute(
        select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
    ).scalar()
    return None if state is None else str(state)
