"""Redis Streams end-to-end throughput: watchers through the real triggerer vs a bare
XREADGROUP/XACK loop on the same server in the same run.

Run by hand (never in tests):  .venv/bin/python bench/redis_bench.py [--messages 5000]
                                   [--url redis://127.0.0.1:6379/11] [--repeat 3]
                                   [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

Each case preloads M entries (a JSON ``body`` field) into a fresh stream of the server at
``--url``, then drains it through a fresh consumer group:

* bare: one redis-py asyncio loop, ``XREADGROUP COUNT 250 BLOCK 1000`` + one ``XACK`` per
  batch, from the first read until M entries are acked: what the server allows a client.
* sluice N=1 / N=10: N ``RedisStreamTrigger`` watchers (no filter) on the stream, run by the
  real ``Triggerer`` in-process on SQLite (and PostgreSQL with ``--pg``), from the
  producer's connection (the group starts reading after a 0.5 s cohort grace, so all N
  watchers see every entry) until all M x N asset events are committed and every entry is
  acked.

Figures: messages/s and asset events/s, min / median / max of ``--repeat`` runs, each case
alternating with the bare loop so both see the same load; the ratio is of medians. The
streams are deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import redis.asyncio as redis_asyncio
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, insert, text

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetWatcher
from engine.db.queries import triggers as trigger_rows
from engine.db.schema import migrate
from engine.states import TriggerKind
from engine.triggerer.triggerer import Triggerer, TriggererSettings
from producers import RedisStreamTrigger

if TYPE_CHECKING:
    from engine.triggerer.persister import BatchResult

GROUP = "bench"
COHORT_GRACE_S = 0.5
BARE_COUNT = 250
PRELOAD_CHUNK = 1000


async def new_stream(client: Any, messages: int) -> str:
    name = f"bench-{uuid.uuid4().hex[:12]}"
    for start in range(0, messages, PRELOAD_CHUNK):
        async with client.pipeline(transaction=False) as pipe:
            for n in range(start, min(messages, start + PRELOAD_CHUNK)):
                pipe.xadd(name, {"body": json.dumps({"n": n})})
            await pipe.execute()
    return name


async def all_acked(client: Any, stream: str) -> bool:
    """Nothing pending and every entry delivered to the group."""
    [group] = await client.xinfo_groups(stream)
    [(last, _)] = await client.xrevrange(stream, count=1)
    return bool(group["pending"] == 0 and group["last-delivered-id"] == last)


# -- the cases --------------------------------------------------------------------------


async def bare_loop(url: str, messages: int) -> dict[str, float]:
    client = redis_asyncio.Redis.from_url(url)
    try:
        stream = await new_stream(client, messages)
        await client.xgroup_create(stream, GROUP, "0")
        started = time.perf_counter()
        acked = 0
        while acked < messages:
            reply = await client.xreadgroup(GROUP, "bare", {stream: ">"}, BARE_COUNT, 1000)
            for _, entries in reply or []:
                ids = [entry_id for entry_id, _ in entries]
                json.loads(entries[-1][1][b"body"])  # as a consumer would decode them
                await client.xack(stream, GROUP, *ids)
                acked += len(ids)
        seconds = time.perf_counter() - started
        await client.delete(stream)
    finally:
        await client.aclose()
    return {"watchers": 0, "seconds": seconds, "msgs_per_s": messages / seconds}


class _ConnectedAt(logging.Handler):
    """Records when the Redis producer connected (its next step is the first read)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", None) == "redis.connected" and self.at is None:
            self.at = time.perf_counter()


def seed(db: Database, cipher: KwargsCipher, url: str, stream: str, watchers: int) -> None:
    def insert_rows(session: Any) -> None:
        for i in range(watchers):
            asset_id = session.execute(
                insert(Asset)
                .values(name=f"a{i}", uri=f"bench://a{i}", extra={})
                .returning(Asset.id)
            ).scalar_one()
            trigger = RedisStreamTrigger(stream=stream, group=GROUP, url=url, block_ms=1000)
            classpath, kwargs = trigger.serialize()
            tid = trigger_rows.add_trigger_row(
                session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )

    db.call(insert_rows)


