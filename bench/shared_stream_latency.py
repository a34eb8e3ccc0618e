"""Yield-to-advance latency of a shared stream with real persistence, for
bench/shared_stream_bench.py (figure 2): the real ``Triggerer`` on SQLite, an ack-mode
producer (a plugin written to a temporary folder) fed at a steady rate; latency = time from
the producer yielding an event to ``advance`` receiving it, the event's asset event
committed in between.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from cryptography.fernet import Fernet

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.queries import triggers as trigger_rows
from engine.db.schema import migrate
from engine.states import TriggerKind
from engine.supervisor import tune_gc
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer

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
