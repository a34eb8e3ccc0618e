"""SQL of asset events: which asset a watcher updates, inserting events (deduplicated by
key), queueing them for the DAGs scheduled on the asset (or on an alias the asset belongs
to); ``lineage`` lists them.

Events come from four sources, and all take the same way to the DAGs they schedule
(``insert_asset_events`` then ``enqueue_asset_events``, in the writer's transaction):

- a watcher's trigger (the persister's batch transaction);
- a task's outlets (``record_task_outlet_events``, in the transaction that records the
  task's success: a task that succeeds once emits once);
- ``sluice assets emit`` and the REST API (``emit_asset_event``).

Each may carry a ``partition_key``, the slice of the asset it updated (Airflow 3.3).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import insert, select, union, update

from engine.db.database import upsert_insert
from engine.db.listen import notify_scheduler
from engine.db.models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetEvent,
    AssetEventQueue,
    AssetWatcher,
    Dag,
    DagScheduleAsset,
    DagScheduleAssetAlias,
    utcnow,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime

    from sqlalchemy import CompoundSelect, Connection
    from sqlalchemy.orm import Session


logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EventRow:
    """One asset event as read for a task's context (``payload`` as stored: tagged JSON).

    The fields after ``source_watcher`` say where an event came from (a watcher, a task's
    outlet, ``sluice assets emit``); events stored before outlets existed leave them None.
    """

    id: int
    asset_name: str
    payload: Any
    timestamp: datetime
    source_watcher: str | None
    uri: str | None = None
    extra: dict[str, Any] | None = None
    source: str | None = None
    source_dag_id: str | None = None
    source_run_id: str | None = None
    source_task_id: str | None = None
    source_try_number: int | None = None
    source_alias: str | None = None
    created_by: str | None = None
    partition_key: str | None = None


SOURCE_WATCHER: Final = "watcher"
SOURCE_TASK: Final = "task"
SOURCE_CLI: Final = "cli"
SOURCE_API: Final = "api"
#: How many of an inlet asset's latest events a task sees in ``inlet_events``.
INLET_EVENTS_LIMIT: Final = 100


class UnknownAssetError(LookupError):
    """An event was emitted for an asset no DAG file declares."""


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
    stmt = (
        upsert_insert(session, AssetEvent)
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
    consumers = asset_consumers(
        session, {asset_id for _, asset_id in events}, keep_while_paused=keep_while_paused
    )
    return queue_asset_events(session, events, consumers)


def consumer_pairs(*, keep_while_paused: bool = True) -> CompoundSelect[int, str]:
    """(asset_id, dag_id) of every active DAG scheduled on an asset, directly or through an
    alias the asset belongs to, that an event of the asset is queued for now (a paused DAG
    only when ``keep_while_paused``); each pair once. The one statement of that rule:
    ``asset_consumers`` filters it by asset, the persister's PostgreSQL insert joins it."""
    direct = select(DagScheduleAsset.asset_id, DagScheduleAsset.dag_id).join(
        Dag, Dag.dag_id == DagScheduleAsset.dag_id
    )
    through_alias = (
        select(AssetAliasAsset.asset_id, DagScheduleAssetAlias.dag_id)
        .join(DagScheduleAssetAlias, DagScheduleAssetAlias.alias_id == AssetAliasAsset.alias_id)
        .join(Dag, Dag.dag_id == DagScheduleAssetAlias.dag_id)
    )
    live = [Dag.is_active.is_(True)]
    if not keep_while_paused:
        live.append(Dag.is_paused.is_(False))
    return union(direct.where(*live), through_alias.where(*live))


def asset_consumers(
    session: Session | Connection, asset_ids: Iterable[int], *, keep_while_paused: bool = True
) -> dict[int, list[str]]:
    """asset id -> the active DAGs scheduled on it (directly or through an alias) that an
    event of the asset is queued for now; assets no DAG consumes are left out."""
    pairs = consumer_pairs(keep_while_paused=keep_while_paused).subquery()
    query = select(pairs.c.asset_id, pairs.c.dag_id).where(pairs.c.asset_id.in_(set(asset_ids)))
    by_asset: dict[int, list[str]] = {}
    for asset_id, dag_id in session.execute(query).all():
        by_asset.setdefault(int(asset_id), []).append(str(dag_id))
    return by_asset


