"""SQL of operator actions on task instances (Airflow 3's semantics): clear tasks, set a
task's state; and what the executor checks to stop a task an action changed. Ending a whole
run (cancel, ``dagrun_timeout``) is ``engine.db.queries.run_ends``, on the helpers here.

Theory of operation. An action only writes rows; whatever still runs for a task stops on its
own because of what was written:

- a task the executor runs is *held*: its writes are guarded by ``executor_job_id`` and the
  ``running`` state (``tasks.held_by``). An action moves it out of ``running``; the executor
  notices at its next check (``changed_task_instances``), stops the process group, and its
  outcome write matches no row, so the new state stands;
- a task claimed but not started yet (``queued``) leaves ``queued``: ``start_task_run``
  finds it no longer queued for that executor, and its process is stopped unstarted;
- a deferred task's trigger row is deleted (unless another task or watcher still uses it):
  the triggerer stops that trigger at its next sync.

Clearing a running task does not make it ``none`` at once (a second process could start
before the first is stopped): it becomes ``restarting``, as in Airflow, and the executor
that held it makes it ``none`` once its process is gone (``release_restarted_task``; if that
executor died, ``release_orphaned_restarts``). Then the scheduler runs it again.

Every function takes the transaction's ``Session``; the CLI and the REST API call the same
functions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import func, or_, select, update

from engine.db.database import is_postgres
from engine.db.models import DagRun, DagTask, TaskInstance
from engine.db.queries import external_markers, jobs
from engine.db.queries import triggers as trigger_rows
from engine.db.queries.task_graph import (
    dag_graph,
    relatives,
    setup_teardown_roles,
    with_setups_and_teardowns,
)
from engine.exceptions import NotFoundError, OperatorActionError
from engine.states import DagRunState, TaskState

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable
    from datetime import datetime

    from sqlalchemy.orm import Session


EXECUTOR_JOB: Final = "executor"  # engine.db.queries.tasks.EXECUTOR_JOB

#: states a task that is being worked on is in (its process or its trigger runs)
ACTIVE_STATES: Final = frozenset({TaskState.RUNNING, TaskState.DEFERRED, TaskState.RESTARTING})
#: states of a task not started yet, or between tries
PENDING_STATES: Final = frozenset(
    {TaskState.NONE, TaskState.SCHEDULED, TaskState.QUEUED, TaskState.UP_FOR_RETRY}
)
UNFINISHED_STATES: Final = ACTIVE_STATES | PENDING_STATES
FAILED_STATES: Final = frozenset({TaskState.FAILED, TaskState.UPSTREAM_FAILED})
#: what ``sluice tasks set-state`` accepts (Airflow's mark success / failed / skipped)
SETTABLE_STATES: Final = (TaskState.SUCCESS, TaskState.FAILED, TaskState.SKIPPED)
_FINISHED_RUN: Final = (DagRunState.SUCCESS, DagRunState.FAILED)
_REMOVED: Final = "removed"


@dataclass(frozen=True, slots=True)
class TaskChange:
    """One task instance an action changed (or, dry, would change)."""

    ti_id: int
    dag_id: str
    run_id: str
    task_id: str
    old_state: str
    new_state: str
    map_index: int = -1  # a copy of a mapped task: its index (shown as ``task[i]``)

    def as_dict(self) -> dict[str, Any]:
        shown = self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": shown,
            "map_index": self.map_index,
            "state": self.old_state,
            "new_state": self.new_state,
        }


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What an action did: the task instances changed and the runs whose state changed
    (``run_id -> new state``)."""

    tasks: tuple[TaskChange, ...]
    runs: dict[str, str]


# --- which task instances -----------------------------------------------------------------


