"""SQL of an asset's partitions as the read model shows them (``engine.views.partitions``):
the partition keys its events carry (each with its number of events and its latest one),
the runs a consuming DAG made per partition key, and the keys of the events still queued
for it. Reads only.

Keys come in descending order: ISO dates and times, the usual keys, then read newest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from engine.db.models import AssetEvent, AssetEventQueue, DagRun
from engine.db.queries.browse import fetch_page

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable
    from datetime import datetime

    from sqlalchemy.orm import Session


@dataclass(frozen=True, slots=True)
class KeyEvents:
    """The events of one partition key of an asset: how many, and the latest one."""

    partition_key: str
    count: int
    last_event_id: int
    last_event_at: datetime
    last_event_source: str | None


@dataclass(frozen=True, slots=True)
class KeyRun:
    """The latest run of a DAG for one partition key."""

    partition_key: str
    run_id: str
    state: str
    runs: int  # the DAG's runs of that key (a cleared or re-triggered key has several)


def _key_rows(
    session: Session,
    asset_id: int,
    keys: Collection[str] | None = None,
    *,
    between: tuple[str, str] | None = None,
) -> list[KeyEvents]:
    """``KeyEvents`` of the asset's keys (only ``keys``, or those ``between`` two keys
    inclusive, when given), by key, newest first."""
    counted = (
        select(
            AssetEvent.partition_key.label("key"),
            func.count().label("events"),
            func.max(AssetEvent.id).label("last_id"),
        )
        .where(AssetEvent.asset_id == asset_id, AssetEvent.partition_key.is_not(None))
        .group_by(AssetEvent.partition_key)
    )
    if keys is not None:
        counted = counted.where(AssetEvent.partition_key.in_(list(keys)))
    if between is not None:
        counted = counted.where(AssetEvent.partition_key.between(*between))
    sub = counted.subquery()
    rows = session.execute(
        select(sub.c.key, sub.c.events, sub.c.last_id, AssetEvent.timestamp, AssetEvent.source)
        .join(AssetEvent, AssetEvent.id == sub.c.last_id)
        .order_by(sub.c.key.desc())
    )
    return [KeyEvents(str(k), int(n), int(i), at, src) for k, n, i, at, src in rows]


def key_events(
    session: Session, asset_id: int, *, limit: int | None = None, offset: int = 0
) -> tuple[list[KeyEvents], int]:
    """A page of the asset's partition keys (those its events carry), newest key first,
    with the number of keys in all."""
    keys = (
        select(AssetEvent.partition_key)
        .where(AssetEvent.asset_id == asset_id, AssetEvent.partition_key.is_not(None))
        .group_by(AssetEvent.partition_key)
        .order_by(AssetEvent.partition_key.desc())
    )
    rows, total = fetch_page(session, keys, limit=limit, offset=offset)
    wanted = [str(row[0]) for row in rows]
    return (_key_rows(session, asset_id, wanted) if wanted else []), total


def events_of_keys(session: Session, asset_id: int, keys: Iterable[str]) -> dict[str, KeyEvents]:
    """partition key -> its ``KeyEvents``, for those of ``keys`` that have an event."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    return {row.partition_key: row for row in _key_rows(session, asset_id, wanted)}


def events_between(session: Session, asset_id: int, low: str, high: str) -> dict[str, KeyEvents]:
    """partition key -> its ``KeyEvents``, for the asset's keys from ``low`` to ``high``
    (text order, both included): the keys a range of ticks expects, in one statement."""
    return {row.partition_key: row for row in _key_rows(session, asset_id, between=(low, high))}


def unkeyed_event_count(session: Session, asset_id: int) -> int:
    """The asset's events without a partition key."""
    query = select(func.count()).where(
        AssetEvent.asset_id == asset_id, AssetEvent.partition_key.is_(None)
    )
    return int(session.execute(query).scalar_one())


def runs_of_keys(session: Session, dag_id: str, keys: Iterable[str]) -> dict[str, KeyRun]:
    """partition key -> the DAG's latest run of that key (by creation), for those of
    ``keys`` that have one."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    rank = (
        func.row_number()
        .over(partition_by=DagRun.partition_key, order_by=DagRun.id.desc())
        .label("rank")
    )
    count = func.count().over(partition_by=DagRun.partition_key).label("runs")
    ranked = (
        select(DagRun.partition_key, DagRun.run_id, DagRun.state, rank, count)
        .where(DagRun.dag_id == dag_id, DagRun.partition_key.in_(wanted))
        .subquery()
    )
    rows = session.execute(
        select(ranked.c.partition_key, ranked.c.run_id, ranked.c.state, ranked.c.runs).where(
            ranked.c.rank == 1
        )
    )
    return {str(k): KeyRun(str(k), str(r), str(s), int(n)) for k, r, s, n in rows}


def queued_keys(session: Session, dag_id: str, asset_id: int, keys: Iterable[str]) -> set[str]:
    """Those of ``keys`` whose events of the asset are queued for the DAG (not consumed by a
    run yet: a partition that waits)."""
    wanted = sorted(set(keys))
    if not wanted:
        return set()
    rows = session.execute(
        select(AssetEvent.partition_key)
        .join(AssetEventQueue, AssetEventQueue.asset_event_id == AssetEvent.id)
        .where(
            AssetEventQueue.dag_id == dag_id,
            AssetEvent.asset_id == asset_id,
            AssetEvent.partition_key.in_(wanted),
        )
        .distinct()
    )
    return {str(key) for key in rows.scalars()}
