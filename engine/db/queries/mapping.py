"""SQL of dynamic task mapping: the copies of mapped tasks (``task_instance.map_index``).

A run is created with one row per task (``map_index`` -1). When a mapped task's upstream
tasks are done, the scheduler asks ``map_length`` (``engine.authoring.mapping``) how many
copies it gets, reading upstream results through ``upstream_value``; ``expand_task`` then
turns the -1 row into copy 0 and adds copies 1..N-1, all ``scheduled`` (none: the row is
``skipped``, as Airflow does for an empty input). Copies are ordinary task instances: the
executor runs each with its own ``map_index``, retries it and defers it alone. A run that
starts over (``runs.rerun_run``) puts every copy back in ``none``; the task is expanded
again then, reusing its copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, delete, insert, select, update

from engine.authoring.params import NOTSET
from engine.db.database import read_rows
from engine.db.models import DagRun, DagTask, TaskInstance
from engine.states import TaskState
from triggers.exceptions import SerializationError
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session


def task_mappings(session: Session, dag_id: str) -> dict[str, dict[str, Any]]:
    """The DAG's mapped tasks: ``{task_id: mapping}`` (``MappedOperator.mapping_json()``)."""
    rows = session.execute(
        select(DagTask.task_id, DagTask.mapping).where(
            DagTask.dag_id == dag_id, DagTask.mapping.is_not(None)
        )
    )
    return {str(t): dict(m) for t, m in rows if isinstance(m, dict)}


def _decoded(value: Any) -> Any:
    try:
        return deserialize_value(value)
    except SerializationError:
        return value


def upstream_value(session: Session, run_pk: int, task_id: str, key: str) -> Any:
    """The result ``key`` of task ``task_id`` in the run, as a mapped task maps over it:
    the unmapped task's value, or the list of its copies' values by ``map_index`` (those
    that stored one); ``NOTSET`` when none was stored."""
    rows = session.execute(
        select(TaskInstance.map_index, TaskInstance.xcoms)
        .where(
            TaskInstance.dag_run_id == run_pk,
            TaskInstance.task_id == task_id,
            TaskInstance.state == TaskState.SUCCESS,
        )
        .order_by(TaskInstance.map_index)
    ).all()
    mapped = [xcoms for index, xcoms in rows if index >= 0]
    if mapped:
        return [_decoded(x[key]) for x in mapped if isinstance(x, dict) and key in x]
    for _, xcoms in rows:
        if isinstance(xcoms, dict) and key in xcoms:
            return _decoded(xcoms[key])
    return NOTSET


def expand_task(
    session: Session,
    run_pk: int,
    task_id: str,
    length: int,
    *,
    now: datetime,
    waiting: bool = False,
) -> list[int]:
    """Create the copies of mapped task ``task_id`` (``length`` of them, all ``scheduled``);
    ``length`` 0 skips the task. Returns the ids of the scheduled copies.

    The waiting (``none``) rows of the task are reused: the unmapped row becomes copy 0, and
    the copies of a run that starts over keep their try numbers (copies past ``length`` go,
    missing ones are added). Guarded by the rows still waiting: two schedulers never expand
    one task twice. ``waiting``: the copies stay ``none``, each to be decided on its own (a
    task of a mapped task group, ``engine.advancing.rules``); nothing is scheduled.
    """
    rows = session.execute(
        select(TaskInstance.id, TaskInstance.map_index, TaskInstance.dag_id, TaskInstance.max_tries)
        .where(
            TaskInstance.dag_run_id == run_pk,
            TaskInstance.task_id == task_id,
            TaskInstance.state == TaskState.NONE,
        )
        .order_by(TaskInstance.map_index)
    ).all()
    if not rows:
        return []
    by_index = {int(index): int(ti_id) for ti_id, index, _, _ in rows}
    dag_id, max_tries = str(rows[0][2]), int(rows[0][3])
    first = by_index.pop(-1, None) if -1 in by_index else by_index.pop(0)
    extra = [ti_id for index, ti_id in by_index.items() if index >= max(length, 1)]
    if extra:
        session.execute(delete(TaskInstance).where(TaskInstance.id.in_(extra)))
    if length == 0:
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.id == first)
            .values(map_index=-1, state=TaskState.SKIPPED, end_date=now)
        )
        return []
    session.execute(update(TaskInstance).where(TaskInstance.id == first).values(map_index=0))
    missing = [index for index in range(1, length) if index not in by_index]
    if missing:
        session.execute(
            insert(TaskInstance),
            [
                {
                    "dag_run_id": run_pk,
                    "dag_id": dag_id,
                    "task_id": task_id,
                    "map_index": index,
                    "max_tries": max_tries,
                    "state": TaskState.NONE,
                }
                for index in missing
            ],
        )
    if waiting:
        return []
    ids = session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.dag_run_id == run_pk,
            TaskInstance.task_id == task_id,
            TaskInstance.state == TaskState.NONE,
        )
        .values(state=TaskState.SCHEDULED)
        .returning(TaskInstance.id)
    ).scalars()
    return sorted(int(i) for i in ids)