async def through_triggerer(url: str, db_url: str, messages: int, watchers: int) -> dict[str, Any]:
    db = Database(db_url)
    migrate(db.engine)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    connected = _ConnectedAt()
    producer_logger = logging.getLogger("producers.redis")
    producer_logger.addHandler(connected)
    producer_logger.setLevel(logging.INFO)
    expected = messages * watchers
    committed = 0
    all_committed = anyio.Event()

    def on_committed(result: BatchResult) -> None:
        nonlocal committed
        committed += result.asset_events
        if committed >= expected:
            all_committed.set()

    client = redis_asyncio.Redis.from_url(url)
    stream = ""
    try:
        stream = await new_stream(client, messages)
        seed(db, cipher, url, stream, watchers)
        settings = TriggererSettings(
            capacity=100,
            heartbeat_s=5,
            claim_idle_interval_s=0.05,
            cohort_grace_period_s=COHORT_GRACE_S,
        )
        triggerer = Triggerer(db=db, cipher=cipher, settings=settings, on_committed=on_committed)
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await all_committed.wait()
            while not await all_acked(client, stream):  # noqa: ASYNC110 - polls the server
                await anyio.sleep(0.01)
            finished = time.perf_counter()
            triggerer.shutdown()
        assert committed == expected, f"{committed} asset events, expected {expected}"
        assert connected.at is not None
        seconds = finished - connected.at
        return {
            "watchers": watchers,
            "seconds": seconds,
            "msgs_per_s": messages / seconds,
            "events_per_s": expected / seconds,
        }
    finally:
        producer_logger.removeHandler(connected)
        if stream:
            await client.delete(stream, f"{stream}:dead")
        await client.aclose()
        db.dispose()


def pg_database(admin_url: str) -> tuple[str, Any]:
    name = f"redis_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return f"{admin_url.rsplit('/', 1)[0]}/{name}", drop


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 1),
        "median": round(statistics.median(values), 1),
        "max": round(max(values), 1),
    }


async def _case(url: str, messages: int, backend: str, watchers: int, pg: str | None) -> Any:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            return await through_triggerer(url, f"sqlite:///{tmp}/q.db", messages, watchers)
    assert pg is not None
    db_url, drop = pg_database(pg)
    try:
        return await through_triggerer(url, db_url, messages, watchers)
    finally:
        drop()


async def run_all(url: str, messages: int, pg: str | None, repeat: int) -> dict[str, Any]:
    """Each case alternates with the bare loop ``repeat`` times (same load for both)."""
    backends = ["sqlite"] + (["postgres"] if pg else [])
    results: dict[str, Any] = {}
    for backend in backends:
        for watchers in (1, 10):
            bare, ours, events = [], [], []
            for _ in range(repeat):
                bare.append((await bare_loop(url, messages))["msgs_per_s"])
                fig = await _case(url, messages, backend, watchers, pg)
                ours.append(fig["msgs_per_s"])
                events.append(fig["events_per_s"])
            results[f"{backend}_n{watchers}"] = {
                "watchers": watchers,
                "msgs_per_s": _spread(ours),
                "events_per_s": _spread(events),
                "bare_msgs_per_s": _spread(bare),
                "ratio_of_medians": round(statistics.median(ours) / statistics.median(bare), 3),
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000, help="entries per case")
    parser.add_argument("--url", default="redis://127.0.0.1:6379/11", help="the Redis server")
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL (a db per case)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per figure")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    load = os.getloadavg()
    results = anyio.run(run_all, args.url, args.messages, args.pg, args.repeat)
    print(f"{args.messages} entries per case, Redis at {args.url}, x{args.repeat}")
    for name, fig in results.items():
        ours, bare, events = fig["msgs_per_s"], fig["bare_msgs_per_s"], fig["events_per_s"]
        print(
            f"{name:12s} {ours['median']:8.0f} msgs/s [{ours['min']:.0f}..{ours['max']:.0f}]  "
            f"{events['median']:8.0f} asset events/s   bare loop {bare['median']:.0f} "
            f"[{bare['min']:.0f}..{bare['max']:.0f}]  ratio {fig['ratio_of_medians']:.2f}"
        )
    out = Path(__file__).parent / "results" / "redis.json"
    machine = {"cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load]}
    document = {"messages": args.messages, "repetitions": args.repeat, "machine": machine}
    out.write_text(json.dumps({**document, **results}, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
