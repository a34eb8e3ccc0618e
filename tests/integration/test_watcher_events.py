"""The persister's bulk write of watcher events, on SQLite and on PostgreSQL.

Payloads are encoded once (``json_text``) and handed to one fixed-shape statement (unnest
arrays on PostgreSQL, ``executemany`` on SQLite): what is read back must be what a trigger
fired, whatever the payload holds; dedup keys, the size limit, the DAG queue and the refusal
of a NUL byte must work as through the ORM insert before.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import insert, select

from engine.db.database import Database
from engine.db.models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetEvent,
    AssetEventQueue,
    Dag,
    DagScheduleAsset,
    DagScheduleAssetAlias,
)
from engine.db.queries import asset_queue, run_context, runs
from engine.triggerer.outbox import FiredEvent, Outbox
from engine.triggerer.persister import Persister
from tests.persisting import persist
from triggers.base import TriggerEvent
from triggers.serde import deserialize_value, dumps, json_text, serialize_value

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]

ODD_PAYLOADS: list[Any] = [
    None,
    {},
    [],
    "plain",
    {"unicode": "héllo wörld — 日本語 🚀", "quote": 'a "b" \\ c', "ctl": "tab\there\nnl"},
    {"nul": "a\x00b"},  # inside JSON text the NUL is the escape \u0000
    {"nested": {"a": [1, 2, {"b": [None, True, False, 1.5, -0.0, 10**30]}]}},
    {"deep": json.loads("[" * 90 + "]" * 90)},
    {"large": "x" * 300_000, "many": list(range(5_000))},
    {"tagged": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "set": {3, 1, 2}, "t": (1, "a")},
    {"bytes": b"\x00\xff", "decimal": Decimal("1.10"), "nan": float("nan")},
    {1: "int key", "__sluice_type__": "reserved key"},
]


@pytest.fixture
def db(migrated_db_url: str) -> Iterator[Database]:
    database = Database(migrated_db_url)
    yield database
    database.dispose()


def _asset(db: Database, name: str = "a") -> int:
    return int(
        db.call(
            lambda s: s.execute(
                insert(Asset).values(name=name, uri=f"test://{name}", extra={}).returning(Asset.id)
            ).scalar_one()
        )
    )


def _fired(asset_id: int, payload: Any, key: str | None, seq: int | None = None) -> FiredEvent:
    return FiredEvent(1, TriggerEvent(payload), seq, 0.0, (asset_id, "w"), dedup_key=key)


def _stored(db: Database, asset_id: int) -> list[tuple[Any, str | None]]:
    rows = db.call(
        lambda s: s.execute(
            select(AssetEvent.payload, AssetEvent.dedup_key)
            .where(AssetEvent.asset_id == asset_id)
            .order_by(AssetEvent.id)
        ).all()
    )
    return [(payload, key) for payload, key in rows]


def _queued(session: Any) -> list[tuple[str, Any]]:
    """(DAG, payload) of every queued event, by DAG then event."""
    rows = session.execute(
        select(AssetEventQueue.dag_id, AssetEvent.payload)
        .join(AssetEvent, AssetEvent.id == AssetEventQueue.asset_event_id)
        .order_by(AssetEventQueue.dag_id, AssetEvent.id)
    )
    return [(dag_id, payload) for dag_id, payload in rows]


def _equal(a: Any, b: Any) -> bool:
    """Equality that takes NaN as equal to itself (through canonical text)."""
    return dumps(a) == dumps(b)


def test_json_text_is_as_long_as_the_canonical_text_and_reads_back_the_same() -> None:
    for payload in ODD_PAYLOADS:
        text = json_text(payload)
        assert len(text) == len(dumps(payload)), payload
        assert text.isascii()
        assert json.loads(text) == json.loads(json.dumps(serialize_value(payload)))


def test_odd_payloads_are_stored_and_read_back_as_fired(db: Database) -> None:
    asset_id = _asset(db)
    persister = Persister(db=db, outbox=Outbox())
    items = [_fired(asset_id, p, f"k{i}", seq=i) for i, p in enumerate(ODD_PAYLOADS)]
    result = persist(db, persister, items)
    assert result.asset_events == len(ODD_PAYLOADS)
    assert result.seqs == list(range(len(ODD_PAYLOADS)))
    rows = _stored(db, asset_id)
    assert [key for _, key in rows] == [f"k{i}" for i in range(len(ODD_PAYLOADS))]
    for (stored, _), payload in zip(rows, ODD_PAYLOADS, strict=True):
        assert stored == json.loads(json.dumps(serialize_value(payload))), payload
        assert _equal(deserialize_value(stored), payload), payload


def test_keys_absorb_redeliveries_within_and_across_batches(db: Database) -> None:
    asset_id = _asset(db)
    other = _asset(db, "b")
    persister = Persister(db=db, outbox=Outbox())
    first = [_fired(asset_id, {"n": n}, key) for n, key in enumerate(["k1", "k1", None, None])]
    # The same key on another asset is another event; a key over 512 chars is cut as before.
    first.append(_fired(other, {"n": 9}, "k1"))
    assert persist(db, persister, first).asset_events == 4
    second = [_fired(asset_id, {"n": 5}, "k1"), _fired(asset_id, {"n": 6}, "x" * 600)]
    assert persist(db, persister, second).asset_events == 1
    assert _stored(db, asset_id) == [
        ({"n": 0}, "k1"),
        ({"n": 2}, None),
        ({"n": 3}, None),
        ({"n": 6}, "x" * 512),
    ]
    assert _stored(db, other) == [({"n": 9}, "k1")]


def test_new_events_are_queued_for_the_dags_on_their_asset(db: Database) -> None:
    consumed, unconsumed = _asset(db, "consumed"), _asset(db, "unconsumed")

    def add_dags(session: Any) -> None:
        for dag_id in ("d1", "d2"):
            session.execute(insert(Dag).values(dag_id=dag_id, fileloc="/dags/x.py"))
            session.execute(insert(DagScheduleAsset).values(dag_id=dag_id, asset_id=consumed))

    db.call(add_dags)
    persister = Persister(db=db, outbox=Outbox())
    persist(db, persister, [_fired(consumed, {"old": 1}, "k0")])
    items = [
        _fired(unconsumed, {"n": 0}, None),
        _fired(consumed, {"n": 1}, "k0"),  # a redelivery: no new event, nothing queued
        _fired(consumed, {"n": 2}, "k2"),
        _fired(unconsumed, {"n": 3}, "k3"),
        _fired(consumed, {"n": 4}, None),
    ]
    assert persist(db, persister, items).asset_events == 4

    assert db.call(_queued) == [
        (dag_id, payload) for dag_id in ("d1", "d2") for payload in ({"old": 1}, {"n": 2}, {"n": 4})
    ]


async def _write_as_the_persister_does(persister: Persister, items: list[FiredEvent]) -> None:
    """Through ``run``, on the persister's own outbox: a batch of watcher events only is one
    statement (on PostgreSQL in autocommit, one round trip), not the
    transaction of ``tests.persisting.persist``."""
    for item in items:
        persister.outbox.put_nowait(item)
    persister.outbox.close()
    with anyio.fail_after(30):
        await persister.run()
    assert persister.stats.dropped == 0


@pytest.mark.parametrize("keep_while_paused", [True, False])
@pytest.mark.parametrize("path", ["transaction", "statement"])
async def test_each_consumer_rule_holds_in_either_write(
    db: Database, path: str, keep_while_paused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event is queued for each active DAG on its asset, directly or through an alias,
    once even when both; a paused DAG only while ``keep_events_while_paused``; a DAG whose
    file is gone, never."""
    asset_id, other = _asset(db, "watched"), _asset(db, "other")

    def add_dags(session: Any) -> None:
        alias_id = session.execute(
            insert(AssetAlias).values(name="files").returning(AssetAlias.id)
        ).scalar_one()
        session.execute(insert(AssetAliasAsset).values(alias_id=alias_id, asset_id=asset_id))
        dags = {"direct": {}, "both": {}, "by_alias": {}, "paused": {"is_paused": True}}
        dags["gone"] = {"is_active": False}
        for dag_id, state in dags.items():
            session.execute(insert(Dag).values(dag_id=dag_id, fileloc="/dags/x.py", **state))
            if dag_id != "by_alias":
                session.execute(insert(DagScheduleAsset).values(dag_id=dag_id, asset_id=asset_id))
        for dag_id in ("both", "by_alias"):
            session.execute(insert(DagScheduleAssetAlias).values(dag_id=dag_id, alias_id=alias_id))

    db.call(add_dags)
    persister = Persister(db=db, outbox=Outbox(), keep_events_while_paused=keep_while_paused)
    items = [
        _fired(asset_id, {"n": 1}, "k1", seq=1),
        _fired(other, {"n": 2}, "k2", seq=2),
        _fired(asset_id, {"n": 3}, None, seq=3),
        _fired(asset_id, {"n": 4}, "k1", seq=4),  # a redelivery of k1: nothing new to queue
    ]
    if path == "transaction":
        result = persist(db, persister, items)
        assert (result.asset_events, result.seqs) == (3, [1, 2, 3, 4])
    else:
        statements: list[object] = []
        call_statement = db.call_statement

        def counted(fn: Any) -> Any:
            statements.append(fn)
            return call_statement(fn)

        monkeypatch.setattr(db, "call_statement", counted)
        await _write_as_the_persister_does(persister, items)
        assert (persister.stats.asset_events, persister.stats.events) == (3, 4)
        assert len(statements) == 1  # the whole batch, as one statement

    dag_ids = ["both", "by_alias", "direct"] + (["paused"] if keep_while_paused else [])
    assert db.call(_queued) == [
        (dag_id, payload) for dag_id in dag_ids for payload in ({"n": 1}, {"n": 3})
    ]
    assert _stored(db, other) == [({"n": 2}, "k2")]


