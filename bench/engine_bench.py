"""Engine figures: flag file -> DAG run latency, and defer -> fire -> resume cycle time.

Run by hand (never in tests):  .venv/bin/python bench/engine_bench.py [--trials 30] [--cycles 20]

Both run the real engine parts in one process (DAG processor, scheduler, executor, triggerer:
``engine.supervisor.build_parts``, with their in-process wake-ups) on SQLite in a temporary
SLUICE_HOME.

1. flag file created -> DAG run row committed: a ``DirectoryFileDeleteTrigger`` watcher
   (poke_interval 0.05 s: on average half a cadence of the latency is the poll) and a
   ``DirectoryWatchTrigger`` watcher (inotify); p50 / p90 over ``--trials`` files.
2. defer -> fire -> resume: one task defers ``--cycles`` times on ``TimeDeltaTrigger(0)``;
   the cycle time is the task's wall time / cycles. Each cycle: the worker process exits
   after writing the deferral, the triggerer claims and fires the trigger, the persister
   resumes the task, the executor starts a fresh worker process that resumes it. The
   reference guide (001) quotes 300-1400 ms per cycle for Airflow.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from sqlalchemy import func, select

from engine.config import load_config
from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import runs
from engine.db.schema import migrate
from engine.db.views import dags as dags_view
from engine.supervisor import build_parts, tune_gc

DAG_FILE = """
from datetime import timedelta
from engine import DAG, Asset, AssetWatcher, BaseOperator, task
from triggers import DirectoryFileDeleteTrigger, DirectoryWatchTrigger, TimeDeltaTrigger

scan = Asset("scan", watchers=[AssetWatcher("w", DirectoryFileDeleteTrigger(
    directory={scan_dir!r}, filename="go.flag", poke_interval=0.05))])
watched = Asset("watched", watchers=[AssetWatcher("w", DirectoryWatchTrigger(
    directory={watch_dir!r}, pattern="*.flag", debounce_ms=5))])

@task
def noop():
    return None

with DAG("on_scan", schedule=scan):
    noop()

with DAG("on_watch", schedule=watched):
    noop()

class Loop(BaseOperator):
    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(timedelta(0)), method_name="again",
                   kwargs={{"left": {cycles} - 1}})

    def again(self, context, event=None, left=0):
        if left:
            self.defer(trigger=TimeDeltaTrigger(timedelta(0)), method_name="again",
                       kwargs={{"left": left - 1}})

with DAG("defer_loop", schedule=None):
    Loop(task_id="loop")
"""


def _run_count(db: Database, dag_id: str) -> int:
    return int(
        db.call(
            lambda s: s.execute(
                select(func.count()).select_from(DagRun).where(DagRun.dag_id == dag_id)
            ).scalar_one()
        )
    )


async def _wait_count(db: Database, dag_id: str, count: int) -> float:
    while True:
        if await anyio.to_thread.run_sync(_run_count, db, dag_id) >= count:
            return time.perf_counter()
        await anyio.sleep(0.002)


async def _flag_latency(db: Database, folder: Path, dag_id: str, trials: int) -> list[float]:
    latencies = []
    for n in range(trials):
        await anyio.sleep(0.3)  # let the previous run's task finish; spread the trials
        started = time.perf_counter()
        (folder / ("go.flag" if dag_id == "on_scan" else f"f{n}.flag")).touch()
        latencies.append((await _wait_count(db, dag_id, n + 1)) - started)
    return latencies


async def _cycle_time(db: Database, cycles: int) -> float:
    await db.run(
        lambda s: runs.create_run(s, "defer_loop", run_type=runs.MANUAL, now=models.utcnow())
    )

    def state(session: Any) -> tuple[str, Any, Any]:
        ti = session.execute(
            select(TaskInstance).where(TaskInstance.dag_id == "defer_loop")
        ).scalar_one()
        return ti.state, ti.start_date, ti.end_date

    while True:
        current, start, end = await db.run(state)
        if current in ("success", "failed"):
            break
        await anyio.sleep(0.05)
    if current != "success":
        raise RuntimeError("the defer loop task failed; see its log")
    return float((end - start).total_seconds()) / cycles


async def _main(home: Path, trials: int, cycles: int) -> dict[str, Any]:
    scan_dir, watch_dir, dags = home / "scan", home / "watch", home / "dags"
    for folder in (scan_dir, watch_dir, dags):
        folder.mkdir(parents=True)
    text = DAG_FILE.format(scan_dir=str(scan_dir), watch_dir=str(watch_dir), cycles=cycles)
    (dags / "bench.py").write_text(textwrap.dedent(text))
    config = load_config(environ={"SLUICE_HOME": str(home), "SLUICE__CORE__DAGS_FOLDER": str(dags)})
    tune_gc()  # the parts run as `sluice run` runs them
    db = Database(config.core.sql_alchemy_conn)
    migrate(db.engine)
    cipher = KwargsCipher.from_config("", home)
    names = ("dag-processor", "scheduler", "executor", "triggerer")
    parts = build_parts(config, names, db, cipher, {})
    results: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:
        for part in parts:
            await tg.start(part.run)
        while True:  # the DAG processor parsed the file
            if (await db.run(dags_view.list_dags))["total"] >= 3:
                break
            await anyio.sleep(0.05)
        await anyio.sleep(1.0)  # the watchers are claimed and polling
        for dag_id, folder in (("on_scan", scan_dir), ("on_watch", watch_dir)):
            lat = await _flag_latency(db, folder, dag_id, trials)
            results[dag_id] = {
                "p50_ms": statistics.median(lat) * 1000,
                "p90_ms": statistics.quantiles(lat, n=10)[-1] * 1000,
                "trials": trials,
            }
        results["defer_cycle_ms"] = await _cycle_time(db, cycles) * 1000
        results["cycles"] = cycles
        for part in reversed(parts):
            if part.shutdown is not None:
                part.shutdown()
        tg.cancel_scope.cancel()
    db.dispose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--cycles", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        results = anyio.run(_main, Path(tmp) / "home", args.trials, args.cycles)
    for dag_id, label in (("on_scan", "directory scan, poke 0.05 s"), ("on_watch", "inotify")):
        fig = results[dag_id]
        print(
            f"flag file -> DAG run row ({label}): p50 {fig['p50_ms']:.1f} ms, "
            f"p90 {fig['p90_ms']:.1f} ms over {fig['trials']} files"
        )
    print(
        f"defer -> fire -> resume: {results['defer_cycle_ms']:.1f} ms per cycle "
        f"({results['cycles']} cycles; Airflow: 300-1400 ms per the reference guide)"
    )
    out = Path(__file__).parent / "results" / "engine.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
