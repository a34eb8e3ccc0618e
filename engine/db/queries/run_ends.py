"""SQL of ending a run before its tasks finished: by hand (``cancel_run``, Airflow's "mark run
as failed") or past its DAG's ``dagrun_timeout`` (``time_out_runs``, each scheduler loop).

The run ends at once; its unfinished tasks end with it, and what still runs for them stops
on its own, as after any operator action (``engine.db.queries.actions``): their processes
see they are no longer ``running``, their trigger rows are deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from sqlalchemy import select, update

from engine.db.models import Dag, DagRun, TaskInstance
from engine.db.queries import actions, callbacks, task_graph, time_schedules
from engine.exceptions import InvalidStateError
from engine.states import DagRunState, TaskState

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    from sqlalchemy.orm import Session


_UNFINISHED_RUN: Final = (DagRunState.QUEUED, DagRunState.RUNNING)


@dataclass(frozen=True, slots=True)
class EndedRun:
    """A run ended by ``cancel_run`` or ``time_out_runs``."""

    run_pk: int
    dag_id: str
    run_id: str
    old_state: str
    tasks: tuple[actions.TaskChange, ...]
    start_date: datetime | None = None
    timeout_s: float | None = None


def end_run(
    session: Session,
    run_pk: int,
    *,
    state: str,
    active_to: str,
    pending_to: str,
    now: datetime,
) -> EndedRun | None:
    """End an unfinished run as ``state``: its active tasks (running, deferred, restarting)
    become ``active_to``, its pending ones (none, scheduled, queued, up_for_retry)
    ``pending_to``; their processes and triggers stop (module docstring). None when the
    run was not queued or running (someone ended it first)."""
    row = session.execute(
        update(DagRun)
        .where(DagRun.id == run_pk, DagRun.state.in_(_UNFINISHED_RUN))
        .values(state=state, end_date=now)
        .returning(DagRun.dag_id, DagRun.run_id)
    ).first()
    if row is None:
        return None
    dag_id, run_id = str(row[0]), str(row[1])
    tis = actions.task_rows(
        session,
        [TaskInstance.dag_run_id == run_pk, TaskInstance.state.in_(actions.UNFINISHED_STATES)],
        lock=True,
    )
    trigger_ids = actions.trigger_ids_of(session, [c.ti_id for c in tis])
    changes: list[actions.TaskChange] = []
    planned = ending_changes(tis, active_to=active_to, pending_to=pending_to)
    for states, new_state in (
        (actions.ACTIVE_STATES, active_to),
        (actions.PENDING_STATES, pending_to),
    ):
        group = {c.ti_id: c for c in planned if c.old_state in states}
        done = actions.update_returning(
            session, group, states, {"state": new_state, "end_date": now, **actions.not_waiting()}
        )
        changes += [group[i] for i in done]
    actions.delete_triggers(session, trigger_ids)
    time_schedules.recompute_next_dagrun(
        session, dag_id
    )  # a time run held by max_active_runs may go
    changes.sort(key=lambda c: (c.task_id, c.map_index))
    return EndedRun(run_pk, dag_id, run_id, "", tuple(changes))


def ending_changes(
    tis: Iterable[actions.TaskChange], *, active_to: str, pending_to: str
) -> list[actions.TaskChange]:
    """What ending a run does to its unfinished task instances ``tis``: active ones (running,
    deferred, restarting) become ``active_to``, pending ones ``pending_to``."""
    ends = [(actions.ACTIVE_STATES, active_to), (actions.PENDING_STATES, pending_to)]
    return [
        actions.with_state(c, new_state)
        for c in tis
        for states, new_state in ends
        if c.old_state in states
    ]


def cancel_preview(session: Session, dag_id: str, run_id: str) -> list[actions.TaskChange]:
    """What ``cancel_run`` would change now (read only: the UI's confirmation lists it). A
    finished run is an error naming its state, as ``cancel_run``."""
    task_graph.dag_graph(session, dag_id)
    run_pk, state = actions.run_pk_of(session, dag_id, run_id)
    if state not in _UNFINISHED_RUN:
        raise InvalidStateError(f"run {run_id!r} of DAG {dag_id!r} already ended: {state}")
    unfinished = TaskInstance.state.in_(actions.UNFINISHED_STATES)
    tis = actions.task_rows(session, [TaskInstance.dag_run_id == run_pk, unfinished])
    ended = ending_changes(tis, active_to=TaskState.FAILED, pending_to=TaskState.SKIPPED)
    return sorted(ended, key=lambda c: (c.task_id, c.map_index))


def cancel_run(session: Session, dag_id: str, run_id: str, *, now: datetime) -> EndedRun:
    """Mark an unfinished run failed, as Airflow's "mark run as failed": ``running`` and
    ``deferred`` (and ``restarting``) tasks become ``failed``, tasks not started or waiting
    for a retry become ``skipped``. A finished run is an error naming its state."""
    task_graph.dag_graph(session, dag_id)
    run_pk, old_state = actions.run_pk_of(session, dag_id, run_id)
    ended = end_run(
        session,
        run_pk,
        state=DagRunState.FAILED,
        active_to=TaskState.FAILED,
        pending_to=TaskState.SKIPPED,
        now=now,
    )
    if ended is None:
        raise InvalidStateError(f"run {run_id!r} of DAG {dag_id!r} already ended: {old_state}")
    return EndedRun(ended.run_pk, dag_id, run_id, old_state, ended.tasks)


def timed_out_runs(session: Session, *, now: datetime) -> list[tuple[int, datetime, float]]:
    """(run, its start, its DAG's ``dagrun_timeout`` in seconds) of the running runs of
    unpaused DAGs that started that long or more before ``now``, in id order (a read:
    ``advancing.has_clock_work`` asks it too)."""
    rows = session.execute(
        select(DagRun.id, DagRun.start_date, Dag.dagrun_timeout_s)
        .join(Dag, Dag.dag_id == DagRun.dag_id)
        .where(
            DagRun.state == DagRunState.RUNNING,
            DagRun.start_date.is_not(None),
            Dag.dagrun_timeout_s.is_not(None),
            Dag.is_paused.is_(False),
        )
        .order_by(DagRun.id)
    ).all()
    return [
        (int(run_pk), start_date, float(timeout_s))
        for run_pk, start_date, timeout_s in rows
        if start_date is not None  # (both excluded by the query)
        and timeout_s is not None
        and start_date + timedelta(seconds=float(timeout_s)) <= now
    ]


def time_out_runs(session: Session, *, now: datetime) -> list[EndedRun]:
    """Fail the running runs of unpaused DAGs that started ``dagrun_timeout`` or more
    before ``now`` (Airflow: the run fails, its unfinished tasks, running ones included,
    are skipped)."""
    ended: list[EndedRun] = []
    for run_pk, start_date, timeout_s in timed_out_runs(session, now=now):
        run = end_run(
            session,
            int(run_pk),
            state=DagRunState.FAILED,
            active_to=TaskState.SKIPPED,
            pending_to=TaskState.SKIPPED,
            now=now,
        )
        if run is not None:
            callbacks.request_dag_callback(  # its on_failure_callback, as Airflow
                session, run.run_pk, DagRunState.FAILED, now=now, reason="timed_out"
            )
            ended.append(
                EndedRun(
                    run.run_pk,
                    run.dag_id,
                    run.run_id,
                    DagRunState.RUNNING,
                    run.tasks,
                    start_date=start_date,
                    timeout_s=timeout_s,
                )
            )
    return ended
