"""SQL of a DAG's queue of asset events (``asset_event_queue``): the events a DAG has not
consumed yet, as the scheduler reads them (aggregated per asset, or one by one for a
partitioned DAG), and their consumption by the run they trigger or their removal. The queue
rows are written with the events (``assets.queue_asset_events``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import delete, func, select, text

from engine.db.database import is_postgres
from engine.db.models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetEvent,
    AssetEventQueue,
    Dag,
    DagRun,
    DagRunAssetEvent,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from sqlalchemy.orm import Session


@dataclass(frozen=True, slots=True)
class QueuedDag:
    """A DAG's queue as the scheduler judges it: which assets have events it has not
    consumed (one row per asset, not per event: a busy watcher queues thousands between two
    runs) and the newest of those events, which a run created now consumes through."""

    dag_id: str
    schedule: Any
    updated: frozenset[str]  # the assets with queued events
    last_event_id: int  # the newest queued event's id (0: none queued)
    aliases: frozenset[str] = frozenset()  # aliases the queued events' assets belong to
    timetable: Any = None  # the DAG's stored timetable (a partitioned one plans per key)


@dataclass(frozen=True, slots=True)
class QueuedEvents:
    """A DAG's queued events one by one (a partitioned DAG plans a run per key from them)."""

    events: tuple[tuple[int, str], ...]  # (asset event id, asset name), in id order
    #: asset event id -> its partition key, for the events that have one
    partition_keys: dict[int, str] = field(default_factory=dict)


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
    """Lock the DAG row (skip if another scheduler holds it) and read its queue: the assets
    with queued events and the newest event's id, aggregated by the database."""
    stmt = select(Dag.dag_id, Dag.schedule, Dag.timetable).where(Dag.dag_id == dag_id)
    if is_postgres(session):
        stmt = stmt.with_for_update(skip_locked=True)
    row = session.execute(stmt).first()
    if row is None:
        return None
    newest = session.execute(
        select(Asset.name, func.max(AssetEventQueue.asset_event_id))
        .select_from(AssetEventQueue)
        .join(AssetEvent, AssetEvent.id == AssetEventQueue.asset_event_id)
        .join(Asset, Asset.id == AssetEvent.asset_id)
        .where(AssetEventQueue.dag_id == dag_id)
        .group_by(Asset.name)
    ).all()
    aliases = session.execute(
        select(AssetAlias.name)
        .join(AssetAliasAsset, AssetAliasAsset.alias_id == AssetAlias.id)
        .join(AssetEvent, AssetEvent.asset_id == AssetAliasAsset.asset_id)
        .join(AssetEventQueue, AssetEventQueue.asset_event_id == AssetEvent.id)
        .where(AssetEventQueue.dag_id == dag_id)
        .distinct()
    ).scalars()
    return QueuedDag(
        str(row[0]),
        row[1],
        frozenset(str(name) for name, _ in newest),
        max((int(last) for _, last in newest), default=0),
        frozenset(str(a) for a in aliases),
        timetable=row[2],
    )


def queued_events(session: Session, dag_id: str) -> QueuedEvents:
    """The DAG's queued events one by one, in id order, with their partition keys."""
    events = session.execute(
        select(AssetEventQueue.asset_event_id, Asset.name, AssetEvent.partition_key)
        .join(AssetEvent, AssetEvent.id == AssetEventQueue.asset_event_id)
        .join(Asset, Asset.id == AssetEvent.asset_id)
        .where(AssetEventQueue.dag_id == dag_id)
        .order_by(AssetEventQueue.asset_event_id)
    ).all()
    return QueuedEvents(
        tuple((int(e), str(n)) for e, n, _ in events),
        partition_keys={int(e): str(k) for e, _, k in events if k is not None},
    )


def dequeue_asset_events(session: Session, dag_id: str, event_ids: Sequence[int]) -> None:
    """Drop queued events of a DAG (consumed by a run, or a partitioned DAG's refused
    ones)."""
    if event_ids:
        session.execute(
            delete(AssetEventQueue).where(
                AssetEventQueue.dag_id == dag_id,
                AssetEventQueue.asset_event_id.in_(list(event_ids)),
            )
        )


def consumed_by_key(
    session: Session, dag_id: str, event_ids: Collection[int]
) -> set[tuple[int, str]]:
    """(event id, partition key) of the given events already consumed by a run of the DAG
    with that key: a partitioned DAG consumes an event once per key."""
    if not event_ids:
        return set()
    rows = session.execute(
        select(DagRunAssetEvent.asset_event_id, DagRun.partition_key)
        .join(DagRun, DagRun.id == DagRunAssetEvent.dag_run_id)
        .where(
            DagRun.dag_id == dag_id,
            DagRun.partition_key.is_not(None),
            DagRunAssetEvent.asset_event_id.in_(list(event_ids)),
        )
    ).all()
    return {(int(event_id), str(key)) for event_id, key in rows}


# The run's links and the DAG's queue rows, set-wise in the database, whatever their number.
# Nothing lands in the range between the scheduler's read and these: on SQLite its
# transaction holds the write lock from the read on; on PostgreSQL another transaction's
# queue row for the DAG waits for the scheduler's lock on the DAG row (the foreign key's
# share lock against FOR UPDATE), and one that took a lower id but lands after the run's
# transaction stays queued for the next run. PostgreSQL links exactly the rows it deletes.
_POSTGRES_CONSUME: Final = text(
    "WITH dequeued AS (DELETE FROM asset_event_queue WHERE dag_id = :dag_id "
    "AND asset_event_id <= :through RETURNING asset_event_id) "
    "INSERT INTO dag_run_asset_event (dag_run_id, asset_event_id) "
    "SELECT :run, asset_event_id FROM dequeued"
)
_SQLITE_LINK: Final = text(
    "INSERT INTO dag_run_asset_event (dag_run_id, asset_event_id) "
    "SELECT :run, asset_event_id FROM asset_event_queue "
    "WHERE dag_id = :dag_id AND asset_event_id <= :through"
)
_SQLITE_DEQUEUE: Final = text(
    "DELETE FROM asset_event_queue WHERE dag_id = :dag_id AND asset_event_id <= :through"
)


def consume_queued_events(session: Session, dag_id: str, run_pk: int, through: int) -> None:
    """Link the queued events of ``dag_id`` up to id ``through`` (the newest the scheduler
    read: ``lock_queued_dag``) to its new run ``run_pk`` and take them out of the DAG's
    queue, in the database: an asset-triggered run of a busy watcher consumes thousands,
    which read into the scheduler one by one cost it more than the rest of the run."""
    params = {"dag_id": dag_id, "run": run_pk, "through": through}
    if is_postgres(session):
        session.execute(_POSTGRES_CONSUME, params)
        return
    session.execute(_SQLITE_LINK, params)
    session.execute(_SQLITE_DEQUEUE, params)
