"""Airflow side of workload 4: defer -> fire -> resume cycle time.

Run by bench/compare_airflow.py with the Airflow venv's python; one JSON line on stdout.

Airflow's real components run on SQLite (a copy of the migrated template DB, default log
level INFO): ``airflow api-server`` (the Execution API the task processes talk to),
``airflow scheduler`` with its LocalExecutor, and ``airflow triggerer``. One run of
``bench_defer_loop`` is created; its task defers ``--cycles`` times on
``TimeDeltaTrigger(0)`` (the same task as bench/engine_bench.py's ``Loop``). Each cycle: the
task process exits after the deferral is written, the triggerer claims and fires the
trigger, the scheduler schedules the task instance again, the executor starts a fresh task
process that resumes it. Cycle time = (task end - task start, as stored) / cycles.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import time
from pathlib import Path

import common


def _ti(db: Path) -> tuple[str | None, str | None, str | None]:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "select state, start_date, end_date from task_instance where dag_id='bench_defer_loop'"
        ).fetchone()
    return (row[0], row[1], row[2]) if row else (None, None, None)


def _create_run() -> None:
    from airflow.models.dag import DagModel
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.sdk import timezone
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagModel).values(is_paused=False))
        dag = SerializedDagModel.get_dag("bench_defer_loop", session=session)
        now = timezone.utcnow()
        dag.create_dagrun(
            run_id="bench",
            logical_date=now,
            data_interval=(now, now),
            run_after=now,
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.TEST,
            state=DagRunState.QUEUED,
            session=session,
        )


def run(template: Path, cycles: int) -> dict[str, float]:
    port = common.free_port()
    extra = {**common.stack_env(port, 4), "BENCH_CYCLES": str(cycles)}
    home = common.prepare_home(template, "INFO", extra)
    db = home / "airflow.db"
    procs = [
        common.start(["api-server", "--port", str(port)], home, "api-server"),
        common.start(["scheduler"], home, "scheduler"),
        common.start(["triggerer"], home, "triggerer"),
    ]
    try:
        common.wait_for(lambda: common.api_healthy(port), 180, "the api-server", 0.2)
        time.sleep(2.0)  # the scheduler and triggerer are up too before the run exists
        _create_run()
        common.wait_for(lambda: _ti(db)[0] in ("success", "failed"), 120 + 30 * cycles, "the task")
        state, start, end = _ti(db)
    finally:
        for proc in reversed(procs):
            common.stop(proc)
    if state != "success":
        raise RuntimeError(f"the defer loop task ended {state}; logs kept in {home}")
    from datetime import datetime

    seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    common.remove_home(home)
    return {"cycles": cycles, "cycle_ms": seconds * 1000 / cycles, "log_level": "INFO"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--cycles", type=int, default=10)
    args = parser.parse_args()
    common.exit_on_signal()
    fig = run(args.template, args.cycles)
    print(json.dumps({"system": "airflow", "workload": "cycle", **fig}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
