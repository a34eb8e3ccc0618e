"""SQL of ``ti.xcom_pull`` beyond the task's own run: the results another DAG's run, another
run of the same DAG, or earlier runs (``include_prior_dates``) stored (Airflow 3's
``dag_id`` / ``run_id`` / ``include_prior_dates`` arguments). The executor answers a task's
request with it (``engine.executor.task_requests``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from engine.db.models import DagRun, TaskInstance

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


@dataclass(frozen=True, slots=True)
class PulledResults:
    """One task's results in one run: the unmapped task's, or each copy's by map index."""

    run_id: str
    mapped: bool
    #: ``{key: tagged JSON}`` per task instance (one, or one per copy in map index order)
    stored: list[dict[str, Any]]


def pull_results(
    session: Session,
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int | None,
    include_prior_dates: bool = False,
    key: str | None = None,
) -> PulledResults | None:
    """The results of ``task_id`` in run ``run_id`` of ``dag_id``; with
    ``include_prior_dates``, of the latest run of ``dag_id`` at or before that run's
    logical date (or ``run_after``) whose task stored ``key``. ``map_index`` None is the
    unmapped task, else every copy of a mapped one; an int is that one (-1: unmapped).
    None when there is no such run or task instance."""
    runs = [run_id]
    if include_prior_dates:
        runs = _runs_up_to(session, dag_id, run_id)
    for candidate in runs:
        found = _results_in_run(session, dag_id, candidate, task_id, map_index)
        if found is None:
            continue
        if not include_prior_dates or key is None or any(key in s for s in found.stored):
            return found
    return None


def _runs_up_to(session: Session, dag_id: str, run_id: str) -> list[str]:
    """Run ids of ``dag_id`` at or before ``run_id``'s date, latest first (``run_id`` may
    belong to another DAG: its date is the reference, as in Airflow)."""
    when = func.coalesce(DagRun.logical_date, DagRun.run_after)
    reference = session.execute(
        select(when).where(DagRun.run_id == run_id).order_by(DagRun.id.desc()).limit(1)
    ).scalar_one_or_none()
    stmt = select(DagRun.run_id).where(DagRun.dag_id == dag_id)
    if reference is not None:
        stmt = stmt.where(when <= reference)
    ordered = stmt.order_by(when.desc(), DagRun.id.desc())
    return [str(run) for run in session.execute(ordered).scalars()]


def _results_in_run(
    session: Session, dag_id: str, run_id: str, task_id: str, map_index: int | None
) -> PulledResults | None:
    stmt = (
        select(TaskInstance.map_index, TaskInstance.xcoms)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(DagRun.dag_id == dag_id, DagRun.run_id == run_id, TaskInstance.task_id == task_id)
        .order_by(TaskInstance.map_index)
    )
    if map_index is not None:
        stmt = stmt.where(TaskInstance.map_index == map_index)
    rows = [(int(index), xcoms) for index, xcoms in session.execute(stmt)]
    if not rows:
        return None
    unmapped = [xcoms for index, xcoms in rows if index < 0]
    if map_index is None and not unmapped:  # a mapped task: every copy
        copies = [dict(x) if isinstance(x, dict) else {} for _, x in rows]
        return PulledResults(run_id, mapped=True, stored=copies)
    first = unmapped[0] if map_index is None else rows[0][1]
    return PulledResults(run_id, mapped=False, stored=[dict(first or {})])
