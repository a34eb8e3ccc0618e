"""SQL of the read model's assets (``engine.views.assets``): assets and their events
(filtered, paged), the watchers behind each asset, the DAGs an asset schedules and the tasks
that update it.

An asset's consumers are the active DAGs scheduled on it, directly or through an alias it
has resolved to; its producers are the tasks that name it (or an alias of it) as an outlet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from engine.db.models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetEvent,
    AssetWatcher,
    DagRun,
    DagRunAssetEvent,
    DagScheduleAsset,
    DagScheduleAssetAlias,
    DagTask,
    Trigger,
)
from engine.db.queries.browse import fetch_page

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    from sqlalchemy.orm import Session


def asset_page(
    session: Session, *, search: str | None = None, limit: int | None = None, offset: int = 0
) -> tuple[list[Asset], int]:
    """Assets by name; ``search``: a part of the name."""
    stmt = select(Asset).order_by(Asset.name)
    if search:
        stmt = stmt.where(Asset.name.contains(search, autoescape=True))
    rows, total = fetch_page(session, stmt, limit=limit, offset=offset)
    return [row[0] for row in rows], total


def asset_by_name(session: Session, name: str) -> Asset | None:
    return session.execute(select(Asset).where(Asset.name == name)).scalar()


def event_counts(session: Session, asset_ids: Iterable[int] | None = None) -> dict[int, int]:
    """asset id -> its number of events (all assets when ``asset_ids`` is None)."""
    stmt = select(AssetEvent.asset_id, func.count()).group_by(AssetEvent.asset_id)
    if asset_ids is not None:
        stmt = stmt.where(AssetEvent.asset_id.in_(list(asset_ids)))
    return {int(a): int(n) for a, n in session.execute(stmt)}


def last_events(session: Session, asset_ids: Iterable[int]) -> dict[int, AssetEvent]:
    """asset id -> its newest event."""
    newest = (
        select(func.max(AssetEvent.id))
        .where(AssetEvent.asset_id.in_(list(asset_ids)))
        .group_by(AssetEvent.asset_id)
    )
    rows = session.execute(select(AssetEvent).where(AssetEvent.id.in_(newest))).scalars()
    return {event.asset_id: event for event in rows}


def asset_watchers(
    session: Session, asset_ids: Iterable[int] | None = None
) -> dict[int, list[tuple[AssetWatcher, Any]]]:
    """asset id -> its watchers, by name, each with its trigger's columns (never the
    kwargs): id, classpath, triggerer_id, failure_count, last_failure_date, last_error."""
    stmt = (
        select(
            AssetWatcher,
            Trigger.id,
            Trigger.classpath,
            Trigger.triggerer_id,
            Trigger.failure_count,
            Trigger.last_failure_date,
            Trigger.last_error,
        )
        .join(Trigger, Trigger.id == AssetWatcher.trigger_id)
        .order_by(AssetWatcher.asset_id, AssetWatcher.name)
    )
    if asset_ids is not None:
        stmt = stmt.where(AssetWatcher.asset_id.in_(list(asset_ids)))
    out: dict[int, list[tuple[AssetWatcher, Any]]] = {}
    for row in session.execute(stmt):
        out.setdefault(row[0].asset_id, []).append((row[0], row[1:]))
    return out


def asset_consumers(
    session: Session, asset_ids: Iterable[int] | None = None
) -> dict[int, list[str]]:
    """asset id -> the DAGs scheduled on it, directly or through an alias, by id."""
    direct = select(DagScheduleAsset.asset_id, DagScheduleAsset.dag_id)
    via_alias = select(AssetAliasAsset.asset_id, DagScheduleAssetAlias.dag_id).join(
        DagScheduleAssetAlias, DagScheduleAssetAlias.alias_id == AssetAliasAsset.alias_id
    )
    if asset_ids is not None:
        wanted = list(asset_ids)
        direct = direct.where(DagScheduleAsset.asset_id.in_(wanted))
        via_alias = via_alias.where(AssetAliasAsset.asset_id.in_(wanted))
    out: dict[int, set[str]] = {}
    for stmt in (direct, via_alias):
        for asset_id, dag_id in session.execute(stmt):
            out.setdefault(int(asset_id), set()).add(str(dag_id))
    return {asset_id: sorted(dags) for asset_id, dags in out.items()}


def asset_aliases(session: Session) -> dict[str, list[str]]:
    """alias name -> the names of the assets it has resolved to."""
    rows = session.execute(
        select(AssetAlias.name, Asset.name)
        .join(AssetAliasAsset, AssetAliasAsset.alias_id == AssetAlias.id)
        .join(Asset, Asset.id == AssetAliasAsset.asset_id)
        .order_by(AssetAlias.name, Asset.name)
    )
    out: dict[str, list[str]] = {}
    for alias, asset in rows:
        out.setdefault(str(alias), []).append(str(asset))
    return out


def task_outlets(session: Session) -> list[tuple[str, str, list[str], list[str]]]:
    """(dag_id, task_id, outlet asset names, outlet alias names) of every task with an
    outlet, by DAG and task order."""
    rows = session.execute(
        select(DagTask.dag_id, DagTask.task_id, DagTask.outlets, DagTask.outlet_aliases).order_by(
            DagTask.dag_id, DagTask.position
        )
    )
    return [
        (str(d), str(t), [str(o) for o in outlets or []], [str(a) for a in aliases or []])
        for d, t, outlets, aliases in rows
        if outlets or aliases
    ]


def event_page(
    session: Session,
    *,
    asset_id: int | None = None,
    source: str | None = None,
    since: datetime | None = None,
    partition_key: str | None = None,
    newest_first: bool = True,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[tuple[AssetEvent, str]], int]:
    """Asset events with their asset's name; ``since``: at or after that time;
    ``partition_key``: of that partition only."""
    order = AssetEvent.id.desc() if newest_first else AssetEvent.id
    stmt = select(AssetEvent, Asset.name).join(Asset, Asset.id == AssetEvent.asset_id)
    stmt = stmt.order_by(order)
    if asset_id is not None:
        stmt = stmt.where(AssetEvent.asset_id == asset_id)
    if source is not None:
        stmt = stmt.where(AssetEvent.source == source)
    if since is not None:
        stmt = stmt.where(AssetEvent.timestamp >= since)
    if partition_key is not None:
        stmt = stmt.where(AssetEvent.partition_key == partition_key)
    rows, total = fetch_page(session, stmt, limit=limit, offset=offset)
    return [(event, str(name)) for event, name in rows], total


def event_runs(session: Session, event_ids: Iterable[int]) -> dict[int, list[tuple[str, str]]]:
    """asset event id -> the (dag_id, run_id) of the runs it triggered, oldest first."""
    wanted = list(event_ids)
    if not wanted:
        return {}
    rows = session.execute(
        select(DagRunAssetEvent.asset_event_id, DagRun.dag_id, DagRun.run_id)
        .join(DagRun, DagRun.id == DagRunAssetEvent.dag_run_id)
        .where(DagRunAssetEvent.asset_event_id.in_(wanted))
        .order_by(DagRunAssetEvent.asset_event_id, DagRun.id)
    )
    out: dict[int, list[tuple[str, str]]] = {}
    for event_id, dag_id, run_id in rows:
        out.setdefault(int(event_id), []).append((str(dag_id), str(run_id)))
    return out


def run_events(session: Session, run_pk: int) -> list[tuple[AssetEvent, str]]:
    """The asset events that triggered a run, with their asset's name, oldest first."""
    rows = session.execute(
        select(AssetEvent, Asset.name)
        .join(DagRunAssetEvent, DagRunAssetEvent.asset_event_id == AssetEvent.id)
        .join(Asset, Asset.id == AssetEvent.asset_id)
        .where(DagRunAssetEvent.dag_run_id == run_pk)
        .order_by(AssetEvent.id)
    )
    return [(event, str(name)) for event, name in rows]
