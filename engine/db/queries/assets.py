"""SQL of asset events: which asset a watcher updates, inserting events (deduplicated by
key), queueing them for the DAGs scheduled on the asset, and listing them.

The persister's last stop on an event's way: ``watcher_assets``, ``insert_asset_events``
and ``enqueue_asset_events`` run in its batch transaction.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, insert, select

from engine.db.models import (
    Asset,
    AssetEvent,
    AssetEventQueue,
    AssetWatcher,
    Dag,
    DagRun,
    DagRunAssetEvent,
    DagScheduleAsset,
    utcnow,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from sqlalchemy.orm import Session


logger = logging.getLogger(__name__)


def watcher_assets(session: Session, trigger_ids: Iterable[int]) -> dict[int, tuple[int, str]]:
    """Map trigger id -> (asset id, watcher name) for watcher triggers."""
    rows = session.execute(
        select(AssetWatcher.trigger_id, AssetWatcher.asset_id, AssetWatcher.name).where(
            AssetWatcher.trigger_id.in_(list(trigger_ids))
        )
    )
    return {int(t): (int(a), str(n)) for t, a, n in rows}


def insert_asset_events(session: Session, rows: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """Insert asset events, skipping any whose (asset, dedup_key) exists.

    A row whose dedup_key is None is always inserted (a unique constraint never matches
    NULLs, on PostgreSQL and SQLite alike). Returns (event id, asset id) of the rows
    actually inserted.
    """
    if not rows:
        return []
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert  # type: ignore[assignment]
    stmt = (
        dialect_insert(AssetEvent)
        .on_conflict_do_nothing(index_elements=["asset_id", "dedup_key"])
        .returning(AssetEvent.id, AssetEvent.asset_id)
    )
    return [(int(i), int(a)) for i, a in session.execute(stmt, list(rows)).all()]


def enqueue_asset_events(
    session: Session, events: Sequence[tuple[int, int]], *, keep_while_paused: bool = True
) -> int:
    """Queue each new (event id, asset id) for every active DAG scheduled on the asset.

    A paused DAG gets them too (it runs on them when unpaused) unless ``keep_while_paused``
    is false (``[scheduler] keep_events_while_paused``): then, as in Airflow, an event that
    arrives while a DAG is paused is not queued for it.
    """
    if not events:
        return 0
    asset_ids = {asset_id for _, asset_id in events}
    query = (
        select(DagScheduleAsset.asset_id, DagScheduleAsset.dag_id)
        .join(Dag, Dag.dag_id == DagScheduleAsset.dag_id)
        .where(DagScheduleAsset.asset_id.in_(asset_ids), Dag.is_active.is_(True))
    )
    if not keep_while_paused:
        query = query.where(Dag.is_paused.is_(False))
    rows = session.execute(query).all()
    by_asset: dict[int, list[str]] = {}
    for asset_id, dag_id in rows:
        by_asset.setdefault(int(asset_id), []).append(str(dag_id))
    now = utcnow()
    queue = [
        {"dag_id": dag_id, "asset_event_id": event_id, "created_at": now}
        for event_id, asset_id in events
        for dag_id in by_asset.get(asset_id, ())
    ]
    if queue:
        session.execute(insert(AssetEventQueue), queue)
    return len(queue)


def list_asset_events(session: Session, asset_name: str) -> list[dict[str, Any]] | None:
    asset_id = session.execute(select(Asset.id).where(Asset.name == asset_name)).scalar()
    if asset_id is None:
        return None
    rows = session.execute(
        select(AssetEvent, DagRun.dag_id, DagRun.run_id)
        .outerjoin(DagRunAssetEvent, DagRunAssetEvent.asset_event_id == AssetEvent.id)
        .outerjoin(DagRun, DagRun.id == DagRunAssetEvent.dag_run_id)
        .where(AssetEvent.asset_id == asset_id)
        .order_by(AssetEvent.id)
    ).all()
    out: dict[int, dict[str, Any]] = {}
    for event, dag_id, run_id in rows:
        entry = out.setdefault(
            event.id,
            {
                "id": event.id,
                "timestamp": event.timestamp.isoformat(),
                "source_watcher": event.source_watcher,
                "payload": event.payload,
                "runs": [],
            },
        )
        if run_id is not None:
            entry["runs"].append(f"{dag_id}/{run_id}")
    return list(out.values())


def list_assets(session: Session) -> list[dict[str, Any]]:

    counts = dict(
        session.execute(
            select(AssetEvent.asset_id, func.count()).group_by(AssetEvent.asset_id)
        ).all()
    )
    return [
        {"name": a.name, "uri": a.uri, "events": int(counts.get(a.id, 0))}
        for a in session.execute(select(Asset).order_by(Asset.name)).scalars()
    ]
