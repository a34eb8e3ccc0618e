"""Airflow side of the runs workload: N manual runs of a one-task DAG -> all finished.

Run by bench/compare_airflow.py with the Airflow venv's python; one JSON line on stdout.

A whole Airflow on SQLite (a copy of the migrated template DB, log level INFO): api-server,
scheduler with its LocalExecutor at ``--parallelism``, dag-processor. One DAG file: a DAG of
one TaskFlow task, ``max_active_runs`` = N (as on the Sluice side; Airflow's default is 16).
Once it is parsed, N runs are created back to back through
``airflow.api.common.trigger_dag.trigger_dag`` (what ``airflow dags trigger`` and the REST
API call); runs/s = N / (first trigger -> last run finished). The same shape as
bench/compare_airflow_user.py's ``runs``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import common

DAG_FILE = '''\
"""Bench: a one-task DAG triggered by hand, many runs at once."""

from airflow.sdk import DAG, task


@task
def noop():
    return None


with DAG("bench_runs", schedule=None, catchup=False, max_active_runs={runs}):
    noop()
'''


def run(template: Path, count: int, parallelism: int) -> dict[str, float]:
    port = common.free_port()
    home = common.prepare_home(template, "INFO", common.stack_env(port, parallelism))
    os.environ.update(common.own_dags(home))
    (home / "dags").mkdir()
    (home / "dags" / "bench_runs.py").write_text(DAG_FILE.format(runs=count))
    db = home / "airflow.db"
    procs = [
        common.start(["api-server", "--port", str(port)], home, "api-server"),
        common.start(["scheduler"], home, "scheduler"),
        common.start(["dag-processor"], home, "dag-processor"),
    ]
    done = "SELECT state, count(*) FROM dag_run WHERE dag_id = 'bench_runs' GROUP BY state"
    try:
        common.wait_for(lambda: common.api_healthy(port), 180, "the api-server", 0.2)
        parsed = "SELECT count(*) FROM serialized_dag WHERE dag_id = 'bench_runs'"
        common.wait_for(lambda: common.db_rows(db, parsed) == [(1,)], 180, "the DAG parsed")
        from airflow.api.common.trigger_dag import trigger_dag
        from airflow.sdk import timezone
        from airflow.utils.types import DagRunTriggeredByType

        base = timezone.utcnow()
        started = time.perf_counter()
        for n in range(count):
            trigger_dag(
                "bench_runs",
                triggered_by=DagRunTriggeredByType.CLI,
                run_id=f"bench_{n}",
                logical_date=base - timedelta(seconds=count - n),
            )
        created = time.perf_counter()

        def finished() -> bool:
            states = dict(common.db_rows(db, done))
            return states.get("success", 0) + states.get("failed", 0) >= count

        common.wait_for(finished, 120 + 2 * count, "every run to finish", 0.05)
        ended = time.perf_counter()
        states = dict(common.db_rows(db, done))
    finally:
        for proc in reversed(procs):
            common.stop(proc)
    if states.get("success", 0) != count:
        raise RuntimeError(f"runs ended {states}, not {count} successes; logs in {home}")
    common.remove_home(home)
    return {
        "runs": count,
        "parallelism": parallelism,
        "runs_per_s": count / (ended - started),
        "trigger_s": created - started,
        "total_s": ended - started,
        "database": "sqlite",
        "log_level": "INFO",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--parallelism", type=int, default=8)
    args = parser.parse_args()
    common.exit_on_signal()
    fig = run(args.template, args.runs, args.parallelism)
    print(json.dumps({"system": "airflow", "workload": "runs", **fig}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
