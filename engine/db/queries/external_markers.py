"""SQL of clearing across DAGs: the ``ExternalTaskMarker``\\ s among the task instances a
clear selected, and the task instances they mark (``engine.authoring.external_task_marker``).

A marker that ran recorded its rendered target in its results (``MARKER_XCOM_KEY``): the
external DAG, task and logical date, and its ``recursion_depth``. ``with_marked_tasks`` adds,
for each marker selected, that task's instance in the external DAG's run at that logical
date and the tasks downstream of it there, and goes on with the markers among those, as
Airflow's clear does: the first marker's ``recursion_depth`` bounds how many markers deep.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy import select

from engine.authoring.external_task_marker import MARKER_CLASSPATH, MARKER_XCOM_KEY
from engine.db.models import DagTask, TaskInstance
from engine.exceptions import NotFoundError, OperatorActionError
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from sqlalchemy.orm import Session


class Selected(Protocol):
    @property
    def ti_id(self) -> int: ...

    @property
    def task_id(self) -> str: ...


C = TypeVar("C", bound=Selected)


@dataclass(frozen=True, slots=True)
class MarkerTarget:
    dag_id: str
    task_id: str
    logical_date: datetime
    recursion_depth: int


def marker_targets(session: Session, ti_ids: Iterable[int]) -> dict[int, MarkerTarget]:
    """ti id -> what it marks, for the markers among ``ti_ids`` that recorded a target."""
    ids = list(ti_ids)
    if not ids:
        return {}
    rows = session.execute(
        select(TaskInstance.id, TaskInstance.xcoms)
        .join(
            DagTask,
            (DagTask.dag_id == TaskInstance.dag_id) & (DagTask.task_id == TaskInstance.task_id),
        )
        .where(TaskInstance.id.in_(ids), DagTask.operator == MARKER_CLASSPATH)
    )
    found: dict[int, MarkerTarget] = {}
    for ti_id, xcoms in rows:
        recorded = (xcoms or {}).get(MARKER_XCOM_KEY)
        target = None if recorded is None else _target(deserialize_value(recorded))
        if target is not None:
            found[int(ti_id)] = target
    return found


def _target(value: Any) -> MarkerTarget | None:
    if not isinstance(value, dict):
        return None
    try:
        return MarkerTarget(
            str(value["external_dag_id"]),
            str(value["external_task_id"]),
            datetime.fromisoformat(str(value["logical_date"])),
            int(value["recursion_depth"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def with_marked_tasks(
    session: Session,
    selected: list[C],
    *,
    external: Callable[[Session, str, str, datetime], list[C]],
) -> list[C]:
    """``selected`` plus what its markers mark, recursively (module docstring).
    ``external(session, dag_id, task_id, logical_date)`` gives the task instances of a task
    and its downstream tasks in a DAG's run at a logical date."""
    result = list(selected)
    seen = {change.ti_id for change in result}
    level: list[C] = result
    depth, limit = 0, 0
    while level:
        targets = marker_targets(session, (change.ti_id for change in level))
        following: list[C] = []
        for change in level:
            target = targets.get(change.ti_id)
            if target is None:
                continue
            if depth == 0:
                limit = max(limit, target.recursion_depth)
            if depth + 1 > limit:
                raise OperatorActionError(
                    f"Maximum recursion depth {limit} reached for ExternalTaskMarker "
                    f"{change.task_id!r}: attempted to clear too many tasks, or the markers "
                    "form a cycle"
                )
            for found in _marked(session, change, target, external):
                if found.ti_id not in seen:
                    seen.add(found.ti_id)
                    result.append(found)
                    following.append(found)
        level, depth = following, depth + 1
    return result


def _marked(
    session: Session,
    change: Selected,
    target: MarkerTarget,
    external: Callable[[Session, str, str, datetime], list[C]],
) -> list[C]:
    try:
        return external(session, target.dag_id, target.task_id, target.logical_date)
    except NotFoundError as exc:
        raise OperatorActionError(
            f"ExternalTaskMarker {change.task_id!r} marks task {target.task_id!r} of DAG "
            f"{target.dag_id!r}, which could not be found: {exc}"
        ) from exc
