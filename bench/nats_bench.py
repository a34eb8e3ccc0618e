"""NATS JetStream end-to-end throughput: watchers through the real triggerer vs a bare loop.

Run by hand (never in tests):  .venv/bin/python bench/nats_bench.py [--messages 2000]
                                   [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]
                                   [--servers nats://127.0.0.1:4222]

The machine's nats-server with JetStream (``../shared/SERVICES.md``). Each case publishes M
messages into a fresh stream (deleted afterwards), then drains it:

* bare: one nats-py loop on a durable pull consumer (explicit ack), ``fetch(256)`` + ``ack``
  of each + one ``flush`` per batch, from the first fetch until M messages are acked: what
  the broker allows.
* sluice N=1 / N=10: N ``NatsJetStreamTrigger`` watchers (no filter) on the stream, run by
  the real ``Triggerer`` in-process on SQLite (and PostgreSQL with ``--pg``), from the
  producer's connection (the group starts after a 0.5 s cohort grace, so all N watchers
  see every message) until all M x N asset events are committed and the consumer has no
  message pending nor unacked.

Figures: messages/s (M / seconds) and asset events/s, min / median / max of ``--repeat``
(>= 3) runs, each case alternating with the bare loop so both see the same load; the ratio
is of medians of the same run.
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
import nats
from cryptography.fernet import Fernet
from nats.js.api import ConsumerConfig
from sqlalchemy import create_engine, insert, text

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetWatcher
from engine.db.queries import triggers as trigger_rows
from engine.db.schema import migrate
from engine.states import TriggerKind
from engine.triggerer.triggerer import Triggerer, TriggererSettings
from producers import NatsJetStreamTrigger

if TYPE_CHECKING:
    from engine.triggerer.persister import BatchResult

COHORT_GRACE_S = 0.5
DURABLE = "bench"
PUBLISH_CHUNK = 200


# -- the broker -------------------------------------------------------------------------


async def new_stream(js: Any, messages: int) -> str:
    name = f"BENCH{uuid.uuid4().hex[:12]}"
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    for start in range(0, messages, PUBLISH_CHUNK):
        async with anyio.create_task_group() as tg:
            for n in range(start, min(messages, start + PUBLISH_CHUNK)):
                tg.start_soon(js.publish, f"{name}.x", json.dumps({"n": n}).encode())
    return name


async def consumer_drained(js: Any, stream: str) -> bool:
    info = await js.consumer_info(stream, DURABLE)
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


# -- the cases --------------------------------------------------------------------------


async def bare_loop(servers: str, messages: int) -> dict[str, float]:
    nc = await nats.connect(servers)
    js = nc.jetstream()
    stream = await new_stream(js, messages)
    try:
        await js.add_consumer(stream, ConsumerConfig(durable_name=DURABLE, ack_wait=30))
        subscription = await js.pull_subscribe_bind(DURABLE, stream=stream)
        started = time.perf_counter()
        acked = 0
        while acked < messages:
            try:
                batch = await subscription.fetch(256, timeout=1)
            except nats.errors.TimeoutError:
                continue
            for msg in batch:
                await msg.ack()
            await nc.flush()
            acked += len(batch)
        seconds = time.perf_counter() - started
    finally:
        await js.delete_stream(stream)
        await nc.close()
    return {"watchers": 0, "seconds": seconds, "msgs_per_s": messages / seconds}


class _ConnectedAt(logging.Handler):
    """Records when the NATS producer connected (its next step is the first fetch)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", None) == "nats.connected" and self.at is None:
            self.at = time.perf_counter()


def seed(db: Database, cipher: KwargsCipher, servers: str, stream: str, watchers: int) -> None:
    def insert_rows(session: Any) -> None:
        for i in range(watchers):
            asset_id = session.execute(
                insert(Asset)
                .values(name=f"a{i}", uri=f"bench://a{i}", extra={})
                .returning(Asset.id)
            ).scalar_one()
            trigger = NatsJetStreamTrigger(servers=servers, stream=stream, durable=DURABLE)
            classpath, kwargs = trigger.serialize()
            tid = trigger_rows.add_trigger_row(
                session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )

    db.call(insert_rows)


async def through_triggerer(
    servers: str, db_url: str, messages: int, watchers: int
) -> dict[str, float]:
    db = Database(db_url)
    migrate(db.engine)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    connected = _ConnectedAt()
    logging.getLogger("producers.nats").addHandler(connected)
    logging.getLogger("producers.nats").setLevel(logging.INFO)
    expected = messages * watchers
    committed = 0
    all_committed = anyio.Event()

    def on_committed(result: BatchResult) -> None:
        nonlocal committed
        committed += result.asset_events
        if committed >= expected:
            all_committed.set()

    nc = await nats.connect(servers)
    js = nc.jetstream()
    stream = await new_stream(js, messages)
    try:
        seed(db, cipher, servers, stream, watchers)
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
            while True:  # the last acks follow the last commit within milliseconds
                if await consumer_drained(js, stream):
                    break
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
        logging.getLogger("producers.nats").removeHandler(connected)
        await js.delete_stream(stream)
        await nc.close()
        db.dispose()


def pg_database(admin_url: str) -> tuple[str, Any]:
    name = f"nats_bench_{uuid.uuid4().hex[:8]}"
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


async def _case(servers: str, messages: int, backend: str, watchers: int, pg: str | None) -> Any:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            return await through_triggerer(servers, f"sqlite:///{tmp}/q.db", messages, watchers)
    assert pg is not None
    db_url, drop = pg_database(pg)
    try:
        return await through_triggerer(servers, db_url, messages, watchers)
    finally:
        drop()


async def run_all(
    servers: str, messages: int, pg: str | None, repeat: int
) -> dict[str, dict[str, Any]]:
    """Each case alternates with the bare loop ``repeat`` times (same load for both)."""
    backends = ["sqlite"] + (["postgres"] if pg else [])
    results: dict[str, dict[str, Any]] = {}
    for backend in backends:
        for watchers in (1, 10):
            bare, ours, events = [], [], []
            for _ in range(repeat):
                bare.append((await bare_loop(servers, messages))["msgs_per_s"])
                fig = await _case(servers, messages, backend, watchers, pg)
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
    parser.add_argument("--messages", type=int, default=2000, help="messages per case")
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL (a db per case)")
    parser.add_argument("--servers", default="nats://127.0.0.1:4222", help="nats-server -js")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per figure (>= 3)")
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3 (min/median/max of >= 3 runs)")
    load = os.getloadavg()
    results = anyio.run(run_all, args.servers, args.messages, args.pg, args.repeat)
    print(f"{args.messages} messages per case, nats-server at {args.servers}, x{args.repeat}")
    for name, fig in results.items():
        ours, bare, events = fig["msgs_per_s"], fig["bare_msgs_per_s"], fig["events_per_s"]
        print(
            f"{name:12s} {ours['median']:8.0f} msgs/s [{ours['min']:.0f}..{ours['max']:.0f}]  "
            f"{events['median']:8.0f} asset events/s   bare loop {bare['median']:.0f} "
            f"[{bare['min']:.0f}..{bare['max']:.0f}]  ratio {fig['ratio_of_medians']:.2f}"
        )
    out = Path(__file__).parent / "results" / "nats.json"
    machine = {"cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load]}
    document = {"messages": args.messages, "repetitions": args.repeat, "machine": machine}
    out.write_text(json.dumps({**document, **results}, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
