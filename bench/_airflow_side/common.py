"""Shared helpers of the Airflow-side scripts: a throwaway AIRFLOW_HOME, seeding, processes.

Import this module before anything from ``airflow``: ``prepare_home`` sets the environment
Airflow reads its configuration from at import time.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DAGS = HERE / "dags"
AIRFLOW_BIN = Path(sys.executable).with_name("airflow")


def exit_on_signal() -> None:
    """SIGTERM / SIGINT raise SystemExit, so ``finally`` blocks stop the Airflow processes."""

    def _exit(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)


def free_port() -> int:
    """A free loopback TCP port (the api-server's, so that runs never clash)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api_healthy(port: int) -> bool:
    """Whether the api-server's Execution API answers its health check."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/execution/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def stack_env(port: int, parallelism: int) -> dict[str, str]:
    """Settings of a whole Airflow (api-server, scheduler with LocalExecutor, triggerer):
    the api-server on ``port``, the task processes pointed at its Execution API."""
    return {
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
    }


def own_dags(home: Path) -> dict[str, str]:
    """A DAGs folder of the run's own (``home/dags``), new DAGs unpaused, as a user sets up
    a DAG meant to run: the settings to pass to ``prepare_home``'s ``extra``."""
    return {
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    }


def db_rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of a read-only query on the run's SQLite DB (none while it is locked or absent)."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute(sql).fetchall()
    except sqlite3.Error:
        return []


def base_env(home: Path, db_file: Path, level: str, fernet_key: str) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{db_file}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__FERNET_KEY": fernet_key,
        "AIRFLOW__LOGGING__LOGGING_LEVEL": level,
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }


def prepare_home(template: Path, level: str, extra: dict[str, str] | None = None) -> Path:
    """A fresh AIRFLOW_HOME holding a copy of the migrated template DB; sets os.environ."""
    home = Path(tempfile.mkdtemp(prefix="af-bench-"))
    db_file = home / "airflow.db"
    shutil.copyfile(template, db_file)
    key = (template.parent / "fernet.key").read_text().strip()
    os.environ.update(base_env(home, db_file, level, key))
    os.environ.update(extra or {})
    return home


def start(args: list[str], home: Path, name: str) -> subprocess.Popen[bytes]:
    """Start ``airflow <args>`` in its own session, its output in ``home/<name>.log``.

    A triggerer runs with ``--skip-serve-logs``: the bench reads no logs over HTTP, and the
    log server's fixed port would clash between runs.
    """
    if args[0] == "triggerer":
        args = [*args, "--skip-serve-logs"]
    out = (home / f"{name}.log").open("wb")
    return subprocess.Popen(
        [str(AIRFLOW_BIN), *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=os.environ.copy(),
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def remove_home(home: Path) -> None:
    """Delete a home made by ``prepare_home`` (kept when BENCH_KEEP_HOME is set, to debug)."""
    if not os.environ.get("BENCH_KEEP_HOME"):
        shutil.rmtree(home, ignore_errors=True)


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (Airflow's triggerer is two processes)."""
    import psutil

    proc = psutil.Process(pid)
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll ``predicate`` until true; return the time it became true (perf_counter)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def seed_deferred(n: int, delta_days: float = 1.0) -> None:
    """N deferred instances of bench_idle.wait, each on its own TimeDeltaTrigger row.

    One DAG run made by Airflow's own ``create_dagrun``; the N task instances (map_index
    0..N-1) and their trigger rows are inserted in bulk with the values ``defer()`` writes:
    the trigger's classpath and Fernet-encrypted kwargs, state ``deferred``, ``next_method``.
    """
    import uuid
    from datetime import timedelta

    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.trigger import Trigger
    from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
    from airflow.sdk import timezone
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import insert, select

    with create_session() as session:
        dag = SerializedDagModel.get_dag("bench_idle", session=session)
        now = timezone.utcnow()
        dag.create_dagrun(
            run_id="bench",
            logical_date=now,
            data_interval=(now, now),
            run_after=now,
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.TEST,
            state=DagRunState.RUNNING,
            session=session,
        )
        version_id = session.scalar(
            select(TaskInstance.dag_version_id).where(TaskInstance.dag_id == "bench_idle")
        )
        row = Trigger.from_object(TimeDeltaTrigger(timedelta(days=delta_days)))
        classpath, token = row.classpath, row.encrypted_kwargs
        for start_at in range(0, n, 5000):
            stop_at = min(n, start_at + 5000)
            ids = session.scalars(
                insert(Trigger).returning(Trigger.id),
                [
                    {"classpath": classpath, "encrypted_kwargs": token, "created_date": now}
                    for _ in range(start_at, stop_at)
                ],
            ).all()
            session.execute(
                insert(TaskInstance),
                [
                    {
                        "id": uuid.uuid4(),
                        "task_id": "wait",
                        "dag_id": "bench_idle",
                        "run_id": "bench",
                        "map_index": start_at + i,
                        "state": "deferred",
                        "try_number": 1,
                        "max_tries": 0,
                        "pool": "default_pool",
                        "pool_slots": 1,
                        "queue": "default",
                        "priority_weight": 1,
                        "operator": "Wait",
                        "trigger_id": tid,
                        "next_method": "done",
                        "dag_version_id": version_id,
                        "start_date": now,
                    }
                    for i, tid in enumerate(ids)
                ],
            )
            session.commit()