async def test_a_batch_with_an_event_over_the_limit_is_written_in_a_transaction(
    db: Database,
) -> None:
    """Refusing an event writes to its trigger row, so such a batch is not one statement;
    the other events of the batch are stored with it, and only the refused one is refused."""
    asset_id = _asset(db)
    refused: list[int] = []
    persister = Persister(db=db, outbox=Outbox(), max_payload_bytes=20, refuse=refused.extend)
    items = [_fired(asset_id, {"n": 1}, "a", seq=1), _fired(asset_id, {"n": "x" * 30}, "b", seq=2)]
    await _write_as_the_persister_does(persister, items)
    assert (refused, persister.stats.refused, persister.stats.events) == ([2], 1, 1)
    assert _stored(db, asset_id) == [({"n": 1}, "a")]


def test_the_size_limit_measures_the_stored_text(db: Database) -> None:
    asset_id = _asset(db)
    at_limit = {"pad": "é" * 10}  # 10 non-ASCII characters: 60 bytes of escaped JSON
    limit = len(dumps(at_limit))
    persister = Persister(db=db, outbox=Outbox(), max_payload_bytes=limit)
    items = [
        _fired(asset_id, at_limit, "fits", seq=1),
        _fired(asset_id, {"pad": "é" * 11}, "over", seq=2),
    ]
    result = persist(db, persister, items)
    assert (result.asset_events, result.seqs, result.refused_seqs) == (1, [1], [2])
    assert _stored(db, asset_id) == [(at_limit, "fits")]


