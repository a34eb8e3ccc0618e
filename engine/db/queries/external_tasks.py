"""SQL of ``ExternalTaskSensor``'s wait: the states of another DAG's runs and tasks at given
logical dates, read by the triggerer for an ``ExternalTaskTrigger`` (read only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select

from engine.authoring.external_task_trigger import ExternalQuery, ExternalStates
from engine.db.models import Dag, DagRun, DagTask, TaskInstance
from engine.states import TaskState

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import InstrumentedAttribute, Session
    from sqlalchemy.sql.elements import ColumnElement


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _task_filter(
    column: ColumnElement[str] | InstrumentedAttribute[str], query: ExternalQuery
) -> ColumnElement[bool] | None:
    """Which task ids of the external DAG are watched: the ids, or the group's (its tasks'
    ids start with ``<group_id>.``, how a task group prefixes its children)."""
    if query.task_ids is not None:
        return column.in_(query.task_ids)
    if query.task_group_id is not None:
        return column.like(_escape_like(query.task_group_id) + ".%", escape="\\")
    return None


_ENDED: frozenset[str] = frozenset(
    {TaskState.SUCCESS, TaskState.FAILED, TaskState.UPSTREAM_FAILED, TaskState.SKIPPED}
)


def _one_state(states: list[str]) -> str:
    """One state for a task's instances (a mapped task has one per copy): a failure of any
    copy first, then ``running`` while a copy is unfinished, ``skipped`` when all were,
    else ``success``."""
    if len(states) == 1:
        return states[0]
    for failed in (TaskState.FAILED, TaskState.UPSTREAM_FAILED):
        if failed in states:
            return failed
    if any(state not in _ENDED for state in states):
        return TaskState.RUNNING
    if all(state == TaskState.SKIPPED for state in states):
        return TaskState.SKIPPED
    return TaskState.SUCCESS


def read_external_states(session: Session, query: ExternalQuery) -> ExternalStates:
    """What the database says now about ``query`` (see ``ExternalStates``)."""
    dag_exists = session.get(Dag, query.dag_id) is not None
    watched = _task_filter(DagTask.task_id, query)
    known: frozenset[str] = frozenset()
    if watched is not None:
        known = frozenset(
            session.execute(
                select(DagTask.task_id).where(DagTask.dag_id == query.dag_id, watched)
            ).scalars()
        )
    runs = session.execute(
        select(DagRun.id, DagRun.logical_date, DagRun.state).where(
            DagRun.dag_id == query.dag_id, DagRun.logical_date.in_(query.logical_dates)
        )
    ).all()
    run_states: dict[datetime, str] = {}
    date_of_run: dict[int, datetime] = {}
    for run in runs:
        run_states[run.logical_date] = run.state
        date_of_run[run.id] = run.logical_date
    task_states: dict[datetime, dict[str, str]] = {date: {} for date in run_states}
    ti_filter = _task_filter(TaskInstance.task_id, query)
    if ti_filter is not None and date_of_run:
        found = session.execute(
            select(TaskInstance.dag_run_id, TaskInstance.task_id, TaskInstance.state).where(
                TaskInstance.dag_run_id.in_(list(date_of_run)), ti_filter
            )
        ).all()
        copies: dict[tuple[datetime, str], list[str]] = {}
        for row in found:
            copies.setdefault((date_of_run[row.dag_run_id], row.task_id), []).append(row.state)
        for (date, task_id), states in copies.items():
            task_states[date][task_id] = _one_state(states)
    return ExternalStates(
        dag_exists=dag_exists,
        known_task_ids=known,
        run_states=run_states,
        task_states=task_states,
    )
