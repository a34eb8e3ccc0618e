"""Shared-stream figures: fan-out throughput and yield-to-advance latency.

Run by hand (never in tests):  .venv/bin/python bench/shared_stream_bench.py

1. Fan-out throughput, fast and ack mode, N = 1, 10, 100 subscribers, queue size 1024 (the
   default), log level WARNING: raw events/s and deliveries/s (raw x N)
   * manager alone: subscribers consume ``filter_shared_stream`` directly, bind and confirm;
   * through the runtime: each subscriber is a trigger run by ``TriggerRunner``; its events
     go through the outbox to a drain task that confirms them (the persister's role, no DB).
2. Yield-to-advance latency with real persistence: the real ``Triggerer`` on SQLite, an
   ack-mode producer fed at a steady rate; latency = time from the producer yielding an
   event to ``advance`` receiving it (the event's asset event committed in between).
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from cryptography.fernet import Fernet

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import TriggerKind
from engine.db.queries import triggers as trigger_rows
from engine.db.schema import migrate
from engine.supervisor import tune_gc
from engine.triggerer.outbox import FiredEvent, Outbox
from engine.triggerer.runtime import TriggerRunner, TriggerSpec
from engine.triggerer.triggerer import Triggerer, TriggererSettings
from shared_stream import SharedStreamManager
from shared_stream.testing import InMemoryFeed, InMemoryProducer
from triggers.base import BaseEventTrigger, TriggerEvent

QUEUE_SIZE = 1024
KEY = ("bench",)
_FEED: InMemoryFeed | None = None
_PRODUCER: InMemoryProducer | None = None


class _BenchTrigger(BaseEventTrigger):
    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.{type(self).__qualname__}", {})

    async def run(self) -> Any:
        raise RuntimeError("bench triggers run as shared-stream subscribers")
        yield

    def shared_stream_key(self) -> Any:
        return KEY

    async def filter_shared_stream(self, shared_stream: Any) -> Any:
        async for raw in shared_stream:
            yield TriggerEvent(raw)


class FastTrigger(_BenchTrigger):
    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> Any:
        assert _FEED is not None
        async for raw in _FEED:
            yield raw


class AckTrigger(_BenchTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> Any:
        return _PRODUCER


async def _feed(ack: bool, m: int) -> None:
    for i in range(m):
        if ack:
            assert _PRODUCER is not None
            _PRODUCER.feed.put(({"i": i}, i))
        else:
            assert _FEED is not None
            _FEED.put({"i": i})
        if i % 256 == 255:
            await anyio.lowlevel.checkpoint()  # a broker hands out batches, not one endless burst


async def manager_alone(n: int, m: int, ack: bool) -> float:
    global _FEED, _PRODUCER
    _FEED, _PRODUCER = InMemoryFeed(), InMemoryProducer()
    cls = AckTrigger if ack else FastTrigger
    done, count = anyio.Event(), 0

    async def subscriber(mgr: SharedStreamManager, tid: int) -> None:
        nonlocal count
        trigger = cls()
        stream = mgr.subscribe(trigger_id=tid, trigger=trigger, key=KEY)
        async for _event in trigger.filter_shared_stream(stream):
            seq = mgr.bind_pending_event(trigger_id=tid, key=KEY)
            if seq is not None:
                mgr.confirm_persisted((seq,))
            count += 1
            if count == n * m:
                done.set()

    async with SharedStreamManager(max_subscriber_queue=QUEUE_SIZE) as mgr:
        async with anyio.create_task_group() as tg:
            for tid in range(n):
                tg.start_soon(subscriber, mgr, tid)
            await anyio.wait_all_tasks_blocked()
            started = time.perf_counter()
            await _feed(ack, m)
            await done.wait()
            if ack:
                await _PRODUCER.wait_for_advanced(m - 1)
            elapsed = time.perf_counter() - started
            tg.cancel_scope.cancel()
    return m / elapsed


async def through_runtime(n: int, m: int, ack: bool) -> float:
    global _FEED, _PRODUCER
    _FEED, _PRODUCER = InMemoryFeed(), InMemoryProducer()
    cls = AckTrigger if ack else FastTrigger
    outbox = Outbox()
    mgr = SharedStreamManager(max_subscriber_queue=QUEUE_SIZE)
    runner = TriggerRunner(outbox=outbox, shared_streams=mgr)
    done, count = anyio.Event(), 0

    async def drain() -> None:  # the persister's part, without the database
        nonlocal count
        while batch := await outbox.get_batch(2000):
            seqs = [i.seq for i in batch if isinstance(i, FiredEvent) and i.seq is not None]
            mgr.confirm_persisted(seqs)
            count += len(batch)
            if count >= n * m:
                done.set()

    async with anyio.create_task_group() as tg:
        await tg.start(mgr.run)
        await tg.start(runner.run)
        tg.start_soon(drain)
        for tid in range(n):
            runner.start(TriggerSpec(trigger_id=tid, trigger=cls(), kind=TriggerKind.WATCHER))
        while True:  # every subscriber joined before events flow
            if mgr.subscriber_count(KEY) >= n:
                break
            await anyio.sleep(0.001)
        started = time.perf_counter()
        await _feed(ack, m)
        await done.wait()
        if ack:
            await _PRODUCER.wait_for_advanced(m - 1)
        elapsed = time.perf_counter() - started
        tg.cancel_scope.cancel()
    return m / elapsed


LATENCY_PLUGIN = """
import time

