"""Soak: steady Kafka traffic into a ``sluice run`` for a long time, RSS and database size sampled.

Run by hand (never in tests):
    .venv/bin/python bench/soak_bench.py [--minutes 60] [--rate 2000] [--watchers 1]
        [--sample-s 10] [--backend sqlite|postgres] [--pg URL] [--out FILE]

The engine is the drain bench's (``kafka_drain_bench.Engine``: the same DAG file, N assets
with a Kafka watcher each on one shared consumer, a DAG scheduled on each), started with
``sluice run`` on a fresh database. A producer in this process sends ``--rate`` JSON messages
a second (in 10 slices a second) for ``--minutes``; every ``--sample-s`` the bench records
the RSS of the engine process and of its whole tree (task processes included), the database
size (the SQLite file with its WAL, or ``pg_database_size``), the messages produced, the
asset events stored and the load average. At the end it waits for the backlog to drain and
checks that every message became exactly one asset event.

The figure is the engine process's RSS at the end against its RSS after the first minute
(the issue's target: within 10%), and the bytes of database per stored event. Results:
stdout and ``bench/results/soak.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import kafka_drain_bench as drain
from aiokafka import AIOKafkaProducer
from process_tree import PAGE_BYTES, tree_rss_bytes
from sqlalchemy import bindparam, create_engine, text

from engine.db.models import AssetEvent

RESULTS = Path(__file__).resolve().parent / "results"
SLICES_PER_S = 10
DRAIN_AFTER_TIMEOUT_S = 600.0
MIB = 1024 * 1024


def database_bytes(db_url: str) -> int:
    """The size of the database: the SQLite file and its WAL, or ``pg_database_size``."""
    if db_url.startswith("sqlite:///"):
        path = Path(db_url.removeprefix("sqlite:///"))
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
            )
    finally:
        engine.dispose()


#: The tables an asset event leaves rows in (the event, the runs it triggered, the queue).
EVENT_TABLES = ("asset_event", "dag_run_asset_event", "asset_event_queue")


def relation_bytes(db_url: str) -> dict[str, int]:
    """Bytes on disk of each table and index of ``EVENT_TABLES`` (SQLite's ``dbstat``;
    PostgreSQL's ``pg_relation_size``), to say what a stored event costs and where."""
    tables = bindparam("tables", expanding=True)
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            if db_url.startswith("sqlite"):
                rows = conn.execute(
                    text(
                        "SELECT d.name, sum(d.pgsize) FROM dbstat d JOIN sqlite_master m "
                        "ON m.name = d.name WHERE m.tbl_name IN :tables GROUP BY d.name"
                    ).bindparams(tables),
                    {"tables": list(EVENT_TABLES)},
                )
            else:
                rows = conn.execute(
                    text(
                        "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "LEFT JOIN pg_index i ON i.indexrelid = c.oid "
                        "LEFT JOIN pg_class t ON t.oid = i.indrelid "
                        "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i') "
                        "AND coalesce(t.relname, c.relname) IN :tables"
                    ).bindparams(tables),
                    {"tables": list(EVENT_TABLES)},
                )
            return {str(name): int(size) for name, size in rows}
    finally:
        engine.dispose()


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES


class Soak:
    """The producer and the sampler of one soak run."""

    def __init__(self, engine: drain.Engine, topic: str, args: argparse.Namespace) -> None:
        self.engine, self.topic, self.args = engine, topic, args
        self.produced = 0
        self.samples: list[dict[str, Any]] = []
        self.started = 0.0

    async def produce(self) -> None:
        """``--rate`` messages a second for ``--minutes``, in even slices."""
        args = self.args
        producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, linger_ms=5)
        await producer.start()
        per_slice = max(1, args.rate // SLICES_PER_S)
        pad = "x" * 60
        try:
            end = self.started + args.minutes * 60
            next_slice = time.monotonic()
            while time.monotonic() < end:
                futures = []
                for _ in range(per_slice):
                    n = self.produced
                    value = json.dumps({"n": n, "bucket": n % args.watchers, "pad": pad})
                    futures.append(
                        await producer.send(
                            self.topic, value=value.encode(), partition=n % drain.PARTITIONS
                        )
                    )
                    self.produced += 1
                for future in futures:
                    await future
                next_slice += 1 / SLICES_PER_S
                await anyio.sleep(max(0.0, next_slice - time.monotonic()))
        finally:
            await producer.stop()

    def sample(self) -> dict[str, Any]:
        assert self.engine.process is not None
        pid = self.engine.process.pid
        row = {
            "t_s": round(time.monotonic() - self.started, 1),
            "engine_rss_mib": round(rss_bytes(pid) / MIB, 1),
            "tree_rss_mib": round(tree_rss_bytes(pid) / MIB, 1),
            "db_mib": round(database_bytes(self.engine.db_url) / MIB, 1),
            "produced": self.produced,
            "stored": self.engine.count_rows(AssetEvent),
            "load1": round(os.getloadavg()[0], 2),
        }
        self.samples.append(row)
        print(
            f"t={row['t_s']:7.1f}s engine RSS {row['engine_rss_mib']:6.1f} MiB  tree "
            f"{row['tree_rss_mib']:6.1f} MiB  db {row['db_mib']:7.1f} MiB  produced "
            f"{row['produced']:>9,}  stored {row['stored']:>9,}  load {row['load1']}",
            flush=True,
        )
        return row

    async def sample_until_produced(self, producing: anyio.Event) -> None:
        while not producing.is_set():
            self.engine.check_alive()
            self.sample()
            with anyio.move_on_after(self.args.sample_s):
                await producing.wait()

    async def run(self) -> None:
        """Produce and sample; once produced, sample until every message is stored."""
        self.started = time.monotonic()
        produced = anyio.Event()

        async def producing() -> None:
            await self.produce()
            produced.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(producing)
            tg.start_soon(self.sample_until_produced, produced)
        with anyio.fail_after(DRAIN_AFTER_TIMEOUT_S):
            while self.sample()["stored"] < self.produced:
                self.engine.check_alive()
                await anyio.sleep(self.args.sample_s)


def summary(samples: list[dict[str, Any]], produced: int, stored: int) -> dict[str, Any]:
    """RSS after the first minute against the end, and the database bytes per event."""
    after_minute = next((s for s in samples if s["t_s"] >= 60), samples[-1])
    last = samples[-1]
    return {
        "engine_rss_after_first_minute_mib": after_minute["engine_rss_mib"],
        "engine_rss_at_end_mib": last["engine_rss_mib"],
        "engine_rss_end_vs_first_minute": round(
            last["engine_rss_mib"] / after_minute["engine_rss_mib"] - 1, 4
        ),
        "engine_rss_peak_mib": max(s["engine_rss_mib"] for s in samples),
        "db_bytes_per_event": round(last["db_mib"] * MIB / max(1, stored)),
        "produced": produced,
        "stored": stored,
    }


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=2000, help="messages a second")
    parser.add_argument("--watchers", type=int, default=1)
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg", default=drain.kafka_bench.DEFAULT_PG_URL)
    parser.add_argument("--sluice", default=str(drain.SLUICE), help="the engine command")
    parser.add_argument("--out", default=str(RESULTS / "soak.json"))
    return parser.parse_args()


