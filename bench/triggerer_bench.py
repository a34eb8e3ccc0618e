"""Triggerer figures: claim rate, RSS per idle trigger, idle CPU.

Run by hand (never in tests):  .venv/bin/python bench/triggerer_bench.py [--idle 100000]
                                   [--claim 20000] [--pg postgresql+psycopg://...]

* claim rate: N TimeDeltaTrigger rows (encrypted, one day ahead) are inserted, a Triggerer
  with capacity N starts, and the time from its first claim to N triggers running is measured
  (claim query + decrypt + import + construct + start the task).
* RSS per idle trigger: resident memory after N idle triggers run, minus before, over N.
* idle CPU: process CPU time over a 10 s window with N idle triggers, as % of one core.

Airflow's triggerer claims at most 50 triggers per ~1 s loop (reference 001), a baseline
shown for comparison; the side-by-side run against Airflow itself lives in
bench/compare_airflow.py.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
from cryptography.fernet import Fernet

from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.models import TriggerKind
from engine.db.schema import migrate
from engine.supervisor import tune_gc
from engine.triggerer.triggerer import Triggerer, TriggererSettings
from triggers import TimeDeltaTrigger

AIRFLOW_CLAIMS_PER_S = 50.0
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def seed(db: Database, cipher: KwargsCipher, n: int) -> None:
    """N deferred task instances, each waiting on its own TimeDeltaTrigger (one day ahead)."""
    from sqlalchemy import insert

    from engine.db.models import Dag, DagRun, TaskInstance, TaskState, Trigger

    classpath, kwargs = TimeDeltaTrigger(timedelta(days=1)).serialize()
    token = cipher.encrypt_kwargs(kwargs, owner=classpath)

    def chunk(session: Any, start: int, stop: int, run_id: int) -> None:
        now = models.utcnow()
        ids = (
            session.execute(
                insert(Trigger).returning(Trigger.id),
                [
                    {
                        "classpath": classpath,
                        "kwargs": token,
                        "kind": TriggerKind.TASK,
                        "created_date": now,
                    }
                    for _ in range(start, stop)
                ],
            )
            .scalars()
            .all()
        )
        session.execute(
            insert(TaskInstance),
            [
                {
                    "dag_run_id": run_id,
                    "dag_id": "bench",
                    "task_id": f"t{start + i}",
                    "state": TaskState.DEFERRED,
                    "trigger_id": tid,
                    "next_method": "resume",
                }
                for i, tid in enumerate(ids)
            ],
        )

    def make_run(session: Any) -> int:
        session.execute(insert(Dag).values(dag_id="bench", fileloc="bench.py"))
        return int(
            session.execute(
                insert(DagRun)
                .values(dag_id="bench", run_id="bench", run_type="manual")
                .returning(DagRun.id)
            ).scalar_one()
        )

    run_id = db.call(make_run)
    for start in range(0, n, 5000):
        stop = min(n, start + 5000)
        db.call(lambda s, a=start, b=stop: chunk(s, a, b, run_id))


async def run_triggerer(
    db: Database, cipher: KwargsCipher, n: int, idle_s: float
) -> dict[str, float]:
    settings = TriggererSettings(
        capacity=n,
        heartbeat_s=5,
        health_check_threshold_s=30,
        claim_idle_interval_s=0.2,
        cleanup_interval_s=3600,
    )
    triggerer = Triggerer(db=db, cipher=cipher, settings=settings)
    rss_before = rss_bytes()
    figures: dict[str, float] = {}
    async with anyio.create_task_group() as tg:
        started = time.perf_counter()
        await tg.start(triggerer.run)
        while True:  # poll: the figure includes the claim loop's own pace
            if len(triggerer.runner) >= n:
                break
            await anyio.sleep(0.01)
        claim_s = time.perf_counter() - started
        await anyio.sleep(1.0)  # let every trigger reach its sleep
        rss_after = rss_bytes()
        cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        await anyio.sleep(idle_s)
        cpu1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        triggerer.shutdown()
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    figures["triggers"] = n
    figures["claim_seconds"] = claim_s
    figures["claims_per_s"] = n / claim_s
    figures["rss_per_trigger_bytes"] = (rss_after - rss_before) / n
    figures["idle_cpu_percent"] = 100 * cpu / (wall1 - wall0)
    return figures


async def _claim_into_running(db: Database, cipher: KwargsCipher, n: int) -> dict[str, float]:
    settings = TriggererSettings(capacity=max(n, 1000), cleanup_interval_s=3600)  # defaults
    triggerer = Triggerer(db=db, cipher=cipher, settings=settings)
    async with anyio.create_task_group() as tg:
        await tg.start(triggerer.run)
        await anyio.sleep(2.0)  # up and idle, as Airflow's triggerer is in the comparison
        await anyio.to_thread.run_sync(seed, db, cipher, n)  # committed by "another process"
        committed = time.perf_counter()
        while True:  # poll, as the Airflow side polls its trigger log files
            if len(triggerer.runner) >= n:
                break
            await anyio.sleep(0.005)
        claim_s = time.perf_counter() - committed
        triggerer.shutdown()
    return {"triggers": n, "claim_seconds": claim_s, "claims_per_s": n / claim_s}


def claim_into_running(url: str, n: int) -> dict[str, float]:
    """Claim rate into a triggerer already running at its default settings: from the commit
    of N deferred tasks' triggers (nobody nudges it) to all N running."""
    tune_gc()  # as `sluice triggerer` does
    cipher = KwargsCipher(Fernet.generate_key().decode())
    db = Database(url)
    migrate(db.engine)
    try:
        return anyio.run(_claim_into_running, db, cipher, n)
    finally:
        db.dispose()


def measure(url: str, n: int, idle_s: float) -> dict[str, float]:
    tune_gc()  # as `sluice triggerer` does
    cipher = KwargsCipher(Fernet.generate_key().decode())
    db = Database(url)
    migrate(db.engine)
    seed(db, cipher, n)
    try:
        return anyio.run(run_triggerer, db, cipher, n, idle_s)
    finally:
        db.dispose()


def _in_subprocess(url: str, n: int, idle_s: float) -> dict[str, float]:
    """Each measurement in a fresh interpreter, so freed memory of one does not flatter the next."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", url, str(n), str(idle_s)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--idle", type=int, default=100_000, help="idle triggers for RSS/CPU")
    parser.add_argument("--claim", type=int, default=20_000, help="triggers for the claim rate")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--pg", default=None, help="also measure on this (empty) PostgreSQL db")
    parser.add_argument("--one", nargs=3, metavar=("URL", "N", "IDLE_S"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        url, n, idle_s = args.one
        print(json.dumps(measure(url, int(n), float(idle_s))))
        return
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite_claim"] = _in_subprocess(f"sqlite:///{tmp}/claim.db", args.claim, 1.0)
        results["sqlite_idle"] = _in_subprocess(
            f"sqlite:///{tmp}/idle.db", args.idle, args.idle_seconds
        )
    if args.pg:
        results["postgres_claim"] = _in_subprocess(args.pg, args.claim, 1.0)
    for name, fig in results.items():
        print(
            f"{name:16s} n={int(fig['triggers']):>7d}  claims/s={fig['claims_per_s']:>9.0f} "
            f"(x{fig['claims_per_s'] / AIRFLOW_CLAIMS_PER_S:.0f} Airflow's 50/s)  "
            f"rss/trigger={fig['rss_per_trigger_bytes'] / 1024:.2f} KiB  "
            f"idle cpu={fig['idle_cpu_percent']:.1f}%"
        )
    out = Path(__file__).parent / "results" / "triggerer.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
