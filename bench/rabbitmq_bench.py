"""RabbitMQ end-to-end throughput: watchers through the real triggerer vs a bare consume/ack loop.

Run by hand (never in tests):  .venv/bin/python bench/rabbitmq_bench.py [--messages 2000]
                                   [--url amqp://guest:guest@127.0.0.1:5672/]
                                   [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

The machine's RabbitMQ (default virtual host). Each case preloads M persistent JSON messages
into a fresh durable classic queue (deleted afterwards), then drains it:

* bare: one aio-pika consumer, prefetch 1000 (the trigger's default ``max_in_flight``),
  ``basic.ack`` of every message as it arrives, from the consume until M are acked: what
  the broker and client allow.
* sluice N=1 / N=10: N ``RabbitMQMessageTrigger`` watchers (no filter) on the queue, run by
  the real ``Triggerer`` in-process on SQLite (and PostgreSQL with ``--pg``), from the
  producer's connection (the group starts consuming after a 0.5 s cohort grace, so all N
  watchers see every message) until all M x N asset events are committed and all M
  deliveries are acked (the shared stream advanced past them: the acks are sent, as the
  bare loop's are).

Figures: messages/s (M / seconds) and asset events/s, min / median / max of ``--repeat``
(>= 3) runs, each case alternating with the bare loop so both see the same load; the ratio
is of medians of the same run. The machine is shared: the figures are noisy.
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

import aio_pika
import anyio
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, insert, text

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetWatcher
from engine.db.queries import triggers as trigger_rows
from engine.db.schema import migrate
from engine.states import TriggerKind
from engine.triggerer.triggerer import Triggerer, TriggererSettings
from producers import RabbitMQMessageTrigger

if TYPE_CHECKING:
    from engine.triggerer.persister import BatchResult

COHORT_GRACE_S = 0.5
PREFETCH = 1000


# -- the broker -------------------------------------------------------------------------


async def new_queue(url: str, messages: int) -> str:
    """A fresh durable queue holding ``messages`` persistent JSON messages."""
    name = f"bench-{uuid.uuid4().hex[:12]}"
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel(publisher_confirms=False)
        await channel.declare_queue(name, durable=True)
        for n in range(messages):
            body = json.dumps({"n": n}).encode()
            message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await channel.default_exchange.publish(message, routing_key=name)
        while True:  # the broker counts what it took in within milliseconds
            if await _ready(channel, name) >= messages:
                break
            await anyio.sleep(0.01)
    return name


async def _ready(channel: aio_pika.abc.AbstractChannel, name: str) -> int:
    declared = await channel.declare_queue(name, passive=True)
    return int(declared.declaration_result.message_count or 0)


async def delete_queue(url: str, name: str) -> None:
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel()
        await channel.queue_delete(name)


# -- the cases --------------------------------------------------------------------------


async def bare_loop(url: str, messages: int) -> dict[str, float]:
    name = await new_queue(url, messages)
    try:
        async with await aio_pika.connect(url) as connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=PREFETCH)
            queue = await channel.get_queue(name)
            acked = 0
            started = time.perf_counter()
            async with queue.iterator() as deliveries:
                async for message in deliveries:
                    await message.ack()
                    acked += 1
                    if acked == messages:
                        break
            seconds = time.perf_counter() - started
    finally:
        await delete_queue(url, name)
    return {"watchers": 0, "seconds": seconds, "msgs_per_s": messages / seconds}


class _ConnectedAt(logging.Handler):
    """Records when the RabbitMQ producer connected (it consumes from then on)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", None) == "rabbitmq.connected" and self.at is None:
            self.at = time.perf_counter()


def seed(db: Database, cipher: KwargsCipher, url: str, queue: str, watchers: int) -> None:
    def insert_rows(session: Any) -> None:
        for i in range(watchers):
            asset_id = session.execute(
                insert(Asset)
                .values(name=f"a{i}", uri=f"bench://a{i}", extra={})
                .returning(Asset.id)
            ).scalar_one()
            classpath, kwargs = RabbitMQMessageTrigger(url=url, queue=queue).serialize()
            tid = trigger_rows.add_trigger_row(
                session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )

    db.call(insert_rows)


async def through_triggerer(
    url: str, db_url: str, messages: int, watchers: int
) -> dict[str, float]:
    db = Database(db_url)
    migrate(db.engine)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    connected = _ConnectedAt()
    producer_logger = logging.getLogger("producers.rabbitmq")
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

    name = await new_queue(url, messages)
    try:
        seed(db, cipher, url, name, watchers)
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
            streams = triggerer.shared_streams
            while True:  # the last acks follow the last commit within milliseconds
                if sum(s.advanced_events for s in streams.stats()) >= messages:
                    break
                await anyio.sleep(0.005)
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
        db.dispose()
        await delete_queue(url, name)


def pg_database(admin_url: str) -> tuple[str, Any]:
    name = f"rabbitmq_bench_{uuid.uuid4().hex[:8]}"
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
    results: dict[str, dict[str, Any]] = {}
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
    parser.add_argument("--messages", type=int, default=2000, help="messages per case")
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/", help="broker")
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL (a db per case)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per figure (>= 3)")
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3 (min/median/max of >= 3 runs)")
    load = os.getloadavg()
    results = anyio.run(run_all, args.url, args.messages, args.pg, args.repeat)
    print(f"{args.messages} messages per case, RabbitMQ (machine's), x{args.repeat}")
    for name, fig in results.items():
        ours, bare, events = fig["msgs_per_s"], fig["bare_msgs_per_s"], fig["events_per_s"]
        print(
            f"{name:12s} {ours['median']:8.0f} msgs/s [{ours['min']:.0f}..{ours['max']:.0f}]  "
            f"{events['median']:8.0f} asset events/s   bare loop {bare['median']:.0f} "
            f"[{bare['min']:.0f}..{bare['max']:.0f}]  ratio {fig['ratio_of_medians']:.2f}"
        )
    out = Path(__file__).parent / "results" / "rabbitmq.json"
    machine = {"cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load]}
    document = {"messages": args.messages, "repetitions": args.repeat, "machine": machine}
    out.write_text(json.dumps({**document, **results}, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