def run_pk_of(session: Session, dag_id: str, run_id: str) -> tuple[int, str]:
    row = session.execute(
        select(DagRun.id, DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
    ).first()
    if row is None:
        raise NotFoundError(
            f"DAG {dag_id!r} has no run {run_id!r}; see `sluice runs list {dag_id}`"
        )
    return int(row[0]), str(row[1])


def task_rows(session: Session, where: Iterable[Any], *, lock: bool = False) -> list[TaskChange]:
    """The task instances ``where`` selects; ``lock``: locked until the transaction ends
    (PostgreSQL; SQLite's writers are serialized), so that an executor or a scheduler cannot
    move one between this read and the action's update."""
    stmt = (
        select(
            TaskInstance.id,
            TaskInstance.dag_id,
            DagRun.run_id,
            TaskInstance.task_id,
            TaskInstance.state,
            TaskInstance.map_index,
        )
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(*where)
        .order_by(DagRun.id, TaskInstance.task_id, TaskInstance.map_index)
    )
    if lock and is_postgres(session):
        stmt = stmt.with_for_update(of=TaskInstance)
    rows = session.execute(stmt)
    return [
        TaskChange(int(i), str(d), str(r), str(t), str(s), str(s), int(m))
        for i, d, r, t, s, m in rows
    ]


def select_task_instances(
    session: Session,
    dag_id: str,
    *,
    run_id: str | None = None,
    start_date: datetime | None = None,
    end_date: datetime | None = None,
    task_regex: str | None = None,
    downstream: bool = False,
    upstream: bool = False,
    only_failed: bool = False,
    only_running: bool = False,
    map_index: int | None = None,
) -> list[TaskChange]:
    """The task instances ``sluice tasks clear`` would clear, as Airflow's ``tasks clear``.

    Tasks: those whose id matches ``task_regex`` (``re.search``; all when None), plus their
    downstream / upstream tasks, transitively, plus the setup tasks they need and those
    setups' teardowns (``with_setups_and_teardowns``). Runs: ``run_id``, or those whose logical date
    (``run_after`` for a run without one) is within ``start_date`` .. ``end_date`` (both
    included), or all. ``only_failed``: ``failed`` and ``upstream_failed`` ones;
    ``only_running``: ``running`` ones. ``map_index``: only that copy of each matched mapped
    task (their downstream / upstream tasks: all of their copies, as ``set_task_state``).
    An ``ExternalTaskMarker`` selected adds the task it marks in another DAG and the tasks
    below it (``engine.db.queries.external_markers``).
    """
    graph = dag_graph(session, dag_id)
    try:
        pattern = None if task_regex is None else re.compile(task_regex)
    except re.error as exc:
        raise OperatorActionError(f"--task-regex {task_regex!r} is not a regex: {exc}") from exc
    roots = [t for t in graph if pattern is None or pattern.search(t)]
    task_ids = relatives(graph, roots, downstream=downstream, upstream=upstream)
    task_ids = with_setups_and_teardowns(graph, task_ids, *setup_teardown_roles(session, dag_id))
    where: list[Any] = [TaskInstance.dag_id == dag_id, TaskInstance.task_id.in_(task_ids)]
    if run_id is not None:
        where.append(TaskInstance.dag_run_id == run_pk_of(session, dag_id, run_id)[0])
    when = func.coalesce(DagRun.logical_date, DagRun.run_after, DagRun.queued_at)
    if start_date is not None:
        where.append(when >= start_date)
    if end_date is not None:
        where.append(when <= end_date)
    states: set[str] = set()
    if only_failed:
        states |= FAILED_STATES
    if only_running:
        states.add(TaskState.RUNNING)
    if states:
        where.append(TaskInstance.state.in_(states))
    if map_index is not None:  # that copy of the matched tasks (their relatives: all copies)
        where.append(or_(TaskInstance.task_id.not_in(roots), TaskInstance.map_index == map_index))
    return external_markers.with_marked_tasks(session, task_rows(session, where), external=_below)


def _below(session: Session, dag_id: str, task_id: str, logical_date: datetime) -> list[TaskChange]:
    """``task_id`` and its downstream tasks in ``dag_id``'s run at ``logical_date``."""
    task_ids = relatives(dag_graph(session, dag_id), [task_id], downstream=True, upstream=False)
    at = [DagRun.logical_date == logical_date, TaskInstance.task_id.in_(task_ids)]
    return task_rows(session, [TaskInstance.dag_id == dag_id, *at])


# --- clearing -----------------------------------------------------------------------------


def _max_tries_again() -> Any:
    """A cleared task gets its retries again: ``max_tries`` = tries so far + its retries."""
    retries = (
        select(DagTask.retries)
        .where(DagTask.dag_id == TaskInstance.dag_id, DagTask.task_id == TaskInstance.task_id)
        .scalar_subquery()
    )
    return TaskInstance.try_number + func.coalesce(retries, 0)


def not_waiting() -> dict[str, Any]:
    """What a task that waits for nothing (no trigger, no retry time, no executor) holds."""
    return {
        "next_method": None,
        "next_kwargs": None,
        "trigger_id": None,
        "trigger_timeout": None,
        "next_retry_at": None,
        "queued_at": None,
        "executor_job_id": None,
        "pid": None,
    }


def update_returning(session: Session, ids: Collection[int], states: Any, values: Any) -> set[int]:
    """Update the rows of ``ids`` still in one of ``states``; the ids it updated."""
    if not ids:
        return set()
    result = session.execute(
        update(TaskInstance)
        .where(TaskInstance.id.in_(list(ids)), TaskInstance.state.in_(list(states)))
        .values(**values)
        .returning(TaskInstance.id)
    )
    return {int(i) for i in result.scalars()}


def trigger_ids_of(session: Session, ti_ids: Collection[int]) -> set[int]:
    """The triggers the task instances ``ti_ids`` wait on (read before they leave
    ``deferred``; ``delete_triggers`` deletes them after)."""
    if not ti_ids:
        return set()
    ids = session.execute(
        select(TaskInstance.trigger_id).where(
            TaskInstance.id.in_(list(ti_ids)), TaskInstance.trigger_id.is_not(None)
        )
    ).scalars()
    return {int(i) for i in ids if i is not None}


def delete_triggers(session: Session, trigger_ids: set[int]) -> None:
    """Delete the triggers no deferred task or watcher uses any more: the triggerer stops
    them at its next sync."""
    trigger_rows.delete_unused_triggers(session, trigger_ids)


def _requeue_finished_runs(
    session: Session, run_pks: Iterable[int], *, now: datetime
) -> dict[str, str]:
    """Finished runs of changed tasks go back to ``queued`` (as Airflow's clear): admitted
    again under ``max_active_runs``, their tasks re-evaluated by the scheduler."""
    pks = sorted(set(run_pks))
    if not pks:
        return {}
    rows = session.execute(
        update(DagRun)
        .where(DagRun.id.in_(pks), DagRun.state.in_(_FINISHED_RUN))
        .values(state=DagRunState.QUEUED, queued_at=now, start_date=None, end_date=None)
        .returning(DagRun.run_id)
    )
    return {str(run_id): DagRunState.QUEUED for run_id in rows.scalars()}


def _run_pks(session: Session, ti_ids: Collection[int]) -> list[int]:
    if not ti_ids:
        return []
    rows = session.execute(
        select(TaskInstance.dag_run_id).where(TaskInstance.id.in_(list(ti_ids))).distinct()
    )
    return [int(r) for r in rows.scalars()]


def clear_task_instances(
    session: Session, selected: Iterable[TaskChange], *, now: datetime
) -> ActionResult:
    """Clear task instances (Airflow's clear): the scheduler runs them again.

    Each goes back to ``none`` with its retries again (``max_tries`` = ``try_number`` +
    retries; ``try_number`` goes on counting) and nothing it waited for (deferral, retry
    time, executor). A deferred task's trigger is deleted. A running one becomes
    ``restarting`` until its executor has stopped its process (module docstring). Finished
    runs of cleared tasks go back to ``queued``.
    """
    ids = [c.ti_id for c in selected]  # read again, locked: their states now
    chosen = {c.ti_id: c for c in task_rows(session, [TaskInstance.id.in_(ids)], lock=True)}
    running = {i for i, c in chosen.items() if c.old_state == TaskState.RUNNING}
    others = set(chosen) - running
    restarting = update_returning(
        session,
        running,
        [TaskState.RUNNING],
        {"state": TaskState.RESTARTING, "max_tries": _max_tries_again(), "end_date": None},
    )
    trigger_ids = trigger_ids_of(session, others)
    cleared = update_returning(
        session,
        others,
        [s for s in TaskState if s not in (TaskState.RUNNING, TaskState.RESTARTING)],
        {
            "state": TaskState.NONE,
            "max_tries": _max_tries_again(),
            "end_date": None,
            **not_waiting(),
        },
    )
    delete_triggers(session, trigger_ids)
    done = restarting | cleared
    changes = tuple(
        with_state(chosen[i], TaskState.RESTARTING if i in restarting else TaskState.NONE)
        for i in sorted(done, key=lambda i: _order(chosen[i]))
    )
    requeued = _requeue_finished_runs(session, _run_pks(session, done), now=now)
    return ActionResult(changes, requeued)


def _order(change: TaskChange) -> tuple[str, str, int]:
    return change.run_id, change.task_id, change.map_index


def with_state(change: TaskChange, new_state: str) -> TaskChange:
    return replace(change, new_state=new_state)


# --- setting a state ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateTargets:
    """What marking a task ``state`` would change: the task instances it marks (their
    ``new_state`` the state), and, for ``success``, the failed ones below them it clears."""

    run_pk: int
    marked: tuple[TaskChange, ...]
    failed_below: tuple[TaskChange, ...]


def state_targets(
    session: Session,
    dag_id: str,
    run_id: str,
    task_id: str,
    state: str,
    *,
    downstream: bool = False,
    upstream: bool = False,
    map_index: int | None = None,
    lock: bool = False,
) -> StateTargets:
    """The task instances ``set_task_state`` would change (read only: the UI's confirmation
    lists them; ``set_task_state`` reads them again, locked, in its own transaction)."""
    if state not in SETTABLE_STATES:
        raise OperatorActionError(
            f"cannot set a task to {state!r}: one of {', '.join(SETTABLE_STATES)}"
        )
    graph = dag_graph(session, dag_id)
    if task_id not in graph:
        raise NotFoundError(
            f"DAG {dag_id!r} has no task {task_id!r}; see `sluice dags show {dag_id}`"
        )
    run_pk, _ = run_pk_of(session, dag_id, run_id)
    task_ids = relatives(graph, [task_id], downstream=downstream, upstream=upstream)
    where = [TaskInstance.dag_run_id == run_pk, TaskInstance.task_id.in_(task_ids)]
    if map_index is not None:  # one copy of the mapped task (its relatives: all copies)
        where.append(or_(TaskInstance.task_id != task_id, TaskInstance.map_index == map_index))
    rows = task_rows(session, where, lock=lock)
    if map_index is not None and not any(c.task_id == task_id for c in rows):
        raise NotFoundError(
            f"task {task_id!r} of run {run_id!r} has no copy with map_index {map_index}"
        )
    marked = tuple(with_state(c, state) for c in rows if c.old_state != state)
    below: list[TaskChange] = []
    if state == TaskState.SUCCESS:
        under = relatives(graph, task_ids, downstream=True, upstream=False) - task_ids
        failed = TaskInstance.state.in_(FAILED_STATES)
        below = task_rows(
            session, [TaskInstance.dag_run_id == run_pk, TaskInstance.task_id.in_(under), failed]
        )
    return StateTargets(run_pk, marked, tuple(with_state(c, TaskState.NONE) for c in below))


def set_task_state(
    session: Session,
    dag_id: str,
    run_id: str,
    task_id: str,
    state: str,
    *,
    downstream: bool = False,
    upstream: bool = False,
    map_index: int | None = None,
    now: datetime,
) -> ActionResult:
    """Mark a task (and, transitively, its downstream / upstream tasks) ``state``, as
    Airflow's mark success / failed; returns what changed. ``map_index``: only that copy
    of a mapped task (all of its copies otherwise).

    What runs for a marked task is stopped (module docstring). Marking ``success`` records
    no outlet asset events (the task did not run; ``sluice assets emit`` records one by
    hand) and clears the ``failed`` / ``upstream_failed`` tasks downstream of the marked
    ones, so they run again under their trigger rules. The run is re-evaluated by the
    scheduler: a finished one goes back to ``queued``.
    """
    which: dict[str, Any] = {"downstream": downstream, "upstream": upstream, "map_index": map_index}
    found = state_targets(session, dag_id, run_id, task_id, state, **which, lock=True)
    targets = {c.ti_id: c for c in found.marked}
    trigger_ids = trigger_ids_of(session, targets)
    marked = update_returning(
        session,
        targets,
        [s for s in TaskState if s != state],
        {"state": state, "end_date": now, **not_waiting()},
    )
    delete_triggers(session, trigger_ids)
    changes = [targets[i] for i in sorted(marked)]
    below = found.failed_below
    cleared = clear_task_instances(session, below, now=now).tasks if below else ()
    run_states = _requeue_finished_runs(session, [found.run_pk] if marked else [], now=now)
    return ActionResult((*changes, *cleared), run_states)


# --- the executor's side ------------------------------------------------------------------


def changed_task_instances(
    session: Session, ti_ids: Collection[int], *, job_id: int
) -> dict[int, str]:
    """Of the task instances executor ``job_id`` runs, those no longer ``running`` under
    it, with their state now (``removed`` when the row is gone: its run was deleted)."""
    if not ti_ids:
        return {}
    rows = session.execute(
        select(TaskInstance.id, TaskInstance.state, TaskInstance.executor_job_id).where(
            TaskInstance.id.in_(list(ti_ids))
        )
    ).all()
    found = {int(i): (str(s), j) for i, s, j in rows}
    changed = {i: _REMOVED for i in ti_ids if i not in found}
    for ti_id, (state, holder) in found.items():
        if state != TaskState.RUNNING or holder != job_id:
            changed[ti_id] = state
    return changed


def _release_values() -> dict[str, Any]:
    return {"state": TaskState.NONE, "end_date": None, **not_waiting()}


def release_restarted_task(session: Session, ti_id: int, *, job_id: int) -> bool:
    """A cleared task whose process executor ``job_id`` has stopped: ``restarting`` ->
    ``none``, for the scheduler to run again. False if it is not restarting under that job."""
    result = session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.id == ti_id,
            TaskInstance.executor_job_id == job_id,
            TaskInstance.state == TaskState.RESTARTING,
        )
        .values(**_release_values())
        .returning(TaskInstance.id)
    )
    return result.first() is not None


def release_orphaned_restarts(session: Session, *, threshold_s: float) -> list[int]:
    """``restarting`` tasks whose executor is dead (no heartbeat within ``threshold_s``):
    their process went with it, so they are ``none`` again."""
    alive = jobs.alive_job_ids(session, job_type=EXECUTOR_JOB, threshold_s=threshold_s)
    holder_dead = or_(
        TaskInstance.executor_job_id.is_(None), TaskInstance.executor_job_id.not_in(alive)
    )
    result = session.execute(
        update(TaskInstance)
        .where(TaskInstance.state == TaskState.RESTARTING, holder_dead)
        .values(**_release_values())
        .returning(TaskInstance.id)
    )
    return sorted(int(i) for i in result.scalars())