def queue_asset_events(
    session: Session | Connection,
    events: Iterable[tuple[int, int]],
    consumers: Mapping[int, Sequence[str]],
) -> int:
    """Queue each (event id, asset id) for the DAGs ``consumers`` (``asset_consumers``) lists
    for its asset; returns the number of queue rows written."""
    now = utcnow()
    queue = [
        {"dag_id": dag_id, "asset_event_id": event_id, "created_at": now}
        for event_id, asset_id in events
        for dag_id in consumers.get(asset_id, ())
    ]
    if queue:
        session.execute(insert(AssetEventQueue), queue)
        notify_scheduler(session)  # a scheduler elsewhere creates the runs now
    return len(queue)


def _asset_ids(session: Session, names: Iterable[str]) -> dict[str, int]:
    wanted = sorted(set(names))
    if not wanted:
        return {}
    rows = session.execute(select(Asset.name, Asset.id).where(Asset.name.in_(wanted)))
    return {str(n): int(i) for n, i in rows}


def _ensure_asset(session: Session, name: str, uri: str, *, now: datetime) -> int:
    """The id of asset ``name``, created (active, no watchers) when no DAG file declared it
    (an asset first met through an alias at run time, as in Airflow)."""
    stmt = (
        upsert_insert(session, Asset)
        .values(name=name, uri=uri, extra={}, is_active=True, created_at=now, updated_at=now)
        .on_conflict_do_nothing(index_elements=["name"])
    )
    session.execute(stmt)
    return int(session.execute(select(Asset.id).where(Asset.name == name)).scalar_one())


def ensure_alias(session: Session, name: str) -> int:
    """The id of alias ``name``, created if missing (without conflicting with a concurrent
    creator)."""
    stmt = upsert_insert(session, AssetAlias).values(name=name)
    session.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
    return int(session.execute(select(AssetAlias.id).where(AssetAlias.name == name)).scalar_one())


def _link_alias(session: Session, alias_id: int, asset_id: int) -> None:
    stmt = upsert_insert(session, AssetAliasAsset).values(alias_id=alias_id, asset_id=asset_id)
    session.execute(stmt.on_conflict_do_nothing(index_elements=["alias_id", "asset_id"]))


@dataclass(frozen=True, slots=True)
class TaskTry:
    """The task try whose success produced outlet events (their recorded source)."""

    ti_id: int
    dag_id: str
    run_id: str
    task_id: str
    try_number: int


def record_task_outlet_events(
    session: Session,
    source: TaskTry,
    events: Sequence[Mapping[str, Any]],
    *,
    keep_while_paused: bool = True,
    now: datetime | None = None,
) -> int:
    """Store the events of a task that just succeeded and queue them for their DAGs.

    ``events`` are the child's reports (``{"asset", "uri", "extra", "alias",
    "partition_key"}``, see ``engine.execution.outlets``; the key checked there). An alias
    event creates its asset if no DAG file declares it and links it to the alias, so DAGs
    scheduled on the alias run. Call it in the transaction
    that records the success, and only when that write changed the task's state: that guard
    is what makes a try that succeeds once emit once (no delivery key: task instance ids can
    be reused after ``db clean`` on SQLite, and a key would then drop a new event). Returns the
    number of events stored.
    """
    if not events:
        return 0
    now = now or utcnow()
    declared = _asset_ids(session, (str(e["asset"]) for e in events))
    rows: list[dict[str, Any]] = []
    for event in events:
        name = str(event["asset"])
        alias = event.get("alias")
        asset_id = declared.get(name)
        if asset_id is None:
            if alias is None:
                logger.warning(
                    "Task %s.%s declares outlet asset %r, which is not in the database; "
                    "its event is not stored",
                    source.dag_id,
                    source.task_id,
                    name,
                    extra={"action": "outlet_asset_unknown", "asset": name},
                )
                continue
            asset_id = declared[name] = _ensure_asset(
                session, name, str(event.get("uri") or name), now=now
            )
        if alias is not None:
            _link_alias(session, ensure_alias(session, str(alias)), asset_id)
        rows.append(
            {
                "asset_id": asset_id,
                "payload": None,
                "extra": dict(event.get("extra") or {}),
                "dedup_key": None,
                "source": SOURCE_TASK,
                "source_dag_id": source.dag_id,
                "source_run_id": source.run_id,
                "source_task_id": source.task_id,
                "source_try_number": source.try_number,
                "source_alias": None if alias is None else str(alias),
                "partition_key": event.get("partition_key"),
                "timestamp": now,
            }
        )
    new_events = insert_asset_events(session, rows)
    enqueue_asset_events(session, new_events, keep_while_paused=keep_while_paused)
    return len(new_events)


