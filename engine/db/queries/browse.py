"""SQL of the read model's DAG, run and task-instance lists (``engine.views``): filtered,
paged selects with their total, the per-DAG / per-run summaries shown beside them, and the
rows of one DAG (the assets of its schedule, its tasks, the watchers of its assets, its
last runs).

``fetch_page`` is the one way a list is paged: the total of the filtered select, then the
requested slice of it in its order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import String, cast, func, select

from engine.db.models import (
    Asset,
    AssetWatcher,
    Dag,
    DagRun,
    DagScheduleAsset,
    DagTask,
    TaskInstance,
    Trigger,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    from sqlalchemy import Select
    from sqlalchemy.orm import Session


def fetch_page(
    session: Session, stmt: Select[Any] | Any, *, limit: int | None, offset: int
) -> tuple[list[Any], int]:
    """(the rows of ``stmt`` from ``offset``, at most ``limit`` of them; the total count)."""
    counted = select(func.count()).select_from(stmt.order_by(None).subquery())
    total = int(session.execute(counted).scalar_one())
    if limit is not None:
        stmt = stmt.limit(limit)
    if offset:
        stmt = stmt.offset(offset)
    return list(session.execute(stmt).all()), total


def dag_page(
    session: Session,
    *,
    paused: bool | None = None,
    active: bool | None = None,
    tag: str | None = None,
    search: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[Dag], int]:
    """DAG rows by id; ``tag``: DAGs carrying it, ``search``: a part of the DAG id."""
    stmt = select(Dag).order_by(Dag.dag_id)
    if paused is not None:
        stmt = stmt.where(Dag.is_paused.is_(paused))
    if active is not None:
        stmt = stmt.where(Dag.is_active.is_(active))
    if tag is not None:  # the tags column is a JSON list: look for the tag's JSON text in it
        stmt = stmt.where(cast(Dag.tags, String).contains(json.dumps(tag), autoescape=True))
    if search:
        stmt = stmt.where(Dag.dag_id.contains(search, autoescape=True))
    rows, total = fetch_page(session, stmt, limit=limit, offset=offset)
    return [row[0] for row in rows], total


def get_dag(session: Session, dag_id: str) -> Dag | None:
    return session.get(Dag, dag_id)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A DAG's newest runs' states (newest first) and its number of runs per state."""

    last_run_states: list[str] = field(default_factory=list)
    run_counts: dict[str, int] = field(default_factory=dict)


def run_summaries(session: Session, dag_ids: Iterable[str], *, last: int) -> dict[str, RunSummary]:
    """dag_id -> the states of its ``last`` newest runs and its runs per state."""
    wanted = sorted(set(dag_ids))
    out = {d: RunSummary() for d in wanted}
    if not wanted:
        return out
    counts = session.execute(
        select(DagRun.dag_id, DagRun.state, func.count())
        .where(DagRun.dag_id.in_(wanted))
        .group_by(DagRun.dag_id, DagRun.state)
    )
    for dag_id, state, count in counts:
        out[dag_id].run_counts[str(state)] = int(count)
    rank = (
        func.row_number()
        .over(partition_by=DagRun.dag_id, order_by=(DagRun.queued_at.desc(), DagRun.id.desc()))
        .label("rank")
    )
    ranked = (
        select(DagRun.dag_id, DagRun.state, DagRun.queued_at, DagRun.id, rank)
        .where(DagRun.dag_id.in_(wanted))
        .subquery()
    )
    newest = session.execute(
        select(ranked.c.dag_id, ranked.c.state)
        .where(ranked.c.rank <= last)
        .order_by(ranked.c.dag_id, ranked.c.rank)
    )
    for dag_id, state in newest:
        out[dag_id].last_run_states.append(str(state))
    return out


def run_page(
    session: Session,
    *,
    dag_id: str | None = None,
    state: str | None = None,
    run_type: str | None = None,
    since: datetime | None = None,
    partition_key: str | None = None,
    newest_first: bool = True,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[DagRun], int]:
    """Runs, newest (or oldest) created first; ``since``: queued at or after it;
    ``partition_key``: runs of that partition only."""
    order = DagRun.id.desc() if newest_first else DagRun.id
    stmt = select(DagRun).order_by(order)
    if dag_id is not None:
        stmt = stmt.where(DagRun.dag_id == dag_id)
    if state is not None:
        stmt = stmt.where(DagRun.state == state)
    if run_type is not None:
        stmt = stmt.where(DagRun.run_type == run_type)
    if since is not None:
        stmt = stmt.where(DagRun.queued_at >= since)
    if partition_key is not None:
        stmt = stmt.where(DagRun.partition_key == partition_key)
    rows, total = fetch_page(session, stmt, limit=limit, offset=offset)
    return [row[0] for row in rows], total


