"""SQL of the persister's hot path: storing a batch of watcher events as asset events.

A batch holds up to a few thousand rows and the persister writes one batch after another for
as long as a broker has messages, so this path avoids per-row work in Python:

- the payload arrives as JSON text, encoded once by the caller (it measured it against the
  payload size limit with the same text), and goes to the driver as it is, not through the
  JSON column type's encoder;
- PostgreSQL: the whole batch is one statement of a fixed shape, so one round trip (with
  ``Database.run_statement``, not even a BEGIN or a COMMIT: under load every round trip
  costs the writer thread milliseconds of waiting for the GIL). ``INSERT ... SELECT`` from
  the elements of one JSON array per column: its text never changes (psycopg prepares it
  once), the rows go as six text parameters instead of 8 x N placeholders to re-parse in
  every batch, each made by one call of the C JSON encoder (the payloads' array is their
  texts joined with commas; psycopg's array dumper escaped every element in Python). The
  rows it inserted feed, in the same statement, the insert that queues each new event for
  the DAGs ``assets.consumer_pairs`` names for its asset;
- SQLite: ``executemany`` of one prepared single-row ``INSERT`` (a C loop in ``sqlite3``),
  then one ``INSERT ... SELECT`` that queues the new rows for the DAGs consuming their assets
  without reading them back into Python: the writer holds SQLite's write lock for the whole
  transaction (``BEGIN IMMEDIATE``) and ``asset_event.id`` is the rowid, so the rows the
  insert added are exactly those above the largest id read just before it.

Both keep ``ON CONFLICT (asset_id, dedup_key) DO NOTHING``: a redelivered message (same key)
is absorbed, an event without a key (NULL) is always stored.

The owner guard: given the ``owner`` job id (the triggerer whose watchers fired the events),
the rows are stored only while that job row is running, in the same statement (PostgreSQL:
an ``EXISTS`` on the job row inside the insert, read in the statement's one snapshot) or
transaction (SQLite: read under the write lock just before the insert); otherwise nothing is
stored and ``LeaseLost`` is raised. A triggerer that was taken over (its job row ended by
the claim that took its rows) never stores another event.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final, TypeAlias

from sqlalchemy import Boolean, Integer, bindparam, cast, column, func, insert, or_, select, text

from engine.db.models import AssetEvent, AssetEventQueue, Job, utcnow
from engine.db.queries.assets import (
    SOURCE_WATCHER,
    consumer_pairs,
)
from engine.db.queries.jobs import check_owner
from engine.exceptions import LeaseLost
from engine.states import JobState

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from sqlalchemy import Connection, Insert, Select

#: One watcher event: (asset id, payload as JSON text, dedup key or None, trigger id, watcher,
#: partition key or None).
WatcherEventRow: TypeAlias = "tuple[int, str, str | None, int, str, str | None]"

_COLUMNS: Final = (
    "asset_id, payload, dedup_key, source_trigger_id, source_watcher, partition_key, "
    "source, timestamp"
)

_TIMESTAMP: Final = AssetEvent.__table__.c.timestamp.type

# The rows of the batch, as six JSON arrays; RETURNING gives those actually inserted.
_POSTGRES_INSERT: Final = (
    text(
        f"INSERT INTO asset_event ({_COLUMNS}) "
        "SELECT CAST(u.asset_id AS integer), u.payload, u.dedup_key, "
        "CAST(u.trigger_id AS integer), u.watcher, u.partition_key, :source, :ts "
        "FROM ROWS FROM ("
        "json_array_elements_text(CAST(:asset_ids AS json)), "
        "json_array_elements(CAST(:payloads AS json)), "
        "json_array_elements_text(CAST(:dedup_keys AS json)), "
        "json_array_elements_text(CAST(:trigger_ids AS json)), "
        "json_array_elements_text(CAST(:watchers AS json)), "
        "json_array_elements_text(CAST(:partition_keys AS json))"
        ") WITH ORDINALITY AS "
        "u(asset_id, payload, dedup_key, trigger_id, watcher, partition_key, n) "
        "WHERE CAST(:owner AS integer) IS NULL OR EXISTS (SELECT 1 FROM job "
        f"WHERE job.id = CAST(:owner AS integer) AND job.state = '{JobState.RUNNING.value}') "
        "ORDER BY u.n "
        "ON CONFLICT (asset_id, dedup_key) DO NOTHING "
        "RETURNING id, asset_id"
    )
    .bindparams(bindparam("ts", type_=_TIMESTAMP), bindparam("owner", type_=Integer))
    .columns(column("id", Integer), column("asset_id", Integer))
)

# The same guard, read again in the same statement (one snapshot): whether the rows went in.
_OWNER = cast(bindparam("owner", type_=Integer), Integer)
_OWNER_RUNNING: Final = or_(
    _OWNER.is_(None),
    select(Job.id).where(Job.id == _OWNER, Job.state == JobState.RUNNING).exists(),
)


def _postgres_statement(*, keep_while_paused: bool) -> Select[int, bool]:
    """The insert, the queue rows of what it inserted, the number of rows inserted, and
    whether the owner guard let them in.

    A data-modifying ``WITH`` runs once and to completion whether or not the main query
    reads it; the foreign key from each queue row to its new event is checked at the end of
    the statement, when the event is there."""
    inserted = _POSTGRES_INSERT.cte("inserted")
    pairs = consumer_pairs(keep_while_paused=keep_while_paused).subquery("consumer")
    queued = (
        insert(AssetEventQueue)
        .from_select(
            ["dag_id", "asset_event_id", "created_at"],
            select(pairs.c.dag_id, inserted.c.id, bindparam("ts", type_=_TIMESTAMP)).join_from(
                inserted, pairs, pairs.c.asset_id == inserted.c.asset_id
            ),
        )
        .cte("queued")
    )
    return select(func.count(), cast(_OWNER_RUNNING, Boolean)).select_from(inserted).add_cte(queued)


# Built once each: their SQL text is then the same in every batch (compiled once, cached).
_POSTGRES_STORE: Final[dict[bool, Select[int, bool]]] = {
    keep: _postgres_statement(keep_while_paused=keep) for keep in (True, False)
}

# ``source`` is a constant of this module, inlined so every row's parameters are its own tuple.
_SQLITE_INSERT: Final = (
    f"INSERT INTO asset_event ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, '{SOURCE_WATCHER}', ?) "
    "ON CONFLICT (asset_id, dedup_key) DO NOTHING"
)
_SQLITE_LAST_ID: Final = select(func.coalesce(func.max(AssetEvent.id), 0))


def _sqlite_queue(*, keep_while_paused: bool) -> Insert:
    """Queue the events above id ``before`` (the batch just inserted) for the DAGs
    ``assets.consumer_pairs`` names for their asset: one ``INSERT ... SELECT`` run by SQLite
    itself, no rows read back into Python (a batch of an asset no DAG consumes queues none)."""
    pairs = consumer_pairs(keep_while_paused=keep_while_paused).subquery("consumer")
    return insert(AssetEventQueue).from_select(
        ["dag_id", "asset_event_id", "created_at"],
        select(pairs.c.dag_id, AssetEvent.id, bindparam("ts", type_=_TIMESTAMP))
        .join_from(AssetEvent, pairs, pairs.c.asset_id == AssetEvent.asset_id)
        .where(AssetEvent.id > bindparam("before", type_=Integer)),
    )


_SQLITE_QUEUE: Final[dict[bool, Insert]] = {
    keep: _sqlite_queue(keep_while_paused=keep) for keep in (True, False)
}


def store_watcher_events(
    connection: Connection,
    rows: Sequence[WatcherEventRow],
    *,
    keep_while_paused: bool = True,
    now: datetime | None = None,
    owner: int | None = None,
) -> int:
    """Insert ``rows`` (skipping any whose (asset, dedup key) is stored) and queue the new
    events for the DAGs scheduled on their assets; returns how many were inserted.

    ``now`` is every row's timestamp (one per batch). On PostgreSQL this is one statement,
    atomic by itself: ``connection`` may be in autocommit mode. ``owner``: the job id whose
    row must be running for anything to be stored, else ``LeaseLost`` (the owner guard).
    See the module docstring.
    """
    if not rows:
        return 0
    now = now or utcnow()
    if connection.dialect.name == "postgresql":
        return _store_postgres(
            connection, rows, now, keep_while_paused=keep_while_paused, owner=owner
        )
    if owner is not None:
        check_owner(connection, owner)
    dialect = connection.dialect
    stamp = _TIMESTAMP.dialect_impl(dialect).bind_processor(dialect)
    ts = stamp(now) if stamp is not None else now
    # The rows this statement adds are those above the largest id now (see the docstring).
    before = int(connection.execute(_SQLITE_LAST_ID).scalar_one())
    inserted = int(
        connection.exec_driver_sql(_SQLITE_INSERT, [(*row, ts) for row in rows]).rowcount
    )
    if inserted:
        connection.execute(_SQLITE_QUEUE[keep_while_paused], {"before": before, "ts": now})
    return inserted


def _store_postgres(
    connection: Connection,
    rows: Sequence[WatcherEventRow],
    now: datetime,
    *,
    keep_while_paused: bool,
    owner: int | None,
) -> int:
    asset_ids, payloads, dedup_keys, trigger_ids, watchers, partition_keys = zip(*rows, strict=True)
    result = connection.execute(
        _POSTGRES_STORE[keep_while_paused],
        {
            "asset_ids": _json_array(asset_ids),
            # Each payload is JSON text already: joined, not encoded again.
            "payloads": "[" + ",".join(payloads) + "]",
            "dedup_keys": _json_array(dedup_keys),
            "trigger_ids": _json_array(trigger_ids),
            "watchers": _json_array(watchers),
            "partition_keys": _json_array(partition_keys),
            "source": SOURCE_WATCHER,
            "ts": now,
            "owner": owner,
        },
    )
    inserted, owned = result.one()
    if not owned:
        raise LeaseLost(
            f"job {owner} is no longer running: another process took over what it owned; "
            f"{len(rows)} event(s) not stored"
        )
    return int(inserted)


def _json_array(values: Sequence[object]) -> str:
    return json.dumps(values, separators=(",", ":"))