async def test_a_nul_byte_postgres_refuses_drops_that_event_only(db: Database) -> None:
    """PostgreSQL text cannot hold a NUL byte: the batch is bisected and only the event
    whose key holds one is dropped (left unconfirmed); SQLite stores it as it did."""
    asset_id = _asset(db)
    confirmed: list[int] = []
    outbox = Outbox()
    persister = Persister(db=db, outbox=outbox, confirm=confirmed.extend)
    keys = ["a", f"bad\x00{uuid.uuid4().hex}", "c", "d"]
    for seq, key in enumerate(keys):
        outbox.put_nowait(_fired(asset_id, {"seq": seq}, key, seq=seq))
    outbox.close()
    with anyio.fail_after(30):
        await persister.run()
    if db.is_sqlite:
        assert (persister.stats.dropped, sorted(confirmed)) == (0, [0, 1, 2, 3])
        assert [key for _, key in _stored(db, asset_id)] == keys
    else:
        assert (persister.stats.dropped, sorted(confirmed)) == (1, [0, 2, 3])
        assert [key for _, key in _stored(db, asset_id)] == ["a", "c", "d"]


def test_a_run_consumes_the_queued_events_through_the_newest_it_read(db: Database) -> None:
    """``asset_queue.consume_queued_events`` (what an asset-triggered run does with the queue the
    scheduler read): that DAG's events up to the newest one read are linked to the run, in
    id order as its tasks read them, and leave its queue; a later event and the other DAG's
    stay queued."""
    asset_id = _asset(db)

    def add_dags(session: Any) -> None:
        for dag_id in ("d1", "d2"):
            session.execute(insert(Dag).values(dag_id=dag_id, fileloc="/dags/x.py"))
            session.execute(insert(DagScheduleAsset).values(dag_id=dag_id, asset_id=asset_id))

    db.call(add_dags)
    persister = Persister(db=db, outbox=Outbox())
    persist(db, persister, [_fired(asset_id, {"n": n}, f"k{n}") for n in range(5)])

    def consume(session: Any) -> list[Any]:
        ids = [
            int(i)
            for i in session.execute(
                select(AssetEvent.id).where(AssetEvent.asset_id == asset_id).order_by(AssetEvent.id)
            ).scalars()
        ]
        run_pk = runs.create_run(
            session, "d1", run_type=runs.ASSET_TRIGGERED, now=datetime.now(UTC)
        )
        assert run_pk is not None
        asset_queue.consume_queued_events(session, "d1", run_pk, through=ids[3])
        return [(e.asset_name, e.payload) for e in run_context.triggering_events(session, run_pk)]

    linked = db.call(consume)
    assert linked == [("a", {"n": n}) for n in range(4)]
    assert db.call(_queued) == [("d1", {"n": 4})] + [("d2", {"n": n}) for n in range(5)]