def find_run(session: Session, dag_id: str, run_id: str) -> DagRun | None:
    query = select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
    return session.execute(query).scalar()


def run_task_states(session: Session, run_pks: Iterable[int]) -> dict[int, dict[str, str]]:
    """run pk -> {task name: state}; a copy of a mapped task is named ``task_id[i]``, as
    Airflow's UI names it."""
    wanted = list(run_pks)
    if not wanted:
        return {}
    rows = session.execute(
        select(
            TaskInstance.dag_run_id,
            TaskInstance.task_id,
            TaskInstance.map_index,
            TaskInstance.state,
        )
        .where(TaskInstance.dag_run_id.in_(wanted))
        .order_by(TaskInstance.id, TaskInstance.map_index)
    )
    by_run: dict[int, dict[str, str]] = {}
    for run_pk, task_id, map_index, state in rows:
        name = str(task_id) if map_index < 0 else f"{task_id}[{map_index}]"
        by_run.setdefault(int(run_pk), {})[name] = str(state)
    return by_run


def task_instance_page(
    session: Session,
    run_pk: int,
    *,
    state: str | None = None,
    task_id: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[tuple[TaskInstance, str | None]], int]:
    """A run's task instances in the DAG's task order (then map index), with the operator
    of their task (None for a task the DAG no longer has)."""
    stmt = (
        select(TaskInstance, DagTask.operator)
        .outerjoin(
            DagTask,
            (DagTask.dag_id == TaskInstance.dag_id) & (DagTask.task_id == TaskInstance.task_id),
        )
        .where(TaskInstance.dag_run_id == run_pk)
        .order_by(
            func.coalesce(DagTask.position, 1 << 30), TaskInstance.task_id, TaskInstance.map_index
        )
    )
    if state is not None:
        stmt = stmt.where(TaskInstance.state == state)
    if task_id is not None:
        stmt = stmt.where(TaskInstance.task_id == task_id)
    rows, total = fetch_page(session, stmt, limit=limit, offset=offset)
    return [(ti, op) for ti, op in rows], total


def find_task_instance_with_operator(
    session: Session, run_pk: int, task_id: str, map_index: int
) -> tuple[TaskInstance, str | None] | None:
    row = session.execute(
        select(TaskInstance, DagTask.operator)
        .outerjoin(
            DagTask,
            (DagTask.dag_id == TaskInstance.dag_id) & (DagTask.task_id == TaskInstance.task_id),
        )
        .where(
            TaskInstance.dag_run_id == run_pk,
            TaskInstance.task_id == task_id,
            TaskInstance.map_index == map_index,
        )
    ).first()
    return None if row is None else (row[0], row[1])


def schedule_assets(session: Session, dag_id: str) -> list[str]:
    """The names of the assets the DAG is scheduled on, by name."""
    query = (
        select(Asset.name)
        .join(DagScheduleAsset, DagScheduleAsset.asset_id == Asset.id)
        .where(DagScheduleAsset.dag_id == dag_id)
        .order_by(Asset.name)
    )
    return list(session.execute(query).scalars())


def dag_tasks(session: Session, dag_id: str) -> list[DagTask]:
    """The DAG's tasks in their order."""
    query = select(DagTask).where(DagTask.dag_id == dag_id).order_by(DagTask.position)
    return list(session.execute(query).scalars())


def dag_watchers(session: Session, dag_id: str) -> list[tuple[str, str, Trigger]]:
    """(asset name, watcher name, its trigger row) of the assets the DAG is scheduled on, by
    asset and watcher name."""
    query = (
        select(Asset.name, AssetWatcher.name, Trigger)
        .join(DagScheduleAsset, DagScheduleAsset.asset_id == Asset.id)
        .join(AssetWatcher, AssetWatcher.asset_id == Asset.id)
        .join(Trigger, Trigger.id == AssetWatcher.trigger_id)
        .where(DagScheduleAsset.dag_id == dag_id)
        .order_by(Asset.name, AssetWatcher.name)
    )
    return [(str(asset), str(name), trig) for asset, name, trig in session.execute(query)]


def last_runs(session: Session, dag_id: str, *, last: int) -> list[DagRun]:
    """The DAG's ``last`` runs queued most recently, newest first."""
    query = (
        select(DagRun)
        .where(DagRun.dag_id == dag_id)
        .order_by(DagRun.queued_at.desc(), DagRun.id.desc())
        .limit(last)
    )
    return list(session.execute(query).scalars())
