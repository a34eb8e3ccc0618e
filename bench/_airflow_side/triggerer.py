"""Airflow side of workload 3: claim rate and RSS per idle TimeDeltaTrigger.

Run by bench/compare_airflow.py with the Airflow venv's python; one JSON line on stdout.

* ``claim --triggers N``: Airflow's real ``airflow triggerer`` (two processes: the DB
  supervisor and the trigger-runner child) runs on SQLite with default settings
  (``capacity`` max(N, 1000), ``max_trigger_to_select_per_loop`` 50) and no work; then N deferred
  task instances, each with its own TimeDeltaTrigger (one day ahead), are committed at once.
  Claim time = from that commit to the N-th trigger running in the runner, which is when
  the supervisor opens that task instance's trigger log file (the trigger's first INFO line,
  "trigger ... starting"): the number of those files is polled.
* ``rss --triggers N``: the same at WARNING, with ``capacity`` = N and
  ``max_trigger_to_select_per_loop`` = N (at the default 50 per ~1 s loop, 100k triggers
  would take over half an hour to claim). RSS of both processes summed, before the rows
  are committed and once every row is claimed and the RSS stopped growing; per trigger =
  the difference / N.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import time
from pathlib import Path

import common


def _job_running(db: Path) -> bool:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "select count(*) from job where job_type='TriggererJob' and state='running'"
        ).fetchone()
    return bool(row and row[0])


def _claimed(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(
            conn.execute("select count(*) from trigger where triggerer_id is not null").fetchone()[
                0
            ]
        )


def _started_logs(home: Path) -> int:
    root = home / "logs" / "dag_id=bench_idle"
    if not root.exists():
        return 0
    return sum(1 for _ in root.rglob("*.trigger.*.log"))


def claim(template: Path, n: int) -> dict[str, float]:
    # Capacity as large as the workload (as on Sluice's side); the number taken per loop
    # stays Airflow's default.
    capacity = max(n, 1000)
    home = common.prepare_home(template, "INFO", {"AIRFLOW__TRIGGERER__CAPACITY": str(capacity)})
    db = home / "airflow.db"
    proc = common.start(["triggerer"], home, "triggerer")
    try:
        common.wait_for(lambda: _job_running(db), 120, "the triggerer job row")
        time.sleep(2.0)  # its runner child is up and syncing
        common.seed_deferred(n)
        committed = time.perf_counter()
        claimed = common.wait_for(lambda: _claimed(db) >= n, 600, f"{n} triggers claimed", 0.02)
        running = common.wait_for(lambda: _started_logs(home) >= n, 600, f"{n} running", 0.05)
    finally:
        common.stop(proc)
        common.remove_home(home)
    return {
        "triggers": n,
        "claim_seconds": running - committed,
        "claims_per_s": n / (running - committed),
        "assigned_seconds": claimed - committed,
        "capacity": capacity,
        "max_trigger_to_select_per_loop": 50,
        "log_level": "INFO",
    }


def rss(template: Path, n: int) -> dict[str, float]:
    extra = {
        "AIRFLOW__TRIGGERER__CAPACITY": str(n),
        "AIRFLOW__TRIGGERER__MAX_TRIGGER_TO_SELECT_PER_LOOP": str(n),
    }
    home = common.prepare_home(template, "WARNING", extra)
    db = home / "airflow.db"
    proc = common.start(["triggerer"], home, "triggerer")
    try:
        common.wait_for(lambda: _job_running(db), 120, "the triggerer job row")
        time.sleep(3.0)
        before = common.tree_rss(proc.pid)
        common.seed_deferred(n)
        committed = time.perf_counter()
        common.wait_for(lambda: _claimed(db) >= n, 1500, f"{n} triggers claimed", 1.0)
        last, stable_since = common.tree_rss(proc.pid), time.monotonic()
        while time.monotonic() - stable_since < 5.0:  # RSS flat for 5 s: every trigger runs
            time.sleep(0.5)
            now = common.tree_rss(proc.pid)
            if abs(now - last) > max(0.002 * last, 1 << 20):
                last, stable_since = now, time.monotonic()
        settled = time.perf_counter() - committed
        after = common.tree_rss(proc.pid)
    finally:
        common.stop(proc)
        common.remove_home(home)
    return {
        "triggers": n,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "rss_per_trigger_bytes": (after - before) / n,
        "seconds_to_settle": settled,
        "log_level": "WARNING",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("claim", "rss"))
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--triggers", type=int, required=True)
    args = parser.parse_args()
    common.exit_on_signal()
    fig = (claim if args.what == "claim" else rss)(args.template, args.triggers)
    print(json.dumps({"system": "airflow", "workload": args.what, **fig}), flush=True)
    os._exit(0)  # skip Airflow's atexit hooks (they can take seconds)


if __name__ == "__main__":
    main()
