"""Shared streams through the real triggerer and persister on SQLite."""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import insert, select

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, AssetWatcher
from engine.db.queries import triggers as trigger_rows
from engine.states import TriggerKind
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from tests.waiting import wait_until
from triggers.file import LISTING_STATS

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.integration

N_SIBLINGS = 20
POKE_S = 0.2

ACK_PLUGIN = """
import sqlite3

import anyio

from shared_stream import SharedStreamProducer
from triggers import BaseEventTrigger, TriggerEvent

FEED = []          # raw events the test puts in
ADVANCES = []      # (broker_payload, is_clean, rows committed when advance was called)
WAKE = []


class ListProducer(SharedStreamProducer):
    def __init__(self, db_path):
        self.db_path = db_path

    async def open_stream(self):
        sent = 0
        while True:
            while sent < len(FEED):
                yield FEED[sent], sent
                sent += 1
            await anyio.sleep(0.005)

    async def advance(self, batch):
        with sqlite3.connect(self.db_path) as conn:
            for offset, outcome in batch:
                committed = conn.execute(
                    "SELECT count(*) FROM asset_event WHERE dedup_key = ?", (f"msg-{offset}",)
                ).fetchone()[0]
                ADVANCES.append((offset, outcome.is_clean, committed))


class AckTrigger(BaseEventTrigger):
    def __init__(self, db_path, parity, delay=0.0):
        super().__init__()
        self.db_path = db_path
        self.parity = parity
        self.delay = delay

    def serialize(self):
        return ("sluice_ack_plugin.AckTrigger",
                {"db_path": self.db_path, "parity": self.parity, "delay": self.delay})

    def shared_stream_key(self):
        return ("list-feed", self.db_path)

    @classmethod
    def create_shared_stream_producer(cls, kwargs):
        return ListProducer(kwargs["db_path"])

    async def filter_shared_stream(self, shared_stream):
        async for raw in shared_stream:
            if self.delay:
                await anyio.sleep(self.delay)
            if raw["n"] % 2 == self.parity:
                yield TriggerEvent(
                    raw, dedup_key=f"msg-{raw['n']}", partition_key=raw.get("hour")
                )

    async def run(self):
        raise RuntimeError("runs only as a shared-stream subscriber")
        yield
"""


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plugins")
    (folder / "sluice_ack_plugin.py").write_text(ACK_PLUGIN)
    return folder


def _watchers(
    db: Database, cipher: KwargsCipher, specs: list[tuple[str, str, dict[str, Any]]]
) -> dict[str, int]:
    def seed(session: Any) -> dict[str, int]:
        assets = {}
        for asset_name, classpath, kwargs in specs:
            asset_id = session.execute(
                insert(Asset)
                .values(name=asset_name, uri=f"test://{asset_name}", extra={})
                .returning(Asset.id)
            ).scalar_one()
            tid = trigger_rows.add_trigger_row(
                session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )
            assets[asset_name] = asset_id
        return assets

    return db.call(seed)


async def _triggerer(
    db: Database, cipher: KwargsCipher, plugins: Path, **overrides: Any
) -> Triggerer:
    return Triggerer(
        db=db,
        cipher=cipher,
        settings=TriggererSettings(
            capacity=100,
            heartbeat_s=1,
            health_check_threshold_s=2.1,
            plugins_folder=plugins,
            claim_idle_interval_s=0.05,
            cleanup_interval_s=60,
            shutdown_grace_s=5,
            **overrides,
        ),
    )


def _events(db: Database) -> list[tuple[int, Any]]:
    return db.call(
        lambda s: [(r.asset_id, r.payload) for r in s.execute(select(AssetEvent)).scalars()]
    )


