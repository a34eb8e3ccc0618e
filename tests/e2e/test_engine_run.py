"""``sluice run`` as a subprocess on a temporary SLUICE_HOME: watchers, runs, deferrals."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from engine.db.database import Database
from engine.db.models import AssetEvent, DagRun, TaskInstance
from tests.cli import invoke
from tests.db_reads import find_task_instance
from tests.db_templates import copy_sqlite_template
from tests.e2e.helpers import engine_env, start_engine, stop, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.e2e

DAGS = """
from datetime import datetime, timedelta, timezone

from engine import DAG, Asset, AssetWatcher, BaseOperator, task
from engine.sensors import DateTimeSensor
from triggers import DirectoryFileDeleteTrigger, FileTrigger, TimeDeltaTrigger

INBOX = {inbox!r}
RELEASE = {release!r}

north = Asset("north", watchers=[AssetWatcher("north-flag", DirectoryFileDeleteTrigger(
    directory=INBOX, filename="north.flag", poke_interval=0.1))])
south = Asset("south", watchers=[AssetWatcher("south-flag", DirectoryFileDeleteTrigger(
    directory=INBOX, filename="south.flag", poke_interval=0.1))])


@task
def report(triggering_asset_events):
    return {{
        name: [e["payload"] for e in events] for name, events in triggering_asset_events.items()
    }}


with DAG("on_north", schedule=north):
    report()

with DAG("on_south", schedule=south):
    report()


class WaitThenReturn(BaseOperator):
    def __init__(self, *, seconds, timeout=None, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds
        self.timeout = timeout

    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=self.seconds)),
                   method_name="resume", kwargs={{"note": "kept"}},
                   timeout=None if self.timeout is None else timedelta(seconds=self.timeout))

    def resume(self, context, event=None, note=None):
        return {{"event": event.isoformat(), "note": note}}


class WaitForRelease(BaseOperator):
    def execute(self, context):
        self.defer(trigger=FileTrigger(RELEASE, poke_interval=0.1), method_name="resume",
                   kwargs={{"note": "kept"}})

    def resume(self, context, event=None, note=None):
        return {{"event": event, "note": note}}


with DAG("deferrer", schedule=None):
    WaitForRelease(task_id="wait")

with DAG("deferrer_clock", schedule=None):
    WaitThenReturn(task_id="wait", seconds=1)

with DAG("quick", schedule=None):
    @task
    def hello():
        return "hello"
    hello()

with DAG("times_out", schedule=None):
    WaitThenReturn(task_id="wait", seconds=3600, timeout=1)


with DAG("from_trigger", schedule=None):
    DateTimeSensor(task_id="sensor", target_time=datetime.now(timezone.utc) + timedelta(seconds=1),
                   start_from_trigger=True, end_from_trigger=True)
