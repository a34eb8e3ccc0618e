"""Operator commands against a real ``sluice run``: streams, jobs, triggers, dags show, doctor.

One engine runs a DAG folder with two sibling directory watchers (one shared stream) and a
task that stays deferred; the commands must describe it. Then the engine is killed with
SIGKILL and ``sluice doctor`` must say the deferred task's triggerer is dead and what to do.
"""

from __future__ import annotations

import json
import signal
import textwrap
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from engine.db.database import Database
from engine.db.models import Dag, TaskInstance
from tests.cli import invoke
from tests.db_templates import copy_sqlite_template
from tests.e2e.helpers import engine_env, start_engine, stop, wait_for

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.e2e

DAGS = """
from datetime import timedelta

from engine import DAG, Asset, AssetWatcher, BaseOperator, task
from triggers import DirectoryFileDeleteTrigger, TimeDeltaTrigger

INBOX = {inbox!r}

north = Asset("north", watchers=[AssetWatcher("north-flag", DirectoryFileDeleteTrigger(
    directory=INBOX, filename="north.flag", poke_interval=0.2))])
south = Asset("south", watchers=[AssetWatcher("south-flag", DirectoryFileDeleteTrigger(
    directory=INBOX, filename="south.flag", poke_interval=0.2))])


@task
def report():
    return "ok"


with DAG("on_north", schedule=north, description="north flags"):
    report()

with DAG("on_south", schedule=south):
    report()


class WaitLong(BaseOperator):
    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(timedelta(hours=1)), method_name="resume")

    def resume(self, context, event=None):
        return "resumed"


with DAG("deferrer", schedule=None):
    WaitLong(task_id="wait")
"""


def _json(*args: str, env: dict[str, str]) -> Any:
    result = invoke(*args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _streams(env: dict[str, str]) -> list[dict[str, Any]] | None:
    rows = _json("streams", "list", env=env)
    return rows if rows and rows[0]["subscribers"] == 2 else None


def _deferred(db: Database) -> list[str]:
    query = select(TaskInstance.dag_id).where(TaskInstance.state == "deferred")
    return list(db.call(lambda s: s.execute(query).scalars().all()))


def _setup(tmp_path: Path, template: Path) -> tuple[dict[str, str], str]:
    home, dags, inbox = tmp_path / "home", tmp_path / "dags", tmp_path / "inbox"
    for folder in (home, dags, inbox):
        folder.mkdir()
    (dags / "flows.py").write_text(textwrap.dedent(DAGS.format(inbox=str(inbox))))
    url = copy_sqlite_template(template, home / "sluice.db")
    # heartbeats every second, dead after 2.1 s: at 0.5 s (dead after 1.05 s) a loaded test
    # machine once made the doctor call the running engine dead ("heartbeated 1s ago")
    env = engine_env(home, url=url, dags=dags, parallelism=1, heartbeat_s=1.0)
    return env, url


def test_ops_commands_describe_a_running_engine_and_doctor_finds_a_killed_one(
    tmp_path: Path, sqlite_template: Path
) -> None:
    env, url = _setup(tmp_path, sqlite_template)
    proc = start_engine(env, tmp_path / "engine.log", timeout=30)
    db = Database(url)
    try:
        wait_for(
            lambda: len(db.call(lambda s: s.execute(select(Dag.dag_id)).all())) == 3,
            timeout=30,
            what="the DAGs to be parsed",
        )
        assert invoke("dags", "trigger", "deferrer", env=env).returncode == 0
        wait_for(lambda: _deferred(db), timeout=30, what="the task to defer")
        _check_running_engine(env, db)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        _check_killed_engine(env)
    finally:
        if proc.poll() is None:
            stop(proc)
        db.dispose()


def _triggerer_owning_all(env: dict[str, str]) -> Any:
    """(triggerer job, triggers) once the live triggerer runs the 3 triggers and owns each."""
    jobs = {j["type"]: j for j in _json("jobs", "list", env=env)}
    triggerer = jobs.get("triggerer")
    triggers = _json("triggers", "list", env=env)
    if (
        triggerer is None
        or triggerer["load"] != 3
        or len(triggers) != 3
        or not all(t["triggerer_id"] == triggerer["id"] and t["owner_alive"] for t in triggers)
    ):
        return None
    return jobs, triggers


def _check_running_engine(env: dict[str, str], db: Database) -> None:
    (group,) = wait_for(lambda: _streams(env), timeout=15, what="a shared-stream snapshot")
    assert group["mode"] == "fast" and "directory-scan" in group["key"]
    assert (group["broker"], group["lanes"], group["outstanding"]) == ("directory-scan", 0, 0)
    assert group["overflows"] == group["ack_timeouts"] == group["dead_lettered"] == 0
    assert group["snapshot_age_s"] < 5

    # The deferred task's trigger may not be claimed yet: wait until the triggerer runs all 3.
    jobs, triggers = wait_for(
        lambda: _triggerer_owning_all(env),
        timeout=15,
        what="the triggerer to own and run every trigger",
    )
    assert {"triggerer", "scheduler", "executor"} <= set(jobs)
    assert all(j["alive"] for j in jobs.values())
    triggerer = jobs["triggerer"]
    assert triggerer["capacity"] == 1000
    assert group["triggerer_id"] == triggerer["id"]

    serves = sorted(t["serves"] for t in triggers)
    assert serves[0].startswith("task deferrer/") and serves[0].endswith("/wait")
    assert serves[1:] == ["watcher north/north-flag", "watcher south/south-flag"]

    shown = invoke("dags", "show", "on_north", env=env)
    assert shown.returncode == 0, shown.stderr
    for text in ("flows.py", "north flags", "north-flag", "DirectoryFileDeleteTrigger", "report"):
        assert text in shown.stdout
    assert json.loads(invoke("dags", "show", "on_north", "--json", env=env).stdout)["assets"] == [
        "north"
    ]

    healthy = invoke("doctor", env=env)
    assert (healthy.returncode, healthy.stdout.strip()) == (0, "no problems found"), healthy.stdout
    table = invoke("streams", "list", env=env).stdout
    assert "directory-scan" in table and "SUBSCRIBERS" in table
    assert "BROKER" in table and "DEAD_LETTERED" in table


def _check_killed_engine(env: dict[str, str]) -> None:
    # Each part of the killed engine is called dead once its own last heartbeat is older
    # than the threshold: they heartbeat at different moments, so wait for all of them.
    expected = {
        "trigger_owner_dead",
        "live_triggerer",
        "live_scheduler",
        "live_executor",
        "dead_job",
    }

    def doctor_sees_it() -> Any:
        result = invoke("doctor", "--json", env=env)
        checks = {f["check"]: f for f in json.loads(result.stdout)}
        return (result, checks) if expected <= set(checks) else None

    result, checks = wait_for(doctor_sees_it, timeout=15, what="doctor to see the dead engine")
    assert result.returncode == 1
    owner = checks["trigger_owner_dead"]
    assert owner["severity"] == "error" and "task deferrer/" in owner["problem"]
    assert "start a triggerer" in owner["action"]
    text = invoke("doctor", env=env)
    assert text.returncode == 1 and "ERROR [trigger_owner_dead]" in text.stdout
    assert "-> start a triggerer" in text.stdout
    assert _json("streams", "list", env=env) == []  # a dead triggerer's groups are not shown
