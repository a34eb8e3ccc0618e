"""Kafka backlog drain as a user meets it: a fresh engine process against a bare aiokafka consumer.

Run by hand (never in tests):
    .venv/bin/python bench/kafka_drain_bench.py [--messages M] [--reps R] [--watchers 1,10]
        [--backends sqlite,postgres] [--modes run,triggerer] [--pg URL] [--out FILE]
        [--sluice PATH]   # another checkout's engine, for a before/after
        [--before PATH]   # ... or both in one run: each repetition runs raw, before, this
        [--profile DIR]   # py-spy samples each engine over its drain (raw stacks, a file a run)

What a user does, and what this bench does likewise: a DAG file declares N assets, each with
one ``AssetWatcher`` on a ``KafkaMessageTrigger`` for the same topic, bootstrap servers and
group (so the triggerer runs ONE shared consumer for all of them, as
``dags/example_kafka_watchers.py`` shows), watcher j keeping the messages whose ``bucket``
field is j; and N DAGs, DAG j scheduled on asset j with one task. Every message thus becomes
exactly one asset event whatever N is, and every watcher filters every message.

The topic (4 partitions, fresh per N) holds M JSON messages (~100 B; default 100,000),
produced once. Each measured run starts a fresh engine process on a fresh database (a SQLite
file, or a database created on the PostgreSQL server of ``--pg`` and dropped after) with a
fresh consumer group:

* ``run``: ``sluice run``, every part in one process (the user's default);
* ``triggerer``: ``sluice triggerer`` alone in its process (a ``sluice dag-processor`` run
  beforehand stores the watchers, then stops).

The clock runs from the consumer's partition assignment (the engine's
``kafka.partitions_assigned`` log record, its own timestamp) to the moment this bench sees
every partition's committed offset at its end (read from the broker every
``COMMIT_POLL_S``); a commit follows the storing of its asset events, and the database is
then checked: M asset events, M distinct dedup keys (0 lost, 0 duplicated) or the run fails.
The engine's process tree CPU time over the same span is reported as cores used and as CPU
microseconds per message (which moves far less than the rate on a loaded machine).

The baseline is ``kafka_bench.raw_consume`` (a plain aiokafka consumer, getmany + a
per-partition commit of each batch, fresh group) on the same topic, alternating with the
measured run (raw, engine, raw, engine, ...) so both see the same load. Figures are
min / median / max of ``--reps`` (>= 3); the ratio is the median over the median of the same
run, and a case that lacks either side prints no ratio. The machine's load is printed at the
start and the end. Results: stdout and ``bench/results/kafka_drain.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import broker_harness
import kafka_bench
from aiokafka import AIOKafkaConsumer, TopicPartition
from process_tree import tree_cpu_s
from sqlalchemy import distinct, func, select

from engine.db.database import Database
from engine.db.models import AssetEvent, AssetWatcher, DagRun
from engine.db.schema import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.services_kafka import start_tansu, stop_tansu

if TYPE_CHECKING:
    from collections.abc import Iterator

PARTITIONS = kafka_bench.PARTITIONS
SLUICE = Path(sys.executable).parent / "sluice"
RESULTS = Path(__file__).resolve().parent / "results"
COMMIT_POLL_S = 0.02
ENGINE_READY_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 600.0
STOP_GRACE_S = 30.0

#: The DAG file a user would write: N assets with one Kafka watcher each on one shared
#: consumer, one DAG scheduled on each asset. Its parameters come from the environment.
DAG_FILE = '''\
"""Kafka drain bench: N watchers on one topic (one shared consumer), one DAG per asset."""

import os

from engine import DAG, Asset, AssetWatcher, task
from producers import KafkaMessageTrigger

WATCHERS = int(os.environ["DRAIN_WATCHERS"])
FAST_GROUP = {"session_timeout_ms": 1000, "heartbeat_interval_ms": 100,
              "rebalance_timeout_ms": 1000}


@task
def consume(triggering_asset_events=None):
    return None


for j in range(WATCHERS):
    trigger = KafkaMessageTrigger(
        topics=[os.environ["DRAIN_TOPIC"]],
        bootstrap_servers=os.environ["DRAIN_BOOTSTRAP"],
        group_id=os.environ["DRAIN_GROUP"],
        auto_offset_reset="earliest",
        value_format="json",
        match_fields={"bucket": j},
        **FAST_GROUP,
    )
    asset = Asset(f"drain-{j}", watchers=[AssetWatcher("kafka", trigger)])
    with DAG(f"drain_{j}", schedule=[asset]) as dag:
        consume()
    globals()[f"dag_{j}"] = dag
'''


# -- one engine ---------------------------------------------------------------------------------


@dataclass
class Engine:
    """A fresh engine home: its environment, DAG file, database and log."""

    home: Path
    db_url: str
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def prepare(cls, home: Path, db_url: str, params: dict[str, str]) -> Engine:
        """A home with the bench's DAG file; the schema migrated in ``db_url`` (by the engine
        command ``DRAIN_SLUICE`` of ``params`` when given, so an older one gets its own)."""
        dags = home / "dags"
        dags.mkdir(parents=True)
        (dags / "kafka_drain.py").write_text(DAG_FILE)
        env = {
            **os.environ,
            **params,
            "SLUICE_HOME": str(home),
            "SLUICE__CORE__SQL_ALCHEMY_CONN": db_url,
            "SLUICE__CORE__DAGS_FOLDER": str(dags),
            "SLUICE__API__PORT": "0",
            "SLUICE__LOGGING__FORMAT": "json",
            "SLUICE__LOGGING__LEVEL": "INFO",
        }
        if "DRAIN_SLUICE" in env:  # that engine's own schema (--before runs an older one)
            migrated = subprocess.run(
                [env["DRAIN_SLUICE"], "db", "migrate"], env=env, capture_output=True, check=False
            )
            if migrated.returncode != 0:
                raise RuntimeError(f"sluice db migrate failed: {migrated.stderr.decode()}")
        else:
            db = Database(db_url)
            try:
                migrate(db.engine)
            finally:
                db.dispose()
        return cls(home, db_url, env, home / "engine.log")

    def start(self, command: str) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [self.env["DRAIN_SLUICE"], command],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def check_alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"the engine exited ({self.process.returncode}); log tail:\n{tail}")

    def assigned_at(self, group: str) -> float | None:
        """The engine's timestamp of the first partition assignment of ``group``."""
        with contextlib.suppress(OSError), self.log.open() as lines:
            for line in lines:
                if '"kafka.partitions_assigned"' not in line:
                    continue
                record = json.loads(line)
                if record.get("group_id") == group:
                    return datetime.fromisoformat(record["ts"]).timestamp()
        return None

    def count_rows(self, model: Any, column: Any = None) -> int:
        db = Database(self.db_url)
        try:
            counted = func.count(distinct(column)) if column is not None else func.count()
            return db.call(lambda s: s.execute(select(counted).select_from(model)).scalar_one())
        finally:
            db.dispose()


