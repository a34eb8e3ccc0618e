"""Sluice side of bench/compare_airflow.py's user-facing workloads, each on a fresh ``sluice run``.

Run through bench/compare_airflow_sluice.py (``event``, ``dagfiles``, ``runs``) with Sluice's
python; the Airflow side of each is bench/_airflow_side/{event,dagfiles,runs}.py. What a user
runs is measured: ``sluice db migrate`` then ``sluice run`` (every part in one process tree) on
a fresh SQLite home, the DAG files in a fresh folder, nothing of the engine imported into
this process but the run-creation call a user's ``sluice dags trigger`` makes.

* ``event``: one Kafka watcher asset on a fresh 1-partition topic of the broker the driver
  started; its DAG's one task notes ``time.time()`` as its body starts. One warm-up message
  (until its run's task has started: the consumer is assigned and the task runner warm), then
  ``--messages`` messages ``--interval`` s apart, each stamped just before it is sent;
  latency = task body start - send, p50 / p99.
* ``dagfiles``: bench/dag_files_bench.py's ``run_case`` on ``--files`` generated files (the
  same files the Airflow side writes, in Sluice's authoring API): first full parse, idle CPU.
* ``runs``: ``--runs`` manual runs of a one-task DAG, created back to back through
  ``engine.views.operations.trigger_dag`` (what ``sluice dags trigger`` calls), parallelism
  ``--parallelism``; runs/s = runs / (first trigger -> last run finished).

``event`` and ``runs`` also run on PostgreSQL (``database="postgres"``: a fresh database on
the local server, dropped afterwards), for Sluice alone: run this module itself,
``python bench/compare_airflow_user.py {event,runs} --database sqlite,postgres --reps 3``
(the event workload starts its own broker then), which prints median (min-max) over the
repetitions, alternating the databases, and writes bench/results/user_sluice.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dag_files_bench
from process_tree import stop

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

SLUICE = str(Path(sys.executable).with_name("sluice"))
STARTUP_TIMEOUT_S = 180.0
PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
RESULTS = Path(__file__).resolve().parent / "results"

EVENT_DAG = '''\
"""Bench: one Kafka watcher asset; the task notes when its body starts."""

import time

from engine import DAG, Asset, AssetWatcher, task
from producers import KafkaMessageTrigger


@task
def started():
    now = time.time()
    with open({stamps!r}, "a") as f:
        f.write(f"{{now}}\\n")


watched = Asset(
    "bench-kafka",
    watchers=[
        AssetWatcher(
            "w",
            KafkaMessageTrigger(
                topics=[{topic!r}],
                bootstrap_servers={bootstrap!r},
                group_id="bench-sluice",
                auto_offset_reset="earliest",
            ),
        )
    ],
)

with DAG("bench_event", schedule=watched):
    started()
'''

RUNS_DAG = '''\
"""Bench: a one-task DAG triggered by hand, many runs at once."""

from engine import DAG, task


@task
def noop():
    return None


with DAG("bench_runs", schedule=None, max_active_runs={runs}):
    noop()
'''


def _wait(condition: Callable[[], Any], timeout_s: float, what: str, engine: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if engine.poll() is not None:
            raise SystemExit(f"sluice run exited ({engine.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


def _query(db: Path | str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on the engine's database: a SQLite file, or a PostgreSQL URL (``?``
    placeholders either way)."""
    if isinstance(db, str):
        import psycopg

        try:
            url = db.replace("postgresql+psycopg://", "postgresql://")
            with psycopg.connect(url, connect_timeout=5) as conn:
                return list(conn.execute(sql.replace("?", "%s"), params).fetchall())
        except psycopg.Error:
            return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute(sql, params).fetchall()
    except sqlite3.Error:
        return []


@contextmanager
def _database(home: Path, database: str) -> Iterator[tuple[Path | str, str]]:
    """(what ``_query`` takes, the engine's URL): a SQLite file in ``home``, or a fresh
    database on the local PostgreSQL server, dropped afterwards."""
    if database == "sqlite":
        yield home / "sluice.db", f"sqlite:///{home / 'sluice.db'}"
        return
    from sqlalchemy import create_engine, text

    name = f"bench_user_{uuid.uuid4().hex[:12]}"
    server = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_SERVER.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url, url
    finally:
        with server.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        server.dispose()