def emit_asset_event(
    session: Session,
    asset_name: str,
    *,
    extra: Mapping[str, Any] | None,
    source: str,
    created_by: str,
    partition_key: str | None = None,
    keep_while_paused: bool = True,
    now: datetime | None = None,
) -> int:
    """Record an event of a known asset from outside (CLI, REST API); returns its id.

    ``partition_key`` is the slice it updated (None: unpartitioned); the caller checked it
    (``triggers.base.check_partition_key``). Raises ``UnknownAssetError`` for an asset no
    DAG file declares (a typo would otherwise create an asset nothing reads).
    """
    asset_id = _asset_ids(session, [asset_name]).get(asset_name)
    if asset_id is None:
        raise UnknownAssetError(
            f"unknown asset {asset_name!r}; `sluice assets list` shows the declared assets"
        )
    row = {
        "asset_id": asset_id,
        "payload": None,
        "extra": dict(extra or {}),
        "dedup_key": None,
        "source": source,
        "created_by": created_by,
        "partition_key": partition_key,
        "timestamp": now or utcnow(),
    }
    [(event_id, _)] = insert_asset_events(session, [row])
    enqueue_asset_events(session, [(event_id, asset_id)], keep_while_paused=keep_while_paused)
    session.execute(update(Asset).where(Asset.id == asset_id).values(updated_at=row["timestamp"]))
    return event_id


def recent_asset_events(
    session: Session, names: Iterable[str], *, limit: int = INLET_EVENTS_LIMIT
) -> dict[str, tuple[str, list[AssetEvent]]]:
    """The URI and the latest ``limit`` events of each named asset, oldest first
    (``inlet_events``)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    assets = session.execute(select(Asset.name, Asset.id, Asset.uri).where(Asset.name.in_(wanted)))
    out: dict[str, tuple[str, list[AssetEvent]]] = {}
    for name, asset_id, uri in sorted(assets):
        rows = session.execute(
            select(AssetEvent)
            .where(AssetEvent.asset_id == asset_id)
            .order_by(AssetEvent.id.desc())
            .limit(limit)
        ).scalars()
        out[str(name)] = (str(uri), list(reversed(list(rows))))
    return out


def recent_alias_events(
    session: Session, aliases: Iterable[str], *, limit: int = INLET_EVENTS_LIMIT
) -> dict[str, list[tuple[AssetEvent, str, str]]]:
    """The latest ``limit`` events attached through each alias, oldest first, with the name
    and URI of the asset each one updated (``inlet_events[alias]``)."""
    out: dict[str, list[tuple[AssetEvent, str, str]]] = {}
    for alias in sorted(set(aliases)):
        rows = session.execute(
            select(AssetEvent, Asset.name, Asset.uri)
            .join(Asset, Asset.id == AssetEvent.asset_id)
            .where(AssetEvent.source_alias == alias)
            .order_by(AssetEvent.id.desc())
            .limit(limit)
        ).all()
        out[alias] = [(event, str(name), str(uri)) for event, name, uri in reversed(rows)]
    return out
