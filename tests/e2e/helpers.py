"""Helpers to run the ``sluice`` CLI as a subprocess in tests.

One way to do each thing every e2e module needs: the environment of an engine process
(``engine_env``), starting one and waiting for its readiness (``start_engine``), reading its
JSON log (``log_records``) and counting asset events (``asset_event_count``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, Dag
from tests.db_templates import copy_sqlite_template
from tests.waiting import (
    wait_for as wait_for,  # the project's one sync waiter; imported from here too
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

SLUICE = str(Path(sys.executable).with_name("sluice"))
READY_LINE = "Sluice ready"
READY_TIMEOUT_S = 60.0  # generous for a loaded 2-core machine


def sluice_env(home: Path, **settings: str) -> dict[str, str]:
    """A clean environment for a sluice process: only SLUICE_HOME, the API on a free port
    and the given settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE")}
    env["SLUICE_HOME"] = str(home)
    # The API part of `sluice run` on a free port: tests (and engines of one test) never
    # compete for [api] port 8793; the readiness line says which port it got.
    env["SLUICE__API__PORT"] = "0"
    env.update(settings)
    return env


def engine_env(
    home: Path,
    *,
    url: str,
    dags: Path,
    parallelism: int = 2,
    heartbeat_s: float = 1.0,
    grace_s: float = 5.0,
    **settings: str,
) -> dict[str, str]:
    """``sluice_env`` for an engine: database, dags folder, worker slots, the triggerer's and
    the scheduler's heartbeat, the shutdown grace period, and any other ``SLUICE__*``.

    The scheduler's loop and the executor's claim poll run every 0.25 s instead of 0.05 s:
    both are woken at once by the parts that give them work (a nudge in process, a commit
    or a notification from another process), so the poll is only their fallback, and two
    idle engines polling 20 times a second each kept the 2-core test machine busy (an idle
    engine: 29% of a core at 0.05 s, 11% at 0.25 s).
    """
    settings.setdefault("SLUICE__SCHEDULER__LOOP_INTERVAL_SEC", "0.25")
    return sluice_env(
        home,
        SLUICE__CORE__SQL_ALCHEMY_CONN=url,
        SLUICE__CORE__DAGS_FOLDER=str(dags),
        SLUICE__CORE__PARALLELISM=str(parallelism),
        SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC=str(heartbeat_s),
        SLUICE__SCHEDULER__SCHEDULER_HEARTBEAT_SEC=str(heartbeat_s),
        # a running try of a killed engine or worker is failed as soon as its executor is
        # called dead (the default waits 300 s, as Airflow does)
        SLUICE__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT=str(2.1 * heartbeat_s),
        SLUICE__TRIGGERER__SHUTDOWN_GRACE_PERIOD_SEC=str(grace_s),
        **settings,
    )


def run_cli(
    *args: str, env: Mapping[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SLUICE, *args], env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )


def start_cli(*args: str, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [SLUICE, *args], env=dict(env), stdout=handle, stderr=subprocess.STDOUT
        )


def log_tail(log: Path, chars: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return "(no log)"


def wait_ready(
    proc: subprocess.Popen[bytes], log: Path, *, timeout: float = READY_TIMEOUT_S
) -> None:
    """Wait for the ``Sluice ready`` line of ``proc`` in ``log``; fail at once if it exits."""

    def ready() -> bool:
        if READY_LINE in log.read_text(errors="replace"):
            return True
        code = proc.poll()
        assert code is None, f"{log.name}: exited with {code} before readiness:\n{log_tail(log)}"
        return False

    wait_for(ready, timeout=timeout, what=f"readiness of {log.name}", step=0.1)


def start_engine(
    env: Mapping[str, str],
    log: Path,
    *,
    json_logs: bool = False,
    timeout: float = READY_TIMEOUT_S,
) -> subprocess.Popen[bytes]:
    """``sluice [--log-format json] run`` with ``env``, output appended to ``log``; returns
    once it logged that it is ready. A process that does not get there is stopped."""
    args = ("--log-format", "json", "run") if json_logs else ("run",)
    proc = start_cli(*args, env=env, log=log)
    try:
        wait_ready(proc, log, timeout=timeout)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        raise
    return proc


def log_records(log: Path) -> list[dict[str, Any]]:
    """The JSON records of a ``--log-format json`` log.

    Other lines (task output that fell back to stderr) are skipped, and so is a line the
    engine is still writing (a read can end in the middle of one).
    """
    records = []
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def asset_event_count(db: Database, asset: str | None = None) -> int:
    """Asset events stored for ``asset`` (every asset when None)."""
    query = select(func.count()).select_from(AssetEvent)
    if asset is not None:
        query = query.join(Asset, Asset.id == AssetEvent.asset_id).where(Asset.name == asset)
    return int(db.call(lambda s: s.execute(query).scalar_one()))


def stop(proc: subprocess.Popen[bytes], *, timeout: float = 30) -> int:
    """SIGTERM, then wait; SIGKILL if it does not exit in time (and fail loudly)."""
    return stop_all([proc], timeout=timeout)[0]


def stop_all(procs: list[subprocess.Popen[bytes]], *, timeout: float = 60) -> list[int]:
    """SIGTERM every process still running at once (each shuts down on its own, side by
    side), then wait for each exit code without a second signal (a second SIGTERM forces an
    engine's stop, or kills a process whose handler is gone: -15); past ``timeout`` the
    ones left are SIGKILLed and the call fails loudly."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for left in procs:
                if left.poll() is None:
                    left.kill()
                    left.wait()
            raise AssertionError(
                f"process {proc.pid} did not stop within {timeout}s of SIGTERM"
            ) from None
    return codes


@contextlib.contextmanager
def running_engine(
    root: Path,
    files: Mapping[str, str],
    dag_ids: Iterable[str],
    *,
    template: Path,
    parallelism: int = 2,
) -> Iterator[dict[str, Any]]:
    """``sluice run`` on SQLite in ``root`` with the DAG files ``files`` (name -> source),
    ready once every DAG of ``dag_ids`` is parsed; yields its ``env``, ``db`` and ``log``.
    Its database starts as a copy of ``template`` (the session's migrated SQLite file,
    fixture ``sqlite_template``).

    On exit the engine is stopped with SIGTERM and must exit 0 (its log tail says why not).
    """
    home, dags = root / "home", root / "dags"
    for folder in (home, dags):
        folder.mkdir()
    for name, source in files.items():
        (dags / name).write_text(textwrap.dedent(source))
    url = copy_sqlite_template(template, home / "sluice.db")
    env = engine_env(home, url=url, dags=dags, parallelism=parallelism)
    log = root / "engine.log"
    proc = start_engine(env, log)
    db = Database(url)
    wanted = set(dag_ids)

    def parsed() -> bool:
        names = db.call(lambda s: set(s.execute(select(Dag.dag_id)).scalars().all()))
        return names >= wanted

    try:
        wait_for(parsed, timeout=60, what=f"the DAGs {sorted(wanted)} to be parsed")
        yield {"env": env, "db": db, "log": log}
    finally:
        code = stop(proc, timeout=60)
        db.dispose()
    assert code == 0, log.read_text()[-3000:]
