"""Which running runs the scheduler advances in a loop (``unfinished_runs``), and whether its
clock made anything due (``has_clock_work``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from sqlalchemy import or_, select

from engine.db.models import Dag, DagRun, TaskInstance
from engine.db.queries import run_ends
from engine.states import DagRunState, TaskState

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

__all__ = ("IN_FLIGHT", "has_clock_work", "unfinished_runs")

#: task states the scheduler has nothing to decide about: the try is the executor's or the
#: triggerer's (``up_for_retry`` comes back through ``release_due_retries``)
IN_FLIGHT: Final = (
    TaskState.SCHEDULED,
    TaskState.QUEUED,
    TaskState.RUNNING,
    TaskState.DEFERRED,
    TaskState.UP_FOR_RETRY,
    TaskState.RESTARTING,
)


def unfinished_runs(session: Session) -> tuple[list[int], int]:
    """Runs whose tasks advance, and how many runs are running: the admitted (``running``)
    ones of unpaused DAGs (as in Airflow, a paused DAG's running runs schedule no further
    task until it is unpaused) that have a task instance out of ``IN_FLIGHT``, or none.

    A run whose every task instance is in flight has nothing to decide (trigger rules only
    decide tasks in ``none``; its outcome needs an ended task): at 1,000 running one-task
    runs, advancing each of them every loop cost 1,000 reads a loop, nearly all for runs
    whose task was still queued or running."""
    settled = (
        select(TaskInstance.id)
        .where(
            TaskInstance.dag_run_id == DagRun.id,
            or_(TaskInstance.state.is_(None), TaskInstance.state.not_in(IN_FLIGHT)),
        )
        .exists()
    )
    anything = select(TaskInstance.id).where(TaskInstance.dag_run_id == DagRun.id).exists()
    rows = session.execute(
        select(DagRun.id, or_(settled, ~anything))
        .join(Dag, Dag.dag_id == DagRun.dag_id)
        .where(DagRun.state == DagRunState.RUNNING, Dag.is_paused.is_(False))
        .order_by(DagRun.id)
    ).all()
    return [int(run_pk) for run_pk, advance in rows if advance], len(rows)


def has_clock_work(session: Session, *, now: datetime, deferrals_now: datetime) -> bool:
    """Whether the scheduler's clock made something due by ``now``: a running run past its
    DAG's ``dagrun_timeout``, a task ``up_for_retry`` whose delay passed; or a deferral past
    its timeout by ``deferrals_now`` (the wall clock, as ``fail_timed_out_deferrals``).

    A read, so that a loop with nothing due takes no write lock (on SQLite the write would
    queue the executor's and the triggerer's writes behind it); what it finds is then done
    by ``run_ends.time_out_runs``, ``runs.release_due_retries`` and
    ``deferrals.fail_timed_out_deferrals``, which check again."""
    retry_due = select(TaskInstance.id).where(
        TaskInstance.state == TaskState.UP_FOR_RETRY,
        or_(TaskInstance.next_retry_at.is_(None), TaskInstance.next_retry_at <= now),
    )
    deferral_due = select(TaskInstance.id).where(
        TaskInstance.state == TaskState.DEFERRED,
        TaskInstance.trigger_timeout.is_not(None),
        TaskInstance.trigger_timeout <= deferrals_now,
    )
    for probe in (retry_due, deferral_due):
        if session.execute(probe.limit(1)).first() is not None:
            return True
    return bool(run_ends.timed_out_runs(session, now=now))
