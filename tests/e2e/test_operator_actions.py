"""Operator actions against a real ``sluice run``: a long-running task is cleared while it
runs (its process is stopped and it runs again as its next try), then its run is cancelled
(the second process is stopped too, the task and the run are failed)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from engine.db.models import DagRun, TaskInstance
from engine.executor.task_logs import read_task_log
from tests.cli import invoke
from tests.e2e.helpers import running_engine, wait_for

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

DAGS = """
import os
import time

from engine import DAG, task


@task
def sleeper(ti):
    with open(f"{PIDS}/{ti.try_number}", "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(600)


with DAG("long", schedule=None):
    sleeper()
"""


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _pid(pids: Path, try_number: int) -> int | None:
    path = pids / str(try_number)
    text = path.read_text() if path.exists() else ""
    return int(text) if text.strip() else None


def _ti(engine: dict[str, Any], run_id: str) -> tuple[str, int, str]:
    def load(session: Any) -> tuple[str, int, str]:
        run = session.execute(select(DagRun).where(DagRun.run_id == run_id)).scalar_one()
        ti = session.execute(
            select(TaskInstance).where(TaskInstance.dag_run_id == run.id)
        ).scalar_one()
        return str(ti.state), int(ti.try_number), str(run.state)

    result: tuple[str, int, str] = engine["db"].call(load)
    return result


def _cli(engine: dict[str, Any], *args: str) -> str:
    done = invoke(*args, env=engine["env"])
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_clear_then_cancel_a_running_task_stops_its_processes(
    tmp_path: Path, sqlite_template: Path
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    source = DAGS.replace("{PIDS}", str(pids))
    (tmp_path / "engine").mkdir()
    with running_engine(
        tmp_path / "engine", {"long.py": source}, ["long"], template=sqlite_template
    ) as engine:
        run_id = json.loads(_cli(engine, "dags", "trigger", "long", "--json"))["run_id"]
        first = wait_for(lambda: _pid(pids, 1), timeout=60, what="try 1 to start")
        assert _alive(first)

        out = _cli(engine, "tasks", "clear", "long", "--run", run_id, "--yes")
        assert "restarting" in out
        wait_for(lambda: not _alive(first), timeout=30, what="try 1's process to be stopped")
        second = wait_for(lambda: _pid(pids, 2), timeout=60, what="try 2 to start")
        assert _alive(second) and _ti(engine, run_id)[:2] == ("running", 2)

        out = _cli(engine, "runs", "cancel", "long", run_id)
        assert "running -> failed" in out and "sleeper" in out
        wait_for(lambda: not _alive(second), timeout=30, what="try 2's process to be stopped")
        assert _ti(engine, run_id) == ("failed", 2, "failed")

        folder = tmp_path / "engine" / "home" / "logs"
        logs = [read_task_log(folder, "long", run_id, "sleeper", n) for n in (1, 2)]
        assert "state externally set to restarting; stopping" in logs[0]
        assert "state externally set to failed; stopping" in logs[1]
    assert not any(_alive(pid) for pid in (first, second))
    assert sorted(os.listdir(pids)) == ["1", "2"]  # no third try after the cancel