def _wait_until(condition: Any, engine: Engine, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while (value := condition()) is None or value is False:
        engine.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(COMMIT_POLL_S)
    return value


async def _wait_all_committed(
    bootstrap: str, topic: str, group: str, per_partition: int, engine: Engine
) -> float:
    """When every partition's committed offset of ``group`` reached its end (``time.time()``),
    read every ``COMMIT_POLL_S`` through one consumer (one per poll cost this bench ~10% of a
    core, beside the engine it measures on a 2-core machine)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        pending = set(range(PARTITIONS))
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while True:
            for partition in sorted(pending):
                committed = await consumer.committed(TopicPartition(topic, partition))
                if committed is not None and committed >= per_partition:
                    pending.discard(partition)
            if not pending:
                return time.time()
            engine.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the last commit did not happen within {DRAIN_TIMEOUT_S:.0f} s")
            await anyio.sleep(COMMIT_POLL_S)
    finally:
        await consumer.stop()


@dataclass(frozen=True, slots=True)
class Drain:
    msgs_per_s: float
    cores: float
    runs: int  # DAG runs the engine created from the drained events (one per scheduler pass)


def _store_watchers(engine: Engine, watchers: int) -> None:
    """``sluice dag-processor`` until the N watchers are stored, then stopped."""
    engine.start("dag-processor")
    try:
        _wait_until(
            lambda: engine.count_rows(AssetWatcher) >= watchers or None,
            engine,
            ENGINE_READY_TIMEOUT_S,
            "storing the watchers",
        )
    finally:
        engine.stop()


def _profiler(
    pid: int, mode: str, db_url: str, group: str, folder: str
) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the engine's process tree into ``folder`` (raw stacks), or None."""
    if not folder:
        return None
    backend = db_url.split(":", 1)[0].split("+", 1)[0]
    out = Path(folder) / f"{mode}-{backend}-{group}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).parent / "py-spy")
    argv = [spy, "record", "-f", "raw", "-r", "100", "--subprocesses", "--threads", "-o", str(out)]
    return subprocess.Popen([*argv, "-p", str(pid)], stdout=subprocess.DEVNULL)


def drain(
    mode: str, db_url: str, home: Path, topic: str, watchers: int, args: Any, sluice: str
) -> Drain:
    """One fresh engine draining ``topic``; its rate from assignment to the last commit."""
    group = f"drain-{uuid.uuid4().hex[:8]}"
    params = {
        "DRAIN_BOOTSTRAP": args.bootstrap,
        "DRAIN_TOPIC": topic,
        "DRAIN_GROUP": group,
        "DRAIN_WATCHERS": str(watchers),
        "DRAIN_SLUICE": sluice,
    }
    engine = Engine.prepare(home, db_url, params)
    per_partition = args.messages // PARTITIONS
    if mode == "triggerer":
        _store_watchers(engine, watchers)
    engine.start("run" if mode == "run" else "triggerer")
    try:
        assert engine.process is not None
        assigned = _wait_until(
            lambda: engine.assigned_at(group), engine, ENGINE_READY_TIMEOUT_S, "assignment"
        )
        cpu_start = tree_cpu_s(engine.process.pid)
        spy = _profiler(engine.process.pid, mode, db_url, group, args.profile)
        done = anyio.run(_wait_all_committed, args.bootstrap, topic, group, per_partition, engine)
        cores = (tree_cpu_s(engine.process.pid) - cpu_start) / (done - assigned)
        if spy is not None:  # SIGINT: py-spy writes its samples and exits
            spy.send_signal(signal.SIGINT)
            spy.wait(STOP_GRACE_S)
    finally:
        engine.stop()
    if args.profile:  # the engine's log beside its profile
        shutil.copy(engine.log, Path(args.profile) / f"{mode}-{group}.log")
    stored = engine.count_rows(AssetEvent)
    distinct_keys = engine.count_rows(AssetEvent, AssetEvent.dedup_key)
    if stored != args.messages or distinct_keys != args.messages:
        raise RuntimeError(
            f"{stored} asset events ({distinct_keys} distinct keys) for {args.messages} messages"
        )
    return Drain(args.messages / (done - assigned), cores, engine.count_rows(DagRun))


@contextlib.contextmanager
def fresh_home(backend: str, pg: str, tmp: str) -> Iterator[tuple[str, Path]]:
    home = Path(tmp) / f"home-{uuid.uuid4().hex[:8]}"
    if backend == "sqlite":
        yield f"sqlite:///{home}/sluice.db", home
        return
    with broker_harness.postgres_database(pg, "drain") as url:
        yield url, home


def _spread(values: list[float], digits: int = 0) -> dict[str, float]:
    return {
        "min": round(min(values), digits),
        "median": round(statistics.median(values), digits),
        "max": round(max(values), digits),
    }


def case(
    mode: str, backend: str, watchers: int, topic: str, args: Any, tmp: str
) -> list[dict[str, Any]]:
    """``args.reps`` alternations of the bare consumer and a fresh engine on ``topic`` (with
    ``--before``: the bare consumer, the before engine and this one, in turn)."""
    raw: list[float] = []
    engines = [args.before, args.sluice] if args.before else [args.sluice]
    ours: dict[str, list[Drain]] = {sluice: [] for sluice in engines}
    for _ in range(args.reps):
        rate, _fetches = anyio.run(kafka_bench.raw_consume, args.bootstrap, topic, args.messages)
        raw.append(rate)
        for sluice in engines:
            with fresh_home(backend, args.pg, tmp) as (db_url, home):
                ours[sluice].append(drain(mode, db_url, home, topic, watchers, args, sluice))
    return [_row(mode, backend, watchers, args, sluice, ours[sluice], raw) for sluice in engines]


def _row(
    mode: str,
    backend: str,
    watchers: int,
    args: Any,
    sluice: str,
    drains: list[Drain],
    raw: list[float],
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "mode": mode,
        "database": backend,
        "watchers": watchers,
        "sluice": sluice,
        "role": "before" if sluice == args.before else "this",
        "messages": args.messages,
        "repetitions": args.reps,
        "msgs_per_s": _spread([d.msgs_per_s for d in drains]),
        "raw_aiokafka_per_s": _spread(raw),
        "engine_cores": _spread([d.cores for d in drains], 2),
        # CPU per message moves far less than the rate on a loaded machine
        "engine_cpu_us_per_msg": _spread([d.cores * 1e6 / d.msgs_per_s for d in drains]),
        "runs_per_s": [round(d.msgs_per_s) for d in drains],
        "dag_runs_created": [d.runs for d in drains],
        "raw_runs_per_s": [round(r) for r in raw],
    }
    if len(drains) == len(raw) == args.reps:  # a ratio only of what this run measured
        row["ratio_of_medians"] = round(
            statistics.median(d.msgs_per_s for d in drains) / statistics.median(raw), 4
        )
    return row


def _line(row: dict[str, Any]) -> str:
    ours, raw = row["msgs_per_s"], row["raw_aiokafka_per_s"]
    ratio = row.get("ratio_of_medians")
    return (
        f"{row['role']:6s} {row['mode']:9s} {row['database']:8s} N={row['watchers']:2d}: "
        f"{ours['median']:>8,.0f} msg/s [{ours['min']:,.0f}..{ours['max']:,.0f}]   "
        f"raw aiokafka {raw['median']:>9,.0f} [{raw['min']:,.0f}..{raw['max']:,.0f}]   "
        f"ratio {'not measured' if ratio is None else f'{ratio:.1%}'}   "
        f"engine cores {row['engine_cores']['median']:.2f}   "
        f"engine cpu {row['engine_cpu_us_per_msg']['median']:.0f} us/msg   "
        f"dag runs {row['dag_runs_created']}"
    )


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per figure (>= 3)")
    parser.add_argument("--watchers", default="1,10", help="comma-separated watcher counts")
    parser.add_argument("--backends", default="sqlite,postgres", help="sqlite, postgres")
    parser.add_argument("--modes", default="run,triggerer", help="run, triggerer")
    parser.add_argument("--pg", default=kafka_bench.DEFAULT_PG_URL, help="PostgreSQL admin URL")
    parser.add_argument(
        "--sluice", default=str(SLUICE), help="the engine command (another checkout's: before)"
    )
    parser.add_argument("--before", default="", help="an engine command run in turn with this")
    parser.add_argument("--out", default=str(RESULTS / "kafka_drain.json"))
    parser.add_argument("--profile", default="", help="a folder: py-spy samples each engine")
    args = parser.parse_args()
    if args.reps < 3:
        parser.error("--reps must be at least 3 (min/median/max of >= 3 runs)")
    if args.messages % PARTITIONS:
        parser.error(f"--messages must be a multiple of {PARTITIONS} (one share per partition)")
    return args


def main() -> None:
    args = _parse_args()
    watcher_counts = [int(n) for n in args.watchers.split(",")]
    load_before = os.getloadavg()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"load average at start {load_before[0]:.2f} {load_before[1]:.2f}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = start_tansu(Path(tmp) / "tansu.log")
        args.bootstrap = broker.bootstrap
        try:
            topics = {}
            for n in watcher_counts:
                topics[n] = broker.create_topic(PARTITIONS, prefix=f"drain{n}")
                rate = anyio.run(kafka_bench.produce, broker.bootstrap, topics[n], args.messages, n)
                print(f"produced {args.messages:,} messages for N={n} at {rate:,.0f}/s", flush=True)
            for mode in args.modes.split(","):
                for backend in args.backends.split(","):
                    for n in watcher_counts:
                        measured = case(mode, backend, n, topics[n], args, tmp)
                        rows.extend(measured)
                        for row in measured:
                            print(_line(row), flush=True)
        finally:
            stop_tansu(broker.process)
    load_after = os.getloadavg()
    machine = {
        "date_utc": started_at,
        "sluice": args.sluice,
        "before": args.before,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
    }
    out = Path(args.out)
    out.write_text(json.dumps({"machine": machine, "runs": rows}, indent=2) + "\n")
    print(f"load average at end {load_after[0]:.2f} {load_after[1]:.2f}")
    print(f"written {out}")


if __name__ == "__main__":
    main()