def test_an_event_that_commits_after_a_run_with_a_lower_id_waits_for_the_next(
    migrated_pg_url: str,
) -> None:
    """PostgreSQL hands out ids before commits: an event can take its id before the newest
    queued one's and land in the DAG's queue after a run consumed the queue through that
    newest id. It is not lost: it stays queued (the run's consume took what was committed
    at its statement, and the scheduler's lock on the DAG row holds the late queue row back
    until the run's transaction ended), and the next run consumes it."""
    db = Database(migrated_pg_url)
    try:
        asset_id = _asset(db)

        def add_dag(session: Any) -> None:
            session.execute(insert(Dag).values(dag_id="d1", fileloc="/dags/x.py"))
            session.execute(insert(DagScheduleAsset).values(dag_id="d1", asset_id=asset_id))

        def run_on_queue(session: Any) -> list[Any]:
            queued = asset_queue.lock_queued_dag(session, "d1")
            assert queued is not None
            assert queued.updated == {"a"}
            run_pk = runs.create_run(
                session, "d1", run_type=runs.ASSET_TRIGGERED, now=datetime.now(UTC)
            )
            assert run_pk is not None
            asset_queue.consume_queued_events(session, "d1", run_pk, through=queued.last_event_id)
            return [e.payload for e in run_context.triggering_events(session, run_pk)]

        db.call(add_dag)
        with db.session() as late:  # takes its id first, queues the event last
            late_id = late.execute(
                insert(AssetEvent)
                .values(asset_id=asset_id, payload={"n": 0})
                .returning(AssetEvent.id)
            ).scalar_one()
            persist(db, Persister(db=db, outbox=Outbox()), [_fired(asset_id, {"n": 1}, "k1")])
            assert db.call(run_on_queue) == [{"n": 1}]
            late.execute(insert(AssetEventQueue).values(dag_id="d1", asset_event_id=late_id))
        assert db.call(_queued) == [("d1", {"n": 0})]
        assert db.call(run_on_queue) == [{"n": 0}]
        assert db.call(_queued) == []
    finally:
        db.dispose()
