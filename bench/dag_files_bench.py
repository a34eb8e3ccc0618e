"""Many DAG files: time of the first full parse, and the engine's CPU at idle afterwards.

Run by hand (never in tests):
    .venv/bin/python bench/dag_files_bench.py [--files 300] [--idle 60] [--no-examples]

Cases, one after the other in one run:
- ``generated``: ``--files`` small DAG files (one DAG of 3 TaskFlow tasks each, schedule
  None: nothing runs) in a fresh dags folder;
- ``examples``: the repository's ``dags/`` folder (the example DAGs; skipped with
  ``--no-examples``);
- ``empty``: an empty dags folder: the idle CPU of the rest of the engine (scheduler,
  executor, triggerer, API), which the DAG processor's share is the difference from.

Each case starts a fresh ``sluice run`` on a fresh SQLite home. The first full parse is
timed from the ``sluice run`` start until every DAG of the folder has its row (engine start-up
included: that is what a user waits for). Then, with no file changed and nothing to run, the
CPU time of the engine's whole process tree (its processes and the children they reaped,
from ``/proc/PID/stat``) is read at the start and the end of ``--idle`` seconds: the idle
CPU, in cores. The CPU time the tree used until the first full parse ended is printed too:
it depends little on the machine's load (the wall time depends on it a lot), and divided by
the cores it is the least wall time the parse could take here. The load average is
printed at the start and the end (2 cores here: a load far above 2 makes every figure
slower). With the empty folder measured, the DAG processor's share of the idle CPU is printed
(``generated`` minus ``empty``: the rest of the engine idles the same). Writes
``bench/results/dag_files.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from process_tree import process_tree, stop, tree_cpu_s

ROOT = Path(__file__).resolve().parent.parent
SLUICE = str(Path(sys.executable).with_name("sluice"))
RESULTS = ROOT / "bench" / "results" / "dag_files.json"
DAG_FILE = """\
from engine import DAG, task


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


def _write_generated(folder: Path, count: int) -> set[str]:
    for n in range(count):
        (folder / f"bench_{n:04d}.py").write_text(DAG_FILE.format(n=n))
    return {f"bench_{n:04d}" for n in range(count)}


def _example_files(folder: Path) -> int:
    """How many DAG files the examples folder holds (each parses)."""
    return len(list(folder.glob("*.py")))


def _dag_ids(db_path: Path) -> set[str]:
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1) as conn:
            return {row[0] for row in conn.execute("SELECT dag_id FROM dag")}
    except sqlite3.Error:
        return set()


def _files_parsed(db_path: Path) -> int:
    """Files with a good parse stored (``dag_file``: one row per file that parsed)."""
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute("SELECT count(*) FROM dag_file").fetchone()[0]
    except sqlite3.Error:
        return 0


def _job_started(db_path: Path) -> bool:
    """Whether the DAG processor's job row exists (an empty folder parses at once)."""
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1) as conn:
            query = "SELECT count(*) FROM job WHERE job_type = 'dag_processor'"
            return bool(conn.execute(query).fetchone()[0])
    except sqlite3.Error:
        return False


def _wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


def run_case(name: str, dags: Path, expected: Any, idle_s: float) -> dict[str, Any]:
    """One fresh ``sluice run`` on ``dags``: first full parse, then idle CPU."""
    home = Path(tempfile.mkdtemp(prefix=f"dag-files-bench-{name}-"))
    db_path = home / "sluice.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE")}
    env |= {
        "SLUICE_HOME": str(home),
        "SLUICE__CORE__DAGS_FOLDER": str(dags),
        "SLUICE__CORE__SQL_ALCHEMY_CONN": f"sqlite:///{db_path}",
        "SLUICE__API__PORT": "0",
    }
    subprocess.run([SLUICE, "db", "migrate"], env=env, capture_output=True, check=True)
    log = (home / "engine.log").open("wb")
    started = time.monotonic()
    engine = subprocess.Popen(
        [SLUICE, "run"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        _wait(lambda: expected(db_path), 600, f"the DAGs of {dags} to be parsed")
        parse_s = time.monotonic() - started
        parse_cpu_s = tree_cpu_s(engine.pid, reaped=True)
        time.sleep(5.0)  # the first pass's follow-ups (watch start, first heartbeats) settle
        cpu_before, t_before = tree_cpu_s(engine.pid, reaped=True), time.monotonic()
        time.sleep(idle_s)
        cpu_after, t_after = tree_cpu_s(engine.pid, reaped=True), time.monotonic()
        if engine.poll() is not None:
            raise SystemExit(f"sluice run exited with {engine.returncode}: see {home}/engine.log")
        processes = len(process_tree(engine.pid))
    finally:
        stop(engine)
        log.close()
    idle_cores = (cpu_after - cpu_before) / (t_after - t_before)
    result = {
        "case": name,
        "files": len(list(dags.glob("*.py"))),
        "first_full_parse_s": round(parse_s, 2),
        "first_full_parse_cpu_s": round(parse_cpu_s, 2),
        "idle_window_s": round(t_after - t_before, 1),
        "idle_cpu_cores": round(idle_cores, 4),
        "engine_processes": processes,
    }
    print(
        f"{name}: {result['files']} files, first full parse {parse_s:.2f}s "
        f"({parse_cpu_s:.2f} CPU s, engine start included), idle CPU "
        f"{idle_cores:.3f} cores over {t_after - t_before:.0f}s ({processes} processes)",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--idle", type=float, default=60.0, help="idle window, seconds")
    parser.add_argument("--no-examples", action="store_true")
    parser.add_argument("--no-baseline", action="store_true", help="skip the empty folder")
    parser.add_argument("--label", default="", help="stored with the results (e.g. before)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON file written")
    args = parser.parse_args()
    load_start = os.getloadavg()
    print(f"load average at start: {load_start} on {os.cpu_count()} cores", flush=True)
    cases = []
    with tempfile.TemporaryDirectory(prefix="dag-files-bench-dags-") as tmp:
        dags = Path(tmp)
        wanted = _write_generated(dags, args.files)
        cases.append(run_case("generated", dags, lambda db: wanted <= _dag_ids(db), args.idle))
    if not args.no_examples:
        examples = ROOT / "dags"
        count = _example_files(examples)
        cases.append(
            run_case("examples", examples, lambda db: _files_parsed(db) >= count, args.idle)
        )
    if not args.no_baseline:
        with tempfile.TemporaryDirectory(prefix="dag-files-bench-empty-") as tmp:
            cases.append(run_case("empty", Path(tmp), _job_started, args.idle))
    load_end = os.getloadavg()
    print(f"load average at end: {load_end}", flush=True)
    idle = {case["case"]: case["idle_cpu_cores"] for case in cases}
    share = None
    if "generated" in idle and "empty" in idle:
        share = round(idle["generated"] - idle["empty"], 4)
        print(
            f"the DAG processor's share of the idle CPU with {args.files} files: {share:+.3f} "
            "cores (generated - empty, same run)",
            flush=True,
        )
    document = {
        "label": args.label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "load_average_at_start": load_start,
        "load_average_at_end": load_end,
        "cases": cases,
        "dag_processor_idle_cores": share,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
