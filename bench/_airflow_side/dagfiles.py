"""Airflow side of the dagfiles workload: N small DAG files, first full parse and idle CPU.

Run by bench/compare_airflow.py with the Airflow venv's python; one JSON line on stdout.

``airflow dag-processor`` (Airflow's default settings: 2 parsing processes,
``min_file_process_interval`` 30 s, log level INFO) on a copy of the migrated template DB,
its DAGs folder holding ``--files`` generated files: one DAG of 3 TaskFlow tasks each, the
same DAGs as bench/dag_files_bench.py writes for Sluice, in Airflow's authoring API. The
first full parse is timed from the dag-processor's start until every DAG has its serialized
row; then, 5 s later, the CPU of its whole process tree over ``--idle`` seconds (no file
changed, nothing scheduled), read from /proc as bench/dag_files_bench.py does for Sluice.
Only the dag-processor runs, where the Sluice side is a whole ``sluice run``: the Sluice
figure carries its other parts (scheduler, executor, triggerer, API) besides.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import common

sys.path.insert(0, str(common.HERE.parent))  # bench/: dag_files_bench's stdlib /proc readers

import dag_files_bench

DAG_FILE = """\
from airflow.sdk import DAG, task


@task
def extract():
    return {{"n": {n}}}


@task
def transform(data):
    return data["n"] * 2


@task
def load(value):
    print(value)


with DAG("bench_{n:04d}", schedule=None):
    load(transform(extract()))
"""


def run(template: Path, files: int, idle_s: float) -> dict[str, float]:
    home = common.prepare_home(template, "INFO")
    os.environ.update(common.own_dags(home))
    (home / "dags").mkdir()
    for n in range(files):
        (home / "dags" / f"bench_{n:04d}.py").write_text(DAG_FILE.format(n=n))
    db = home / "airflow.db"
    parsed = "SELECT count(*) FROM serialized_dag WHERE dag_id GLOB 'bench_[0-9][0-9][0-9][0-9]'"
    started = time.monotonic()
    proc = common.start(["dag-processor"], home, "dag-processor")
    try:
        common.wait_for(lambda: common.db_rows(db, parsed) == [(files,)], 600, "every DAG")
        parse_s = time.monotonic() - started
        parse_cpu_s = dag_files_bench._tree_cpu_s(proc.pid)
        time.sleep(5.0)  # as on the Sluice side: the first pass's follow-ups settle
        cpu_before, t_before = dag_files_bench._tree_cpu_s(proc.pid), time.monotonic()
        time.sleep(idle_s)
        cpu_after, t_after = dag_files_bench._tree_cpu_s(proc.pid), time.monotonic()
        if proc.poll() is not None:
            raise RuntimeError(f"the dag-processor exited; logs in {home}")
        processes = len(dag_files_bench._tree(proc.pid))
    finally:
        common.stop(proc)
    common.remove_home(home)
    return {
        "files": files,
        "first_full_parse_s": parse_s,
        "first_full_parse_cpu_s": parse_cpu_s,
        "idle_cpu_cores": (cpu_after - cpu_before) / (t_after - t_before),
        "idle_window_s": t_after - t_before,
        "processes": processes,
        "measured": "airflow dag-processor alone, from its start",
        "log_level": "INFO",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--idle", type=float, default=60.0)
    args = parser.parse_args()
    common.exit_on_signal()
    fig = run(args.template, args.files, args.idle)
    print(json.dumps({"system": "airflow", "workload": "dagfiles", **fig}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