"""


DAG_IDS = {
    "on_north",
    "on_south",
    "deferrer",
    "deferrer_clock",
    "quick",
    "times_out",
    "from_trigger",
}


@pytest.fixture(scope="module")
def engine(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("engine")
    home, dags, inbox = root / "home", root / "dags", root / "inbox"
    for folder in (home, dags, inbox):
        folder.mkdir()
    release = root / "release"
    (dags / "flows.py").write_text(
        textwrap.dedent(DAGS.format(inbox=str(inbox), release=str(release)))
    )
    url = copy_sqlite_template(sqlite_template, home / "sluice.db")
    env = engine_env(home, url=url, dags=dags, parallelism=1)
    log = root / "engine.log"
    proc = start_engine(env, log)
    db = Database(url)
    try:
        wait_for(lambda: _dag_ids(db) == DAG_IDS, timeout=60, what="the DAGs to be parsed")
        yield {"env": env, "db": db, "inbox": inbox, "log": log, "proc": proc, "release": release}
    finally:
        release.touch()  # nothing left deferred on the test
        code = stop(proc, timeout=60)
        db.dispose()
    assert code == 0, log.read_text()[-3000:]


def _dag_ids(db: Database) -> set[str]:
    from engine.db.models import Dag

    return set(db.call(lambda s: s.execute(select(Dag.dag_id)).scalars().all()))


def _runs(db: Database, dag_id: str) -> list[DagRun]:
    return db.call(
        lambda s: s.execute(select(DagRun).where(DagRun.dag_id == dag_id)).scalars().all()
    )


def _ti(db: Database, dag_id: str, task_id: str) -> TaskInstance | None:
    runs = _runs(db, dag_id)
    if not runs:
        return None
    return db.call(lambda s: find_task_instance(s, dag_id, runs[-1].run_id, task_id))


def test_flag_file_makes_one_asset_event_and_one_run_that_sees_it(engine) -> None:
    db, inbox = engine["db"], engine["inbox"]
    (inbox / "north.flag").touch()
    ti = wait_for(
        lambda: (t := _ti(db, "on_north", "report")) and t.state == "success" and t,
        timeout=30,
        what="the run of on_north to succeed",
    )
    assert len(_runs(db, "on_north")) == 1
    assert _runs(db, "on_south") == []
    events = db.call(lambda s: s.execute(select(AssetEvent)).scalars().all())
    assert [e.payload["filename"] for e in events] == ["north.flag"]
    assert ti.xcoms["return_value"]["north"][0]["filename"] == "north.flag"
    assert not (inbox / "north.flag").exists()


def test_two_sibling_watchers_share_one_scan(engine) -> None:
    def shared_group() -> list[dict[str, Any]] | None:
        listed = invoke("streams", "list", "--json", env=engine["env"])
        assert listed.returncode == 0, listed.stderr
        groups = json.loads(listed.stdout)
        return groups if groups and groups[0]["subscribers"] == 2 else None

    groups = wait_for(shared_group, timeout=30, what="both watchers to join a shared stream")
    assert len(groups) == 1 and str(engine["inbox"]) in groups[0]["key"], groups
    lines = [
        ln for ln in engine["log"].read_text().splitlines() if "Shared stream group started" in ln
    ]
    assert len(lines) == 1, lines
    assert str(engine["inbox"]) in lines[0]


def test_deferred_task_frees_its_slot_and_resumes_with_the_payload(engine) -> None:
    db, env, release = engine["db"], engine["env"], engine["release"]
    assert invoke("dags", "trigger", "deferrer", env=env).returncode == 0
    wait_for(
        lambda: (t := _ti(db, "deferrer", "wait")) and t.state == "deferred",
        timeout=30,
        what="the task to defer",
    )
    assert invoke("dags", "trigger", "quick", env=env).returncode == 0
    # parallelism = 1: quick can only run because the deferred task gave its slot back
    wait_for(
        lambda: (t := _ti(db, "quick", "hello")) and t.state == "success",
        timeout=30,
        what="a second task to run while the first is deferred",
    )
    assert _ti(db, "deferrer", "wait").state == "deferred"  # its trigger waits for release
    release.touch()
    ti = wait_for(
        lambda: (t := _ti(db, "deferrer", "wait")) and t.state == "success" and t,
        timeout=30,
        what="the deferred task to resume",
    )
    event = {"filepath": str(release), "matches": [str(release)]}
    assert ti.xcoms["return_value"] == {"event": event, "note": "kept"}


def test_deferred_task_resumes_with_a_datetime_payload(engine) -> None:
    db, env = engine["db"], engine["env"]
    assert invoke("dags", "trigger", "deferrer_clock", env=env).returncode == 0
    ti = wait_for(
        lambda: (t := _ti(db, "deferrer_clock", "wait")) and t.state == "success" and t,
        timeout=30,
        what="the deferred task to resume after its time delta",
    )
    assert ti.xcoms["return_value"]["note"] == "kept"
    fired = datetime.fromisoformat(ti.xcoms["return_value"]["event"])
    assert fired.tzinfo is not None and fired <= datetime.now(UTC)


def test_deferral_timeout_fails_the_task(engine) -> None:
    db, env = engine["db"], engine["env"]
    assert invoke("dags", "trigger", "times_out", env=env).returncode == 0
    ti = wait_for(
        lambda: (t := _ti(db, "times_out", "wait")) and t.state == "failed" and t,
        timeout=30,
        what="the deferral to time out",
    )
    runs = _runs(db, "times_out")
    logs = invoke("tasks", "logs", "times_out", runs[-1].run_id, "wait", env=env)
    assert "trigger timeout" in logs.stdout
    assert ti.end_date is not None


def test_end_from_trigger_ends_a_task_without_a_worker(engine) -> None:
    db, env = engine["db"], engine["env"]
    assert invoke("dags", "trigger", "from_trigger", env=env).returncode == 0
    ti = wait_for(
        lambda: (t := _ti(db, "from_trigger", "sensor")) and t.state == "success" and t,
        timeout=30,
        what="the trigger to end the task",
    )
    assert ti.pid is None  # never ran in a worker process
    assert ti.try_number == 1  # the try started on the triggerer
