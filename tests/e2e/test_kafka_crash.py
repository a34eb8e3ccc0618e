"""A ``sluice triggerer`` consuming Kafka is killed with SIGKILL mid-run and restarted.

Three watcher triggers (different filters, one shared consumer) are seeded in an SQLite file
shared with the test; 5,000 messages are produced while the first triggerer runs; it is
killed once some asset events exist and before all do; a second triggerer takes the rows
over and the consumer group redelivers what was never committed. Every message a filter
matches must end with exactly one asset event: none lost, none duplicated.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections import Counter
from typing import TYPE_CHECKING

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import AssetEvent
from tests.e2e.helpers import sluice_env, start_cli, stop, wait_for
from tests.services_kafka import (
    FILTERS_PLUGIN,
    asset_event_keys,
    committed_offsets,
    expected_keys,
    produce,
    scenario_record,
    seed_watchers,
    watcher_specs,
)

if TYPE_CHECKING:
    from pathlib import Path

    from tests.services_kafka import KafkaBroker

pytestmark = pytest.mark.e2e

COUNT = 5000
PARTITIONS = 4
PRODUCE_CHUNK = 250
PRODUCE_PAUSE_S = 0.15  # ~1,700 messages/s: the run lasts a few seconds


def _produce_slowly(
    bootstrap: str, topic: str, done: threading.Event, killed: threading.Event
) -> None:
    """The first half paced, the second half only once the first triggerer is killed: the
    kill then always falls mid-stream, however slowly the triggerer started (under load it
    could otherwise have consumed everything before the test saw its first 500 events)."""

    async def main() -> None:
        for start in range(0, COUNT, PRODUCE_CHUNK):
            if start == COUNT // 2:
                await anyio.to_thread.run_sync(killed.wait, 60)
            chunk = range(start, min(start + PRODUCE_CHUNK, COUNT))
            await produce(bootstrap, topic, [scenario_record(i, PARTITIONS) for i in chunk])
            await anyio.sleep(PRODUCE_PAUSE_S)

    try:
        asyncio.run(main())
    finally:
        done.set()


def _asset_event_count(db: Database) -> int:
    return len(db.call(lambda s: s.execute(select(AssetEvent.id)).all()))


def test_kill_minus_nine_mid_run_neither_loses_nor_duplicates(
    kafka: KafkaBroker, tmp_path: Path, migrated_sqlite_url: str
) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "kafka_filters.py").write_text(FILTERS_PLUGIN)
    topic, dead = kafka.create_topic(PARTITIONS), kafka.create_topic(1, prefix="dlt")
    db_path = tmp_path / "sluice.db"  # migrated_sqlite_url's file
    db = Database(migrated_sqlite_url)
    key = Fernet.generate_key().decode()
    assets = seed_watchers(
        db, KwargsCipher(key), watcher_specs(kafka.bootstrap, topic, "crash", dead)
    )
    want = expected_keys(topic, COUNT, PARTITIONS)
    env = sluice_env(
        tmp_path / "home",
        SLUICE__CORE__SQL_ALCHEMY_CONN=f"sqlite:///{db_path}",
        SLUICE__CORE__FERNET_KEY=key,
        SLUICE__CORE__PLUGINS_FOLDER=str(plugins),
        SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC="1",
    )
    produced, killed = threading.Event(), threading.Event()
    first = start_cli("triggerer", env=env, log=tmp_path / "first.log")
    second = None
    producer = threading.Thread(
        target=_produce_slowly, args=(kafka.bootstrap, topic, produced, killed)
    )
    try:
        producer.start()
        wait_for(
            lambda: _asset_event_count(db) >= 500,
            timeout=30,
            what="the first triggerer to store some asset events",
        )
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed.set()
        stored_at_kill = _asset_event_count(db)
        assert stored_at_kill < sum(len(keys) for keys in want.values()), "killed too late"
        second = start_cli("triggerer", env=env, log=tmp_path / "second.log")
        producer.join(timeout=30)
        assert produced.is_set()
        per_partition = dict.fromkeys(range(PARTITIONS), COUNT // PARTITIONS)
        wait_for(
            lambda: (
                asyncio.run(committed_offsets(kafka.bootstrap, "crash", topic, PARTITIONS))
                == per_partition
            ),
            timeout=40,
            step=0.2,
            what="every offset to be committed after the restart",
        )
    finally:
        killed.set()
        if first.poll() is None:
            first.kill()
            first.wait()
        if second is not None:
            assert stop(second) == 0
        producer.join(timeout=30)

    got = asset_event_keys(db, assets)
    for name in assets:
        repeated = [k for k, n in Counter(got[name]).items() if n > 1]
        assert not repeated, f"{name}: duplicated asset events {repeated[:5]}"
        missing = want[name] - set(got[name])
        assert not missing, f"{name}: {len(missing)} lost, e.g. {sorted(missing)[:5]}"
        assert set(got[name]) == want[name]
    db.dispose()
