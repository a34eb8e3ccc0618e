"""Time schedules: how late after its tick does a time run's row exist, with many DAGs.

Run by hand (never in tests):

    .venv/bin/python bench/schedule_bench.py [--dags 200] [--seconds 30] [--every 5]
    .venv/bin/python bench/schedule_bench.py --cron --seconds 150   # real cron ticks: minutes

The real DAG processor parses a DAG file of ``--dags`` DAGs, then the real scheduler runs
in-process against SQLite (or ``--pg URL``, in a fresh database it drops afterwards) with the
real clock for ``--seconds``. Every DAG is scheduled ``timedelta(seconds=--every)`` (Airflow 3:
a ``DeltaTriggerTimetable``; the run is due at its tick) or, with ``--cron``, ``* * * * *``.
For each run the scheduler created, latency = when the row was first visible to another
connection (polled every 10 ms) - its ``run_after`` (the tick). Reported: p50 / p90 / p99 /
max over all runs, and scheduler loops per second (how hard it polls while it waits). No
executor runs: the tasks are marked successful within 0.1 s (an instant executor: runs end,
as they would with workers; ``--no-finish`` leaves them scheduled, so running runs pile up),
and ``max_active_runs`` is high enough not to hold any DAG back.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import textwrap
import time
import uuid
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, select, text, update

from engine.config import load_config
from engine.crypto import KwargsCipher
from engine.dag_processing.processor import DagProcessor, DagProcessorSettings
from engine.db.database import Database
from engine.db.models import DagRun, TaskInstance
from engine.db.schema import migrate
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import TaskState

DAG_FILE = """
from datetime import datetime, timedelta
from engine import DAG, task

@task
def noop():
    return None

for i in range({dags}):
    with DAG(f"tick_{{i:04d}}", schedule={schedule}, start_date=datetime(2026, 1, 1),
             catchup=False, max_active_runs=10_000):
        noop()
"""


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _finish_scheduled(session: Any) -> None:
    session.execute(
        update(TaskInstance)
        .where(TaskInstance.state == TaskState.SCHEDULED)
        .values(state=TaskState.SUCCESS)
    )


def _new_runs(session: Any, after_id: int) -> list[tuple[int, datetime]]:
    rows = session.execute(
        select(DagRun.id, DagRun.run_after).where(DagRun.id > after_id).order_by(DagRun.id)
    )
    return [(int(i), a) for i, a in rows]


async def _run(
    db: Database, cipher: KwargsCipher, seconds: float, finish: bool, seen: dict[int, Any]
) -> Scheduler:
    """Run the scheduler; ``seen`` gets (run_after, wall time the row was first visible)."""
    scheduler = Scheduler(db=db, cipher=cipher, settings=SchedulerSettings())

    async def observe() -> None:
        last = 0
        while True:
            rows = await db.run(partial(_new_runs, after_id=last))
            at = datetime.now(UTC)
            for run_id, run_after in rows:
                seen[run_id] = (run_after, at)
                last = max(last, run_id)
            await anyio.sleep(0.01)

    async def instant_executor() -> None:
        while True:
            await db.run(_finish_scheduled)
            await anyio.sleep(0.1)

    async with anyio.create_task_group() as tg:
        await tg.start(scheduler.run)
        tg.start_soon(observe)
        if finish:
            tg.start_soon(instant_executor)
        await anyio.sleep(seconds)
        scheduler.shutdown()
        tg.cancel_scope.cancel()
    return scheduler


def _fresh_pg(admin_url: str) -> tuple[str, Any]:
    name = f"bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return f"{admin_url.rsplit('/', 1)[0]}/{name}", drop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dags", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--every", type=int, default=5, help="seconds between ticks")
    parser.add_argument("--cron", action="store_true", help="'* * * * *' instead")
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL (a fresh DB is used)")
    parser.add_argument(
        "--no-finish",
        action="store_true",
        help="leave tasks scheduled (by default they succeed within 0.1 s, so runs end)",
    )
    args = parser.parse_args()
    schedule = '"* * * * *"' if args.cron else f"timedelta(seconds={args.every})"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dags = root / "dags"
        dags.mkdir()
        (dags / "ticks.py").write_text(
            textwrap.dedent(DAG_FILE.format(dags=args.dags, schedule=schedule))
        )
        drop = None
        url = f"sqlite:///{root / 'sluice.db'}"
        if args.pg:
            url, drop = _fresh_pg(args.pg)
        try:
            db = Database(url)
            migrate(db.engine)
            cipher = KwargsCipher(Fernet.generate_key().decode())
            config = load_config(
                environ={"SLUICE_HOME": str(root / "home"), "SLUICE__CORE__DAGS_FOLDER": str(dags)}
            )
            processor = DagProcessor(
                db=db, cipher=cipher, settings=DagProcessorSettings.from_config(config)
            )
            anyio.run(processor.parse_once)
            started_at = datetime.now(UTC)
            started = time.monotonic()
            seen: dict[int, Any] = {}
            scheduler = anyio.run(_run, db, cipher, args.seconds, not args.no_finish, seen)
            elapsed = time.monotonic() - started
            rows = list(seen.values())
            db.dispose()
        finally:
            if drop is not None:
                drop()
    # The first run of each DAG is the latest past tick (catchup off): created at start-up,
    # not at a tick, so it says nothing about tick latency.
    latencies = sorted(
        (visible - after).total_seconds() * 1000 for after, visible in rows if after >= started_at
    )
    late_firsts = len(rows) - len(latencies)
    backend = "PostgreSQL" if args.pg else "SQLite"
    print(f"schedule_bench: {args.dags} DAGs on {schedule}, {backend}, {elapsed:.1f} s")
    print(
        f"  runs created: {len(rows)} ({late_firsts} first runs of the latest past tick left out)"
    )
    if latencies:
        print(
            "  tick -> run row (ms): "
            f"p50 {statistics.median(latencies):.1f}  p90 {_percentile(latencies, 0.9):.1f}  "
            f"p99 {_percentile(latencies, 0.99):.1f}  max {latencies[-1]:.1f}"
        )
    print(f"  scheduler loops: {scheduler.stats.loops} ({scheduler.stats.loops / elapsed:.1f}/s)")


if __name__ == "__main__":
    main()
