"""SQL of the read model's DAG, run and task-instance lists (``engine.views``): filtered,
paged selects with their total, the per-DAG / per-run summaries shown beside them, and one
DAG's details (tasks, the watchers of its assets, its last runs).

``fetch_page`` is the one way a list is paged: the total of the filtered select, then the
requested slice of it in its order.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import String, cast, func, select

from engine.authoring.mapping import describe_mapping
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


#: Runs ``dag_details`` shows (newest first).
LAST_RUNS: Final = 5


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


def run_summaries(
    session: Session, dag_ids: Iterable[str], *, last: int
) -> dict[str, dict[str, Any]]:
    """dag_id -> ``last_run_states`` (of its ``last`` newest runs, newest first) and
    ``run_counts`` (runs per state)."""
    wanted = sorted(set(dag_ids))
    out: dict[str, dict[str, Any]] = {d: {"last_run_states": [], "run_counts": {}} for d in wanted}
    if not wanted:
        return out
    counts = session.execute(
        select(DagRun.dag_id, DagRun.state, func.count())
        .where(DagRun.dag_id.in_(wanted))
        .group_by(DagRun.dag_id, DagRun.state)
    )
    for dag_id, state, count in counts:
        out[dag_id]["run_counts"][str(state)] = int(count)
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
        out[dag_id]["last_run_states"].append(str(state))
    return out


def run_page(
    session: Session,
    *,
    dag_id: str | None = None,
    state: str | None = None,
    run_type: str | None = None,
    since: datetime | None = None,
    newest_first: bool = True,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[DagRun], int]:
    """Runs, newest (or oldest) created first; ``since``: queued at or after it."""
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


def dag_details(session: Session, dag_id: str) -> dict[str, Any] | None:
    """One DAG as last parsed: file, schedule, tasks, the watchers of its assets, runs."""
    dag = session.get(Dag, dag_id)
    if dag is None:
        return None
    return {
        "dag_id": dag.dag_id,
        "fileloc": dag.fileloc,
        "description": dag.description,
        "paused": dag.is_paused,
        "active": dag.is_active,
        "last_parsed": None if dag.last_parsed_time is None else dag.last_parsed_time.isoformat(),
        "schedule": dag.schedule,
        "assets": _schedule_assets(session, dag_id),
        "tasks": _dag_tasks(session, dag_id),
        "watchers": _dag_watchers(session, dag_id),
        "last_runs": _last_runs(session, dag_id),
    }


def _schedule_assets(session: Session, dag_id: str) -> list[str]:
    query = (
        select(Asset.name)
        .join(DagScheduleAsset, DagScheduleAsset.asset_id == Asset.id)
        .where(DagScheduleAsset.dag_id == dag_id)
        .order_by(Asset.name)
    )
    return list(session.execute(query).scalars())


def _dag_tasks(session: Session, dag_id: str) -> list[dict[str, Any]]:
    query = select(DagTask).where(DagTask.dag_id == dag_id).order_by(DagTask.position)
    return [
        {
            "task_id": t.task_id,
            "operator": t.operator,
            "downstream": list(t.downstream_task_ids or []),
            "retries": t.retries,
            "start_from_trigger": t.start_from_trigger,
            "outlets": [*(t.outlets or []), *(f"alias:{a}" for a in t.outlet_aliases or [])],
            "inlets": list(t.inlets or []),
            "mapped": describe_mapping(t.mapping) if t.mapping else None,
        }
        for t in session.execute(query).scalars()
    ]


def _dag_watchers(session: Session, dag_id: str) -> list[dict[str, Any]]:
    query = (
        select(Asset.name, AssetWatcher.name, Trigger)
        .join(DagScheduleAsset, DagScheduleAsset.asset_id == Asset.id)
        .join(AssetWatcher, AssetWatcher.asset_id == Asset.id)
        .join(Trigger, Trigger.id == AssetWatcher.trigger_id)
        .where(DagScheduleAsset.dag_id == dag_id)
        .order_by(Asset.name, AssetWatcher.name)
    )
    return [
        {
            "asset": asset,
            "name": name,
            "trigger_id": trig.id,
            "classpath": trig.classpath,
            "triggerer_id": trig.triggerer_id,
            "last_error": trig.last_error,
        }
        for asset, name, trig in session.execute(query)
    ]


def _last_runs(session: Session, dag_id: str) -> list[dict[str, Any]]:
    query = (
        select(DagRun)
        .where(DagRun.dag_id == dag_id)
        .order_by(DagRun.queued_at.desc(), DagRun.id.desc())
        .limit(LAST_RUNS)
    )
    return [
        {
            "run_id": run.run_id,
            "run_type": run.run_type,
            "state": run.state,
            "logical_date": None if run.logical_date is None else run.logical_date.isoformat(),
            "queued_at": run.queued_at.isoformat(),
            "end_date": None if run.end_date is None else run.end_date.isoformat(),
        }
        for run in session.execute(query).scalars()
    ]
