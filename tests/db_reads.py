"""Reads of the metadata database that only tests make (the engine never needs them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import func, select

from engine.db.models import DagRun, TaskInstance, Trigger

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def find_task_instance(
    session: Session, dag_id: str, run_id: str, task_id: str, map_index: int = -1
) -> TaskInstance | None:
    """One task instance: the task's, or one copy's of a mapped task (``map_index``)."""
    return session.execute(
        select(TaskInstance)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(
            DagRun.dag_id == dag_id,
            DagRun.run_id == run_id,
            TaskInstance.task_id == task_id,
            TaskInstance.map_index == map_index,
        )
    ).scalar()


def count_triggers(session: Session) -> int:
    """How many trigger rows there are."""
    return int(session.execute(select(func.count()).select_from(Trigger)).scalar_one())
