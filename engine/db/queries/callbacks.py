"""SQL of callback requests: callbacks an executor runs in a child process.

Two kinds, as Airflow's callback requests:

- ``dag``: the scheduler ended a run of a DAG that has an ``on_success_callback`` /
  ``on_failure_callback``; written in the transaction that ends the run. ``data`` holds the
  ``reason`` (``success`` / ``task_failure``) and the task (``task_id``, ``try_number``,
  ``map_index``) whose context the callback gets (for a failure the failed task that ended
  last, else the task that ended last).
- ``task``: a task's process could not run its own outcome callback (killed at its
  ``execution_timeout``, crashed): written in the transaction that records the outcome;
  ``data`` holds the ``callback`` to run, the ``error`` and the task's ``spec``. Or a
  running try whose executor died (``engine.scheduler.orphans``): written by the scheduler
  in the transaction that fails it; ``data[LOST_TRY]`` says which try, how it ended and
  why, and the executor builds the callback from the task instance.

Delivery is at least once: an executor claims a request (``executor_job_id``), runs it and
deletes it; a request held by an executor that stopped heartbeating is claimed again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import case, delete, insert, or_, select, true, update

from engine.db.database import is_postgres
from engine.db.models import CallbackRequest, Dag, DagRun, TaskInstance
from engine.db.queries import jobs
from engine.db.queries import mapping as mapping_sql
from engine.db.queries.run_context import context_run, run_results, triggering_events
from engine.db.queries.tasks import EXECUTOR_JOB
from engine.states import DagRunState, TaskState

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.db.queries.assets import EventRow

DAG_KIND: Final = "dag"
TASK_KIND: Final = "task"
#: the key of a task request's ``data`` that describes a try of a dead executor
LOST_TRY: Final = "lost_try"

_FAILED_STATES: Final = (TaskState.FAILED, TaskState.UPSTREAM_FAILED)


@dataclass(frozen=True, slots=True)
class Request:
    """A claimed callback request."""

    id: int
    kind: str
    dag_id: str
    run_id: str
    data: dict[str, Any]


def request_task_callback(
    session: Session, *, dag_id: str, run_id: str, data: dict[str, Any], now: datetime
) -> None:
    """Ask an executor to run a task's callback in a fresh process (``data``: see above)."""
    session.execute(
        insert(CallbackRequest).values(
            kind=TASK_KIND, dag_id=dag_id, run_id=run_id, data=data, created_at=now
        )
    )


def _context_task(session: Session, run_pk: int, *, failed: bool) -> tuple[str, int, int] | None:
    """(task_id, try_number, map_index) whose context a DAG callback gets: the failed task
    (or copy of a mapped task) that ended last for a failure, the one that ended last for a
    success."""
    query = select(TaskInstance.task_id, TaskInstance.try_number, TaskInstance.map_index).where(
        TaskInstance.dag_run_id == run_pk
    )
    if failed:  # a task that failed itself first, then one whose upstream did
        query = query.where(TaskInstance.state.in_(_FAILED_STATES)).order_by(
            case((TaskInstance.state == TaskState.FAILED, 0), else_=1)
        )
    query = query.order_by(  # NULL end dates last on both databases
        TaskInstance.end_date.is_(None), TaskInstance.end_date.desc(), TaskInstance.id.desc()
    )
    row = session.execute(query.limit(1)).first()
    return None if row is None else (str(row[0]), int(row[1]), int(row[2]))


def request_dag_callback(
    session: Session, run_pk: int, state: str, *, now: datetime, reason: str | None = None
) -> bool:
    """When run ``run_pk`` ended in ``state``: request its DAG's callback of that outcome, if
    the DAG has one (``reason``: Airflow's, ``success`` or ``task_failure`` by default,
    ``timed_out`` for a run past its ``dagrun_timeout``). True when a request was written."""
    row = session.execute(
        select(
            DagRun.dag_id, DagRun.run_id, Dag.has_on_success_callback, Dag.has_on_failure_callback
        )
        .join(Dag, Dag.dag_id == DagRun.dag_id)
        .where(DagRun.id == run_pk)
    ).first()
    if row is None:
        return False
    dag_id, run_id, on_success, on_failure = row
    failed = state == DagRunState.FAILED
    if not (on_failure if failed else on_success and state == DagRunState.SUCCESS):
        return False
    found = _context_task(session, run_pk, failed=failed) or _context_task(
        session, run_pk, failed=False
    )
    data = {
        "reason": reason or ("task_failure" if failed else "success"),
        "success": not failed,
        "task_id": None if found is None else found[0],
        "try_number": None if found is None else found[1],
        "map_index": -1 if found is None else found[2],
    }
    session.execute(
        insert(CallbackRequest).values(
            kind=DAG_KIND, dag_id=str(dag_id), run_id=str(run_id), data=data, created_at=now
        )
    )
    return True


