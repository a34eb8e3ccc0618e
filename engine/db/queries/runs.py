"""SQL of scheduling: queued DAGs, DAG runs and their task states, runs' triggering events,
and the run listings of the CLI.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select, update

from engine.db.database import is_postgres
from engine.db.models import (
    Asset,
    AssetEvent,
    AssetEventQueue,
    Dag,
    DagRun,
    DagRunAssetEvent,
    DagRunState,
    DagTask,
    TaskInstance,
    TaskState,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session


ASSET_TRIGGERED = "asset_triggered"


MANUAL = "manual"


@dataclass(frozen=True, slots=True)
class QueuedDag:
    dag_id: str
    schedule: Any
    events: tuple[tuple[int, str], ...]  # (asset event id, asset name)


def dags_with_queued_events(session: Session) -> list[str]:
    """Active, unpaused DAGs that have asset events they have not consumed."""
    rows = session.execute(
        select(AssetEventQueue.dag_id)
        .join(Dag, Dag.dag_id == AssetEventQueue.dag_id)
        .where(Dag.is_active.is_(True), Dag.is_paused.is_(False))
        .distinct()
    )
    return sorted(str(r) for r in rows.scalars())


def lock_queued_dag(session: Session, dag_id: str) -> QueuedDag | None:
    """Lock the DAG row (skip if another scheduler holds it) and read its queued events."""
    stmt = select(Dag.dag_id, Dag.schedule).where(Dag.dag_id == dag_id)
    if is_postgres(session):
        stmt = stmt.with_for_update(skip_locked=True)
    row = session.execute(stmt).first()
    if row is None:
        return None
    events = session.execute(
        select(AssetEventQueue.asset_event_id, Asset.name)
        .join(AssetEvent, AssetEvent.id == AssetEventQueue.asset_event_id)
        .join(Asset, Asset.id == AssetEvent.asset_id)
        .where(AssetEventQueue.dag_id == dag_id)
        .order_by(AssetEventQueue.asset_event_id)
    ).all()
    return QueuedDag(str(row[0]), row[1], tuple((int(e), str(n)) for e, n in events))


def create_run(
    session: Session,
    dag_id: str,
    *,
    run_type: str,
    now: datetime,
    asset_event_ids: Sequence[int] = (),
    conf: Any = None,
) -> int:
    """A queued DAG run with its task instances; consumes the given queued asset events."""
    run_id = f"{run_type}__{now.strftime('%Y-%m-%dT%H:%M:%S.%f')}_{uuid.uuid4().hex[:6]}"
    run_pk = int(
        session.execute(
            insert(DagRun)
            .values(dag_id=dag_id, run_id=run_id, run_type=run_type, conf=conf, queued_at=now)
            .returning(DagRun.id)
        ).scalar_one()
    )
    if asset_event_ids:
        session.execute(
            insert(DagRunAssetEvent),
            [{"dag_run_id": run_pk, "asset_event_id": e} for e in asset_event_ids],
        )
        session.execute(
            delete(AssetEventQueue).where(
                AssetEventQueue.dag_id == dag_id,
                AssetEventQueue.asset_event_id.in_(list(asset_event_ids)),
            )
        )
    tasks = session.execute(
        select(DagTask.task_id, DagTask.retries).where(DagTask.dag_id == dag_id)
    ).all()
    if tasks:
        session.execute(
            insert(TaskInstance),
            [
                {
                    "dag_run_id": run_pk,
                    "dag_id": dag_id,
                    "task_id": t,
                    "max_tries": r,
                    "state": TaskState.NONE,
                }
                for t, r in tasks
            ],
        )
    return run_pk


def unfinished_runs(session: Session) -> list[int]:
    rows = session.execute(
        select(DagRun.id).where(DagRun.state.in_([DagRunState.QUEUED, DagRunState.RUNNING]))
    )
    return [int(r) for r in rows.scalars()]


@dataclass(frozen=True, slots=True)
class RunState:
    run_pk: int
    dag_id: str
    state: str
    downstream: dict[str, list[str]]
    task_states: dict[str, str]
    start_from_trigger: frozenset[str]
    ti_ids: dict[str, int]


def load_run_state(session: Session, run_pk: int) -> RunState | None:
    stmt = select(DagRun.dag_id, DagRun.state).where(DagRun.id == run_pk)
    if is_postgres(session):
        stmt = stmt.with_for_update(skip_locked=True)
    row = session.execute(stmt).first()
    if row is None:
        return None
    dag_id, state = str(row[0]), str(row[1])
    tasks = session.execute(
        select(DagTask.task_id, DagTask.downstream_task_ids, DagTask.start_from_trigger).where(
            DagTask.dag_id == dag_id
        )
    ).all()
    tis = session.execute(
        select(TaskInstance.task_id, TaskInstance.state, TaskInstance.id).where(
            TaskInstance.dag_run_id == run_pk
        )
    ).all()
    return RunState(
        run_pk=run_pk,
        dag_id=dag_id,
        state=state,
        downstream={str(t): list(d or []) for t, d, _ in tasks},
        task_states={str(t): str(s) for t, s, _ in tis},
        start_from_trigger=frozenset(str(t) for t, _, sft in tasks if sft),
        ti_ids={str(t): int(i) for t, _, i in tis},
    )


def set_task_states(
    session: Session, run_pk: int, changes: dict[str, str], *, now: datetime
) -> None:
    for task_id, state in changes.items():
        values: dict[str, Any] = {"state": state}
        if state in (TaskState.UPSTREAM_FAILED, TaskState.SKIPPED):
            values["end_date"] = now
        session.execute(
            update(TaskInstance)
            .where(
                TaskInstance.dag_run_id == run_pk,
                TaskInstance.task_id == task_id,
                TaskInstance.state == TaskState.NONE,
            )
            .values(**values)
        )


def set_run_state(session: Session, run_pk: int, state: str, *, now: datetime) -> None:
    values: dict[str, Any] = {"state": state}
    if state == DagRunState.RUNNING:
        values["start_date"] = now
    else:
        values["end_date"] = now
    session.execute(update(DagRun).where(DagRun.id == run_pk).values(**values))


def run_asset_events(session: Session, run_pks: Iterable[int]) -> dict[int, list[int]]:
    rows = session.execute(
        select(DagRunAssetEvent.dag_run_id, DagRunAssetEvent.asset_event_id).where(
            DagRunAssetEvent.dag_run_id.in_(list(run_pks))
        )
    )
    out: dict[int, list[int]] = {}
    for run_pk, event_id in rows:
        out.setdefault(int(run_pk), []).append(int(event_id))
    return out


def run_id_of(session: Session, run_pk: int) -> str:
    return str(session.execute(select(DagRun.run_id).where(DagRun.id == run_pk)).scalar_one())


def list_runs(session: Session, dag_id: str) -> list[dict[str, Any]]:
    runs = (
        session.execute(select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id))
        .scalars()
        .all()
    )
    events = run_asset_events(session, [r.id for r in runs])
    tis = session.execute(
        select(TaskInstance.dag_run_id, TaskInstance.task_id, TaskInstance.state).where(
            TaskInstance.dag_run_id.in_([r.id for r in runs])
        )
    ).all()
    by_run: dict[int, dict[str, str]] = {}
    for run_pk, task_id, state in tis:
        by_run.setdefault(int(run_pk), {})[str(task_id)] = str(state)
    return [
        {
            "run_id": r.run_id,
            "run_type": r.run_type,
            "state": r.state,
            "queued_at": r.queued_at.isoformat(),
            "end_date": r.end_date.isoformat() if r.end_date else None,
            "asset_events": events.get(r.id, []),
            "tasks": by_run.get(r.id, {}),
        }
        for r in runs
    ]


def find_task_instance(
    session: Session, dag_id: str, run_id: str, task_id: str
) -> TaskInstance | None:
    return session.execute(
        select(TaskInstance)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(DagRun.dag_id == dag_id, DagRun.run_id == run_id, TaskInstance.task_id == task_id)
    ).scalar()