def mapped_run_results(session: Session, dag_run_id: int) -> dict[str, dict[str, dict[str, Any]]]:
    """The results of the run's succeeded copies of mapped tasks: ``{task_id: {map_index (as
    text): {key: tagged JSON}}}`` (what ``ti.xcom_pull`` reads for a mapped task)."""
    rows = session.execute(
        select(TaskInstance.task_id, TaskInstance.map_index, TaskInstance.xcoms).where(
            TaskInstance.dag_run_id == dag_run_id,
            TaskInstance.map_index >= 0,
            TaskInstance.state == TaskState.SUCCESS,
            TaskInstance.xcoms.is_not(None),
        )
    )
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for task_id, index, xcoms in rows:
        if isinstance(xcoms, dict):
            out.setdefault(str(task_id), {})[str(int(index))] = dict(xcoms)
    return out


_MAPPED_STATES = (
    select(TaskInstance.task_id, TaskInstance.state)
    .where(TaskInstance.dag_run_id == bindparam("run_pk"), TaskInstance.map_index >= 0)
    .order_by(TaskInstance.task_id, TaskInstance.map_index)
)


def mapped_states(session: Session, run_pk: int) -> dict[str, list[str]]:
    """``{task_id: [state of copy 0, 1, ...]}`` for the expanded mapped tasks of a run."""
    rows = read_rows(session, _MAPPED_STATES, {"run_pk": run_pk})
    out: dict[str, list[str]] = {}
    for task_id, state in rows:
        out.setdefault(str(task_id), []).append(str(state))
    return out


def copy_names(
    session: Session, dag_id: str, run_id: str, task_id: str
) -> list[tuple[int, str | None]]:
    """The copies of a task in a run: ``(map_index, rendered_map_index)`` by map index
    (empty: unmapped or not expanded yet)."""
    rows = session.execute(
        select(TaskInstance.map_index, TaskInstance.rendered_map_index)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(
            DagRun.dag_id == dag_id,
            DagRun.run_id == run_id,
            TaskInstance.task_id == task_id,
            TaskInstance.map_index >= 0,
        )
        .order_by(TaskInstance.map_index)
    )
    return [(int(index), None if name is None else str(name)) for index, name in rows]


def map_indexes(session: Session, dag_id: str, run_id: str, task_id: str) -> list[int]:
    """The map indexes of a task's copies in a run (empty: unmapped or not expanded yet)."""
    rows = session.execute(
        select(TaskInstance.map_index)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(
            DagRun.dag_id == dag_id,
            DagRun.run_id == run_id,
            TaskInstance.task_id == task_id,
            TaskInstance.map_index >= 0,
        )
        .order_by(TaskInstance.map_index)
    )
    return [int(i) for i in rows.scalars()]


def set_rendered_map_index(session: Session, ti_id: int, rendered: str) -> None:
    """Store what the copy's ``map_index_template`` rendered to (``engine.execution.
    map_index``), written with the try's outcome."""
    session.execute(
        update(TaskInstance).where(TaskInstance.id == ti_id).values(rendered_map_index=rendered)
    )


def set_copy_states(
    session: Session, run_pk: int, task_id: str, states: dict[int, str], *, now: datetime
) -> int:
    """Set the state of single waiting copies of a task (``{map_index: state}``, decided
    one by one for a mapped task group); returns how many were set."""
    written = 0
    for index, state in states.items():
        values: dict[str, Any] = {"state": state}
        if state in (TaskState.UPSTREAM_FAILED, TaskState.SKIPPED, TaskState.FAILED):
            values["end_date"] = now
        done = session.execute(
            update(TaskInstance)
            .where(
                TaskInstance.dag_run_id == run_pk,
                TaskInstance.task_id == task_id,
                TaskInstance.map_index == index,
                TaskInstance.state == TaskState.NONE,
            )
            .values(**values)
        )
        written += int(done.rowcount)  # type: ignore[attr-defined]
    return written