def has_callback_requests(session: Session, *, running: Sequence[int] = ()) -> bool:
    """Whether there is any request besides ``running`` ones: a read, so that an idle
    executor's poll does not take the write lock (the claim then decides which to take)."""
    query = select(CallbackRequest.id)
    if running:
        query = query.where(CallbackRequest.id.not_in(list(running)))
    return session.execute(query.limit(1)).first() is not None


def claim_callback_requests(
    session: Session,
    *,
    job_id: int,
    limit: int,
    threshold_s: float,
    running: Sequence[int] = (),
) -> list[Request]:
    """Claim up to ``limit`` requests, oldest first: those no live executor holds, and those
    executor ``job_id`` holds but is not ``running`` (a database error interrupted them)."""
    if limit <= 0:
        return []
    alive = [
        job
        for job in jobs.alive_job_ids(session, job_type=EXECUTOR_JOB, threshold_s=threshold_s)
        if job != job_id
    ]
    free = or_(
        CallbackRequest.executor_job_id.is_(None),
        CallbackRequest.executor_job_id.not_in(alive) if alive else true(),
    )
    if running:
        free = free & CallbackRequest.id.not_in(list(running))
    query = select(CallbackRequest).where(free).order_by(CallbackRequest.id).limit(limit)
    if is_postgres(session):
        query = query.with_for_update(skip_locked=True)
    rows = list(session.execute(query).scalars())
    if not rows:
        return []
    session.execute(
        update(CallbackRequest)
        .where(CallbackRequest.id.in_([r.id for r in rows]))
        .values(executor_job_id=job_id)
    )
    return [Request(r.id, r.kind, r.dag_id, r.run_id, dict(r.data or {})) for r in rows]


def delete_callback_request(session: Session, request_id: int) -> None:
    """The request ran (or cannot ever run): gone."""
    session.execute(delete(CallbackRequest).where(CallbackRequest.id == request_id))


def pending_callback_requests(session: Session) -> list[Request]:
    """Every request not yet run (tests, inspection)."""
    rows = session.execute(select(CallbackRequest).order_by(CallbackRequest.id)).scalars()
    return [Request(r.id, r.kind, r.dag_id, r.run_id, dict(r.data or {})) for r in rows]


@dataclass(frozen=True, slots=True)
class CallbackRun:
    """What the context of a DAG callback is built from: the run as a task sees it."""

    fileloc: str
    run: dict[str, Any]
    events: tuple[EventRow, ...]
    xcoms: dict[str, dict[str, Any]]
    #: the results of the run's copies of mapped tasks (``mapping.mapped_run_results``)
    mapped_xcoms: dict[str, dict[str, dict[str, Any]]]


def load_callback_run(session: Session, dag_id: str, run_id: str) -> CallbackRun | None:
    """The DAG file and the run of a DAG callback; None when the run or the DAG is gone."""
    row = session.execute(
        select(DagRun, Dag.fileloc)
        .join(Dag, Dag.dag_id == DagRun.dag_id)
        .where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
    ).first()
    if row is None:
        return None
    dag_run, fileloc = row
    return CallbackRun(
        fileloc=str(fileloc),
        run={**context_run(dag_run), "end_date": dag_run.end_date, "state": dag_run.state},
        events=tuple(triggering_events(session, dag_run.id)),
        xcoms=run_results(session, dag_run.id),
        mapped_xcoms=mapping_sql.mapped_run_results(session, dag_run.id),
    )