import anyio

from shared_stream import SharedStreamProducer
from triggers import BaseEventTrigger, TriggerEvent

YIELDED = {}
ADVANCED = {}
RATE = [200.0, 1000]


class TimedProducer(SharedStreamProducer):
    async def open_stream(self):
        rate, total = RATE
        for n in range(int(total)):
            await anyio.sleep(1 / rate)
            YIELDED[n] = time.perf_counter()
            yield {"n": n}, n
        await anyio.sleep_forever()

    async def advance(self, batch):
        now = time.perf_counter()
        for n, _outcome in batch:
            ADVANCED[n] = now


class TimedTrigger(BaseEventTrigger):
    def __init__(self, tag):
        super().__init__()
        self.tag = tag

    def serialize(self):
        return ("sluice_bench_plugin.TimedTrigger", {"tag": self.tag})

    def shared_stream_key(self):
        return ("timed",)

    @classmethod
    def create_shared_stream_producer(cls, kwargs):
        return TimedProducer()

    async def filter_shared_stream(self, shared_stream):
        async for raw in shared_stream:
            yield TriggerEvent(raw, dedup_key=f"{self.tag}-{raw['n']}")

    async def run(self):
        raise RuntimeError("subscriber only")
        yield
"""


async def _latency_run(db: Database, cipher: KwargsCipher, plugins: Path, total: int) -> None:
    settings = TriggererSettings(capacity=100, plugins_folder=plugins, claim_idle_interval_s=0.1)
    triggerer = Triggerer(db=db, cipher=cipher, settings=settings)
    plugin = None
    async with anyio.create_task_group() as tg:
        await tg.start(triggerer.run)
        while True:
            plugin = sys.modules.get("sluice_bench_plugin")
            if plugin is not None and len(plugin.ADVANCED) >= total:
                break
            await anyio.sleep(0.05)
        triggerer.shutdown()


def yield_to_advance(subscribers: int, rate: float, total: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        plugins = Path(tmp) / "plugins"
        plugins.mkdir()
        (plugins / "sluice_bench_plugin.py").write_text(LATENCY_PLUGIN)
        db = Database(f"sqlite:///{tmp}/bench.db")
        migrate(db.engine)
        cipher = KwargsCipher(Fernet.generate_key().decode())

        def seed(session: Any) -> None:
            from sqlalchemy import insert

            from engine.db.models import Asset, AssetWatcher

            for i in range(subscribers):
                asset_id = session.execute(
                    insert(Asset)
                    .values(name=f"a{i}", uri=f"bench://{i}", extra={})
                    .returning(Asset.id)
                ).scalar_one()
                tid = trigger_rows.add_trigger_row(
                    session,
                    cipher,
                    "sluice_bench_plugin.TimedTrigger",
                    {"tag": f"t{i}"},
                    kind=TriggerKind.WATCHER,
                )
                session.execute(
                    insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
                )

        db.call(seed)
        sys.path.insert(0, str(plugins))
        import sluice_bench_plugin  # type: ignore[import-not-found]

        sluice_bench_plugin.RATE[:] = [rate, total]
        sluice_bench_plugin.YIELDED.clear()
        sluice_bench_plugin.ADVANCED.clear()
        tune_gc()  # the real triggerer, as `sluice triggerer` runs it
        anyio.run(_latency_run, db, cipher, plugins, total)
        db.dispose()
        sys.path.remove(str(plugins))
        lat = sorted(
            (sluice_bench_plugin.ADVANCED[n] - sluice_bench_plugin.YIELDED[n]) * 1000
            for n in range(total)
        )
        del sys.modules["sluice_bench_plugin"]
    return {
        "p50_ms": statistics.median(lat),
        "p99_ms": lat[int(len(lat) * 0.99) - 1],
        "max_ms": lat[-1],
        "events": total,
        "subscribers": subscribers,
        "rate_per_s": rate,
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    results: dict[str, Any] = {"fanout": []}
    sizes = {1: 20_000, 10: 5_000, 100: 1_000}
    for ack in (False, True):
        for n, m in sizes.items():
            alone = max(anyio.run(manager_alone, n, m, ack) for _ in range(3))
            runtime = max(anyio.run(through_runtime, n, m, ack) for _ in range(3))
            row = {
                "mode": "ack" if ack else "fast",
                "subscribers": n,
                "raw_per_s_manager": alone,
                "deliveries_per_s_manager": alone * n,
                "raw_per_s_runtime": runtime,
                "deliveries_per_s_runtime": runtime * n,
            }
            results["fanout"].append(row)
            print(
                f"{row['mode']:4s} N={n:3d}  manager: {alone:>9,.0f} raw/s {alone * n:>10,.0f} "
                f"deliveries/s   runtime: {runtime:>9,.0f} raw/s {runtime * n:>10,.0f} "
                "deliveries/s",
                flush=True,
            )
    for subscribers in (1, 10):
        lat = yield_to_advance(subscribers, rate=200.0, total=1000)
        results.setdefault("yield_to_advance_sqlite", []).append(lat)
        print(
            f"yield->advance (SQLite, {subscribers} subscriber(s), 200 ev/s): "
            f"p50 {lat['p50_ms']:.1f} ms  p99 {lat['p99_ms']:.1f} ms  max {lat['max_ms']:.1f} ms",
            flush=True,
        )
    out = Path(__file__).parent / "results" / "shared_stream.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