@contextmanager
def sluice_run(
    dags: Path, extra: dict[str, str] | None = None, database: str = "sqlite"
) -> Iterator[tuple[Path | str, Any]]:
    """A fresh home and database, ``sluice db migrate``, ``sluice run`` on ``dags``; yields
    (db, process), ``db`` for ``_query``.

    Stopped with SIGTERM at the end (SIGKILL to its group after 60 s); the home is removed
    unless BENCH_KEEP_HOME is set.
    """
    home = Path(tempfile.mkdtemp(prefix="sluice-user-bench-"))
    with _database(home, database) as (db, url), _engine(home, dags, url, extra) as engine:
        yield db, engine


@contextmanager
def _engine(home: Path, dags: Path, url: str, extra: dict[str, str] | None) -> Iterator[Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE")}
    env |= {
        "SLUICE_HOME": str(home),
        "SLUICE__CORE__DAGS_FOLDER": str(dags),
        "SLUICE__CORE__SQL_ALCHEMY_CONN": url,
        "SLUICE__API__PORT": "0",
        **(extra or {}),
    }
    subprocess.run([SLUICE, "db", "migrate"], env=env, capture_output=True, check=True)
    log = (home / "engine.log").open("wb")
    engine = subprocess.Popen(
        [SLUICE, "run"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        yield engine
    finally:
        stop(engine)
        log.close()
        if not os.environ.get("BENCH_KEEP_HOME"):
            subprocess.run(["rm", "-rf", str(home)], check=False)


def _stamps(path: Path) -> list[float]:
    try:
        return [float(line) for line in path.read_text().split()]
    except (OSError, ValueError):
        return []


async def _send(bootstrap: str, topic: str, payloads: list[bytes], gap_s: float) -> list[float]:
    """Send each payload ``gap_s`` apart; the wall-clock time just before each send."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    sent = []
    try:
        for n, payload in enumerate(payloads):
            if n:
                await asyncio.sleep(gap_s)
            sent.append(time.time())
            await producer.send_and_wait(topic, payload)
    finally:
        await producer.stop()
    return sent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def event(
    bootstrap: str, topic: str, messages: int, interval_s: float, database: str = "sqlite"
) -> dict[str, Any]:
    """Kafka message sent -> the asset-scheduled DAG's task body running, ``messages`` times."""
    with tempfile.TemporaryDirectory(prefix="sluice-event-dags-") as tmp:
        dags = Path(tmp) / "dags"
        dags.mkdir()
        stamps = Path(tmp) / "stamps.txt"
        source = EVENT_DAG.format(stamps=str(stamps), topic=topic, bootstrap=bootstrap)
        (dags / "bench_event.py").write_text(source)
        with sluice_run(dags, database=database) as (db_path, engine):
            watching = "SELECT count(*) FROM asset_watcher"
            _wait(lambda: _query(db_path, watching) == [(1,)], STARTUP_TIMEOUT_S, "the DAG", engine)
            asyncio.run(_send(bootstrap, topic, [b'{"warm": 1}'], 0))
            _wait(lambda: len(_stamps(stamps)) >= 1, STARTUP_TIMEOUT_S, "the warm-up run", engine)
            time.sleep(2.0)  # the warm-up run finishes; nothing else in flight
            payloads = [b'{"n": %d}' % n for n in range(messages)]
            sent = asyncio.run(_send(bootstrap, topic, payloads, interval_s))
            _wait(lambda: len(_stamps(stamps)) >= messages + 1, 120, "every run", engine)
            time.sleep(1.0)  # a run too many (an event counted twice) would show here
            got = _stamps(stamps)[1:]
    if len(got) != messages:
        raise SystemExit(f"{len(got)} task starts for {messages} messages")
    lat = [(start - send) * 1000 for start, send in zip(got, sent, strict=True)]
    return {
        "p50_ms": statistics.median(lat),
        "p99_ms": percentile(lat, 0.99),
        "max_ms": max(lat),
        "messages": messages,
        "interval_s": interval_s,
        "database": database,
    }


def dagfiles(files: int, idle_s: float) -> dict[str, Any]:
    """First full parse and idle CPU of ``sluice run`` on ``files`` generated DAG files."""
    with tempfile.TemporaryDirectory(prefix="sluice-dagfiles-") as tmp:
        folder = Path(tmp)
        wanted = dag_files_bench._write_generated(folder, files)
        row = dag_files_bench.run_case(
            "generated", folder, lambda db: wanted <= dag_files_bench._dag_ids(db), idle_s
        )
    return {
        "files": files,
        "first_full_parse_s": row["first_full_parse_s"],
        "first_full_parse_cpu_s": row["first_full_parse_cpu_s"],
        "idle_cpu_cores": row["idle_cpu_cores"],
        "idle_window_s": row["idle_window_s"],
        "processes": row["engine_processes"],
        "measured": "sluice run (every engine part), from its start",
    }


def runs(count: int, parallelism: int, database: str = "sqlite") -> dict[str, Any]:
    """``count`` manual runs of a one-task DAG created back to back -> all finished."""
    with tempfile.TemporaryDirectory(prefix="sluice-runs-dags-") as tmp:
        dags = Path(tmp)
        (dags / "bench_runs.py").write_text(textwrap.dedent(RUNS_DAG.format(runs=count)))
        extra = {"SLUICE__CORE__PARALLELISM": str(parallelism)}
        with sluice_run(dags, extra, database) as (db_path, engine):
            parsed = "SELECT count(*) FROM dag WHERE dag_id = 'bench_runs'"
            _wait(lambda: _query(db_path, parsed) == [(1,)], STARTUP_TIMEOUT_S, "the DAG", engine)
            from engine.db.database import Database
            from engine.views import operations

            db = Database(db_path if isinstance(db_path, str) else f"sqlite:///{db_path}")
            base = datetime.now(UTC)
            started = time.perf_counter()
            for n in range(count):
                db.call(
                    lambda s, n=n: operations.trigger_dag(
                        s,
                        "bench_runs",
                        conf=None,
                        logical_date=base - timedelta(seconds=count - n),
                        now=datetime.now(UTC),
                    )
                )
            created = time.perf_counter()
            done = "SELECT state, count(*) FROM dag_run WHERE dag_id = 'bench_runs' GROUP BY state"

            def finished() -> bool:
                states = dict(_query(db_path, done))
                return states.get("success", 0) + states.get("failed", 0) >= count

            _wait(finished, 60 + count, "every run to finish", engine)
            ended = time.perf_counter()
            states = dict(_query(db_path, done))
            db.dispose()
    if states.get("success", 0) != count:
        raise SystemExit(f"runs ended {states}, not {count} successes")
    return {
        "runs": count,
        "parallelism": parallelism,
        "runs_per_s": count / (ended - started),
        "trigger_s": created - started,
        "total_s": ended - started,
        "database": database,
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    """Sluice alone, on SQLite and PostgreSQL: event -> task start, or run throughput."""
    parser = argparse.ArgumentParser(description=(main.__doc__ or "").splitlines()[0])
    parser.add_argument("workload", choices=("event", "runs"))
    parser.add_argument("--database", default="sqlite,postgres", help="sqlite, postgres")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20, help="event: messages")
    parser.add_argument("--interval", type=float, default=1.0, help="event: seconds apart")
    parser.add_argument("--runs", type=int, default=1000, help="runs: how many")
    parser.add_argument("--parallelism", type=int, default=8)
    parser.add_argument("--out", default=str(RESULTS / "user_sluice.json"))
    args = parser.parse_args()
    databases = args.database.split(",")
    print(f"load average at start: {os.getloadavg()}", flush=True)
    broker = None
    if args.workload == "event":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.services_kafka import start_tansu

        broker = start_tansu(Path(tempfile.mkdtemp(prefix="user-bench-broker-")) / "tansu.log")
    rows: dict[str, list[dict[str, Any]]] = {db: [] for db in databases}
    try:
        for rep in range(1, args.reps + 1):
            for db in databases:
                if broker is not None:
                    topic = broker.create_topic(1, prefix=f"user-{db}")
                    fig = event(broker.bootstrap, topic, args.messages, args.interval, db)
                else:
                    fig = runs(args.runs, args.parallelism, db)
                rows[db].append(fig)
                print(f"rep {rep} {db}: {fig} (load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        if broker is not None:
            from tests.services_kafka import stop_tansu

            stop_tansu(broker.process)
    load_after = os.getloadavg()
    print(f"load average at end: {load_after}")
    keys = ("p50_ms", "p99_ms") if args.workload == "event" else ("runs_per_s",)
    summary = {db: {k: _spread([r[k] for r in rows[db]]) for k in keys} for db in databases}
    for db, figures in summary.items():
        text = ", ".join(
            f"{k} {f['median']:.1f} ({f['min']:.1f}-{f['max']:.1f})" for k, f in figures.items()
        )
        print(f"{args.workload} {db} ({args.reps} reps, median (min-max)): {text}")
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.exists() else {}
    previous["date_utc"] = datetime.now(UTC).isoformat(timespec="seconds")
    previous[args.workload] = {
        "date_utc": previous["date_utc"],
        "args": vars(args),
        "load_average_after": load_after,
        "summary": summary,
        "raw": rows,
    }
    out.write_text(json.dumps(previous, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
