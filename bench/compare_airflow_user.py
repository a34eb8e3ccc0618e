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
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dag_files_bench

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

SLUICE = str(Path(sys.executable).with_name("sluice"))
STARTUP_TIMEOUT_S = 180.0

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


def _query(db_path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute(sql, params).fetchall()
    except sqlite3.Error:
        return []


@contextmanager
def sluice_run(dags: Path, extra: dict[str, str] | None = None) -> Iterator[tuple[Path, Any]]:
    """A fresh home, ``sluice db migrate``, ``sluice run`` on ``dags``; yields (db, process).

    Stopped with SIGTERM at the end (SIGKILL to its group after 60 s); the home is removed
    unless BENCH_KEEP_HOME is set.
    """
    home = Path(tempfile.mkdtemp(prefix="sluice-user-bench-"))
    db_path = home / "sluice.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE")}
    env |= {
        "SLUICE_HOME": str(home),
        "SLUICE__CORE__DAGS_FOLDER": str(dags),
        "SLUICE__CORE__SQL_ALCHEMY_CONN": f"sqlite:///{db_path}",
        "SLUICE__API__PORT": "0",
        **(extra or {}),
    }
    subprocess.run([SLUICE, "db", "migrate"], env=env, capture_output=True, check=True)
    log = (home / "engine.log").open("wb")
    engine = subprocess.Popen(
        [SLUICE, "run"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        yield db_path, engine
    finally:
        if engine.poll() is None:
            engine.send_signal(signal.SIGTERM)
            try:
                engine.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(engine.pid, signal.SIGKILL)
                engine.wait()
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


def event(bootstrap: str, topic: str, messages: int, interval_s: float) -> dict[str, Any]:
    """Kafka message sent -> the asset-scheduled DAG's task body running, ``messages`` times."""
    with tempfile.TemporaryDirectory(prefix="sluice-event-dags-") as tmp:
        dags = Path(tmp) / "dags"
        dags.mkdir()
        stamps = Path(tmp) / "stamps.txt"
        source = EVENT_DAG.format(stamps=str(stamps), topic=topic, bootstrap=bootstrap)
        (dags / "bench_event.py").write_text(source)
        with sluice_run(dags) as (db_path, engine):
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
        "database": "sqlite",
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


def runs(count: int, parallelism: int) -> dict[str, Any]:
    """``count`` manual runs of a one-task DAG created back to back -> all finished."""
    with tempfile.TemporaryDirectory(prefix="sluice-runs-dags-") as tmp:
        dags = Path(tmp)
        (dags / "bench_runs.py").write_text(textwrap.dedent(RUNS_DAG.format(runs=count)))
        extra = {"SLUICE__CORE__PARALLELISM": str(parallelism)}
        with sluice_run(dags, extra) as (db_path, engine):
            parsed = "SELECT count(*) FROM dag WHERE dag_id = 'bench_runs'"
            _wait(lambda: _query(db_path, parsed) == [(1,)], STARTUP_TIMEOUT_S, "the DAG", engine)
            from engine.db.database import Database
            from engine.views import operations

            db = Database(f"sqlite:///{db_path}")
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
    if states.get("success", 0) != count:
        raise SystemExit(f"runs ended {states}, not {count} successes")
    return {
        "runs": count,
        "parallelism": parallelism,
        "runs_per_s": count / (ended - started),
        "trigger_s": created - started,
        "total_s": ended - started,
        "database": "sqlite",
    }