async def test_twenty_siblings_share_one_listing_per_cadence(
    tmp_path: Path, plugins: Path, migrated_sqlite_url: str
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    db = Database(migrated_sqlite_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    specs = [
        (
            f"region-{i}",
            "triggers.file.DirectoryFileDeleteTrigger",
            {"directory": str(inbox), "filename": f"flag-{i}", "poke_interval": POKE_S},
        )
        for i in range(N_SIBLINGS)
    ]
    assets = _watchers(db, cipher, specs)
    LISTING_STATS.reset()
    triggerer = await _triggerer(db, cipher, plugins)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await wait_until(lambda: len(triggerer.runner) == N_SIBLINGS)
            await wait_until(lambda: triggerer.shared_streams.group_keys)
            assert len(triggerer.shared_streams.group_keys) == 1
            listings_before = LISTING_STATS.count(str(inbox))
            started = anyio.current_time()
            for i in (3, 7, 11):
                (inbox / f"flag-{i}").touch()
            await wait_until(lambda: len(_events(db)) == 3)
            # Count listings over a fixed window: about one per cadence for the whole group,
            # where one poll loop per trigger would make twenty.
            await anyio.sleep(5 * POKE_S)
            elapsed = anyio.current_time() - started
            listings = LISTING_STATS.count(str(inbox)) - listings_before
            triggerer.shutdown()
    assert listings <= elapsed / POKE_S + 2, f"{listings} listings in {elapsed:.2f}s"
    events = _events(db)
    assert sorted(asset for asset, _ in events) == sorted(assets[f"region-{i}"] for i in (3, 7, 11))
    assert all(
        p["filename"] == f"flag-{i}"
        for (a, p) in events
        for i in (3, 7, 11)
        if a == assets[f"region-{i}"]
    )
    assert not any(inbox.iterdir())  # each trigger deleted its own flag file
    db.dispose()


@asynccontextmanager
async def _parity_pair(
    db_url: str, plugins: Path, kwargs: dict[str, Any] | None = None, **settings: Any
) -> AsyncIterator[tuple[Database, Triggerer, Any]]:
    """An "even" and an "odd" ack-mode watcher of one list feed, subscribed and running;
    yields the database, the triggerer and the plugin module (its FEED and ADVANCES)."""
    db_path = Path(db_url.removeprefix("sqlite:///"))
    db = Database(db_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    base = {"db_path": str(db_path), **(kwargs or {})}
    _watchers(
        db,
        cipher,
        [
            ("even", "sluice_ack_plugin.AckTrigger", {**base, "parity": 0}),
            ("odd", "sluice_ack_plugin.AckTrigger", {**base, "parity": 1}),
        ],
    )
    triggerer = await _triggerer(db, cipher, plugins, **settings)
    if (loaded := sys.modules.get("sluice_ack_plugin")) is not None:
        loaded.FEED.clear()  # an earlier test's feed: the new producer must start from 0
    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                await tg.start(triggerer.run)
                await wait_until(lambda: len(triggerer.runner) == 2)
                plugin = sys.modules["sluice_ack_plugin"]
                plugin.FEED.clear()
                plugin.ADVANCES.clear()
                key = ("list-feed", str(db_path))
                await wait_until(lambda: triggerer.shared_streams.subscriber_count(key) == 2)
                yield db, triggerer, plugin
                triggerer.shutdown()
    finally:
        db.dispose()


async def test_ack_mode_advances_only_after_asset_events_are_committed(
    migrated_sqlite_url: str, plugins: Path
) -> None:
    async with _parity_pair(migrated_sqlite_url, plugins) as (db, _, plugin):
        plugin.FEED.extend({"n": n} for n in range(50))
        await wait_until(lambda: len(plugin.ADVANCES) == 50)
        events = _events(db)
    assert [offset for offset, _, _ in plugin.ADVANCES] == list(range(50))  # in order, once each
    assert all(clean for _, clean, _ in plugin.ADVANCES)
    assert all(committed == 1 for _, _, committed in plugin.ADVANCES), plugin.ADVANCES
    assert len(events) == 50


async def test_a_partition_key_set_by_a_filter_is_stored_and_dedup_still_holds(
    migrated_sqlite_url: str, plugins: Path
) -> None:
    """Each subscriber's filter takes the key from a field of the raw event (as a Kafka
    watcher would from its message); the broker is advanced after the keyed events are
    committed, and a redelivered raw event adds nothing."""
    hours = [f"2026-03-10T{n:02d}:00:00" for n in range(6)]
    async with _parity_pair(migrated_sqlite_url, plugins) as (db, _, plugin):
        plugin.FEED.extend({"n": n, "hour": hours[n]} for n in range(6))
        plugin.FEED.append({"n": 2, "hour": hours[2]})  # a redelivery of message 2
        await wait_until(lambda: len(plugin.ADVANCES) == 7)
        stored = db.call(
            lambda s: (
                s.execute(select(AssetEvent.partition_key).order_by(AssetEvent.partition_key))
                .scalars()
                .all()
            )
        )
    # Advanced once each, after its event was committed (the redelivery, position 6 of the
    # feed, is checked by the plugin under msg-6: it wrote nothing of its own).
    assert [(offset, clean) for offset, clean, _ in plugin.ADVANCES] == [
        (offset, True) for offset in range(7)
    ]
    assert all(committed == 1 for _, _, committed in plugin.ADVANCES[:6]), plugin.ADVANCES
    assert stored == hours  # message 2 once


async def test_graceful_shutdown_advances_no_event_as_failed(
    migrated_sqlite_url: str, plugins: Path
) -> None:
    """Unpulled events at shutdown are abandoned for redelivery, never advanced as failed."""
    async with _parity_pair(migrated_sqlite_url, plugins, {"delay": 0.02}) as (_, _, plugin):
        plugin.FEED.extend({"n": n} for n in range(200))  # a backlog the filters lag behind
        await wait_until(lambda: len(plugin.ADVANCES) >= 10)
    offsets = [offset for offset, _, _ in plugin.ADVANCES]
    assert offsets == list(range(len(offsets)))  # a contiguous prefix, once each
    assert len(offsets) < 200  # the shutdown really cut the stream short
    assert all(clean for _, clean, _ in plugin.ADVANCES), plugin.ADVANCES


async def test_an_event_over_the_payload_limit_is_rejected_not_redelivered_forever(
    migrated_sqlite_url: str, plugins: Path
) -> None:
    """The store refuses it: its raw event is advanced as rejected (the producer
    dead-letters it), its siblings' events are stored and advanced clean."""
    limit = {"max_asset_event_payload_bytes": 200}
    async with _parity_pair(migrated_sqlite_url, plugins, **limit) as (db, triggerer, plugin):
        plugin.FEED.extend({"n": n, "pad": "x" * (500 if n == 3 else 1)} for n in range(6))
        await wait_until(lambda: len(plugin.ADVANCES) >= 6)
        (stats,) = triggerer.shared_streams.stats()
        events = _events(db)
    clean = {offset: is_clean for offset, is_clean, _ in plugin.ADVANCES}
    assert clean == {0: True, 1: True, 2: True, 3: False, 4: True, 5: True}
    assert sorted(p["n"] for _, p in events) == [0, 1, 2, 4, 5]
    assert stats.rejects == 1
