"""Celery executor vs local executor: task throughput and task start latency, same run.

Run by hand (never in tests):

    .venv/bin/python bench/celery_bench.py [--tasks 100] [--chain 20] [--slots 8] [--reps 3]
        [--broker redis://127.0.0.1:6379/9 | amqp://guest:guest@127.0.0.1:5672//]

Each repetition runs, for each executor in turn (local, celery, local, celery, ...: the
machine's load drifts, alternation spreads it evenly), a fresh ``sluice run`` on a fresh
SQLite home; with ``celery``, ``[executor] kind = "celery"`` and one ``sluice celery worker
--concurrency --slots``; with ``local``, ``[core] parallelism = --slots``. Two DAGs:

- ``wide``: ``--tasks`` independent tasks in one run. Throughput = tasks / (last task end -
  run start), in tasks/s.
- ``chain``: ``--chain`` tasks one after the other. Start latency of a task = its start (the
  try marked running) - its upstream's end: scheduler + executor (+ broker and worker) per
  hop, with free slots. Reported: the p50 over the chain's hops.

Printed: min / median / max over the repetitions of both figures, per executor, and the
load average at start and end.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select

from engine.db.database import Database
from engine.db.models import Dag, DagRun, TaskInstance

SLUICE = str(Path(sys.executable).with_name("sluice"))

DAGS = """
from engine import DAG, task


@task
def noop():
    return None


with DAG("wide", schedule=None, max_active_tasks=10_000):
    for i in range({tasks}):
        noop.override(task_id=f"t{{i:04d}}")()

with DAG("chain", schedule=None):
    previous = None
    for i in range({chain}):
        current = noop.override(task_id=f"c{{i:04d}}")()
        if previous is not None:
            previous >> current
        previous = current
"""


def _wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([SLUICE, *args], env=env, stdout=out, stderr=subprocess.STDOUT)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _trigger_and_wait(env: dict[str, str], db: Database, dag_id: str) -> str:
    out = subprocess.run(
        [SLUICE, "dags", "trigger", dag_id], env=env, capture_output=True, text=True, check=True
    )
    run_id = out.stdout.strip().rsplit(": ", 1)[1]
    query = select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)

    def ended() -> str | None:
        state = db.call(lambda s: s.execute(query).scalar_one())
        return state if state in ("success", "failed") else None

    state = _wait(ended, 600, f"run of {dag_id}")
    if state != "success":
        raise SystemExit(f"the {dag_id} run failed")
    return run_id


def _figures(db: Database) -> tuple[float, float]:
    def read(session: Any) -> tuple[Any, list[Any], list[Any]]:
        run_start = session.execute(
            select(DagRun.start_date).where(DagRun.dag_id == "wide")
        ).scalar_one()
        wide = session.execute(
            select(TaskInstance.end_date).where(TaskInstance.dag_id == "wide")
        ).all()
        chain = session.execute(
            select(TaskInstance.task_id, TaskInstance.start_date, TaskInstance.end_date)
            .where(TaskInstance.dag_id == "chain")
            .order_by(TaskInstance.task_id)
        ).all()
        return run_start, wide, chain

    run_start, wide, chain = db.call(read)
    span_s = (max(end for (end,) in wide) - run_start).total_seconds()
    hops = [(chain[i][1] - chain[i - 1][2]).total_seconds() * 1000 for i in range(1, len(chain))]
    return len(wide) / span_s, statistics.median(hops)


def one_run(kind: str, args: argparse.Namespace) -> tuple[float, float]:
    root = Path(tempfile.mkdtemp(prefix=f"celery-bench-{kind}-"))
    home, dags = root / "home", root / "dags"
    home.mkdir()
    dags.mkdir()
    (dags / "bench.py").write_text(textwrap.dedent(DAGS.format(tasks=args.tasks, chain=args.chain)))
    url = f"sqlite:///{home}/sluice.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE")}
    env |= {
        "SLUICE_HOME": str(home),
        "SLUICE__CORE__DAGS_FOLDER": str(dags),
        "SLUICE__CORE__SQL_ALCHEMY_CONN": url,
        "SLUICE__CORE__PARALLELISM": str(args.slots),
        "SLUICE__API__PORT": "0",
        "SLUICE__EXECUTOR__KIND": kind,
        "SLUICE__CELERY__BROKER_URL": args.broker,
        "SLUICE__CELERY__DEFAULT_QUEUE": f"bench-{uuid.uuid4().hex[:8]}",
    }
    subprocess.run([SLUICE, "db", "migrate"], env=env, capture_output=True, check=True)
    procs = [_start(["run"], env, root / "engine.log")]
    db = Database(url)
    try:
        if kind == "celery":
            worker = ["celery", "worker", "-c", str(args.slots)]
            procs.append(_start(worker, env, root / "worker.log"))
            _wait(lambda: " ready." in (root / "worker.log").read_text(), 60, "the worker")
        names = select(Dag.dag_id)
        _wait(
            lambda: {"wide", "chain"} <= set(db.call(lambda s: s.execute(names).scalars().all())),
            60,
            "the DAGs to be parsed",
        )
        _trigger_and_wait(env, db, "wide")
        _trigger_and_wait(env, db, "chain")
        return _figures(db)
    finally:
        _stop(procs)
        db.dispose()
        _forget_queue(args.broker, env["SLUICE__CELERY__DEFAULT_QUEUE"])


def _forget_queue(broker: str, queue: str) -> None:
    """Leave nothing of the run's queue in a Redis database."""
    if broker.startswith("redis://"):
        import redis

        client = redis.Redis.from_url(broker)
        keys = list(client.scan_iter(match=f"*{queue}*"))
        if keys:
            client.delete(*keys)
        client.close()


def _summary(values: list[float]) -> str:
    return f"{min(values):8.1f} {statistics.median(values):8.1f} {max(values):8.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--chain", type=int, default=20)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/9")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    results: dict[str, list[tuple[float, float]]] = {"local": [], "celery": []}
    for rep in range(args.reps):
        for kind in ("local", "celery"):
            rate, latency = one_run(kind, args)
            results[kind].append((rate, latency))
            print(
                f"rep {rep + 1} {kind:6}: {rate:7.1f} tasks/s, start latency p50 {latency:6.1f} ms"
            )
    print(f"load average at end: {os.getloadavg()}")
    print(f"\n{args.tasks} tasks, {args.slots} slots, broker {args.broker.split('@')[-1]}")
    print(f"{'':24}{'min':>8} {'median':>8} {'max':>8}")
    for kind, rows in results.items():
        print(f"{kind:6} tasks/s          {_summary([r for r, _ in rows])}")
        print(f"{kind:6} start p50 (ms)   {_summary([lat for _, lat in rows])}")


if __name__ == "__main__":
    main()