def main() -> None:
    args = _parse_args()
    load_before = os.getloadavg()
    print(f"load average at start {load_before[0]:.2f} {load_before[1]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        broker = drain.start_tansu(Path(tmp) / "tansu.log")
        args.bootstrap = broker.bootstrap
        try:
            topic = broker.create_topic(drain.PARTITIONS, prefix="soak")
            with drain.fresh_home(args.backend, args.pg, tmp) as (db_url, home):
                params = {
                    "DRAIN_BOOTSTRAP": broker.bootstrap,
                    "DRAIN_TOPIC": topic,
                    "DRAIN_GROUP": f"soak-{uuid.uuid4().hex[:8]}",
                    "DRAIN_WATCHERS": str(args.watchers),
                    "DRAIN_SLUICE": args.sluice,
                }
                engine = drain.Engine.prepare(home, db_url, params)
                engine.start("run")
                try:
                    soak = Soak(engine, topic, args)
                    anyio.run(soak.run)
                finally:
                    engine.stop()
                stored = engine.count_rows(AssetEvent)
                distinct_keys = engine.count_rows(AssetEvent, AssetEvent.dedup_key)
                on_disk = relation_bytes(db_url)
        finally:
            drain.stop_tansu(broker.process)
    if stored != soak.produced or distinct_keys != soak.produced:
        raise SystemExit(f"{stored} asset events ({distinct_keys} keys) for {soak.produced}")
    load_after = os.getloadavg()
    result = {
        "settings": {k: v for k, v in vars(args).items() if k != "bootstrap"},
        "machine": {
            "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in load_after],
        },
        "summary": summary(soak.samples, soak.produced, stored),
        "bytes_per_event_by_relation": {
            name: round(size / max(1, stored), 1) for name, size in sorted(on_disk.items())
        },
        "samples": soak.samples,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    print("bytes on disk per stored event, by table and index:")
    for name, per_event in result["bytes_per_event_by_relation"].items():
        print(f"  {name:<45} {per_event:8.1f}")
    print(f"load average at end {load_after[0]:.2f} {load_after[1]:.2f}")
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
