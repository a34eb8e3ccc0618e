"""Two whole engines (`sluice run`) on one PostgreSQL database; kill -9 one mid-work.

Every part runs twice: two DAG processors, two schedulers, two executors, two triggerers.
Tasks append ``start``/``defer``/``done`` lines (with their engine's pid) to one journal, so
the test sees which process ran what and how often. The checks are the HA promises of the README:

- every DAG run is created once (one run per asset event, one per manual trigger),
- every task completes once (a try killed with its engine is re-run as a fresh try),
- every deferred task resumes once, every watcher trigger runs on one triggerer at a time,
- killing an engine loses nothing: the survivor carries its work within the health threshold.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from collections import Counter
from typing import TYPE_CHECKING

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import func, select

from engine import store, store_runs
from engine.db import Database, migrate
from engine.models import AssetEvent, Dag, DagRun, Job, TaskInstance, Trigger
from tests.e2e.helpers import run_cli, sluice_env, start_cli, stop, wait_for

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

HEARTBEAT_S = 1.0
THRESHOLD_S = 2.1 * HEARTBEAT_S
FLAGS = ("a.flag", "b.flag", "c.flag")
MANUAL_RUNS = 12
DEFERRING_RUNS = 6

DAGS = """
import os
import time
from datetime import timedelta

from engine import DAG, Asset, AssetWatcher, BaseOperator, task
from triggers import DirectoryFileDeleteTrigger, TimeDeltaTrigger

INBOX = {inbox!r}
JOURNAL = {journal!r}


def journal(line):
    fd = os.open(JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\\n").encode())
    finally:
        os.close(fd)


@task
def record(dag_id, run_id, task_id, try_number):
    key = f"{{dag_id}}/{{run_id}}/{{task_id}}"
    journal(f"start {{key}} {{try_number}} {{os.getppid()}}")
    time.sleep(0.5)  # long enough that one engine's two slots cannot take all the work
    journal(f"done {{key}} {{try_number}} {{os.getppid()}}")
    return key


for flag in {flags!r}:
    name = flag.split(".")[0]
    asset = Asset(f"flag-{{name}}", watchers=[AssetWatcher(f"watch-{{name}}",
        DirectoryFileDeleteTrigger(directory=INBOX, filename=flag, poke_interval=0.1))])
    with DAG(f"on_{{name}}", schedule=asset):
        record()

with DAG("work", schedule=None):
    record()


class DeferThenRecord(BaseOperator):
    def execute(self, context):
        key = f"{{context['dag_id']}}/{{context['run_id']}}/{{context['task_id']}}"
        journal(f"defer {{key}} {{context['try_number']}} {{os.getppid()}}")
        self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=4)), method_name="resume")

    def resume(self, context, event=None):
        key = f"{{context['dag_id']}}/{{context['run_id']}}/{{context['task_id']}}"
        journal(f"done {{key}} {{context['try_number']}} {{os.getppid()}}")
        return key


with DAG("deferring", schedule=None):
    DeferThenRecord(task_id="wait")
"""


def _journal(path: Path) -> list[tuple[str, str, int, int]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        kind, key, try_number, pid = line.split()
        rows.append((kind, key, int(try_number), int(pid)))
    return rows


def _count(db: Database, model: type, *where: object) -> int:
    return int(
        db.call(
            lambda s: s.execute(select(func.count()).select_from(model).where(*where)).scalar_one()
        )
    )


def _states(db: Database) -> Counter[str]:
    return Counter(db.call(lambda s: list(s.execute(select(DagRun.state)).scalars())))


def _engine_pids_with_work(db: Database) -> dict[int, int]:
    """pid of a live triggerer job -> triggers it owns."""

    def read(session: object) -> dict[int, int]:
        rows = session.execute(  # type: ignore[attr-defined]
            select(Job.pid, func.count(Trigger.id))
            .join(Trigger, Trigger.triggerer_id == Job.id)
            .where(Job.state == "running")
            .group_by(Job.pid)
        ).all()
        return {int(pid): int(n) for pid, n in rows}

    return db.call(read)


def _touch_and_wait_consumed(inbox: Path, flag: str, timeout: float) -> None:
    path = inbox / flag
    path.write_text(flag)
    wait_for(lambda: not path.exists(), timeout=timeout, what=f"{flag} to be consumed")


def test_two_engines_share_work_and_the_survivor_carries_a_killed_ones(
    pg_url: str, tmp_path: Path
) -> None:
    dags, inbox, journal = tmp_path / "dags", tmp_path / "inbox", tmp_path / "journal"
    dags.mkdir()
    inbox.mkdir()
    (dags / "ha_flows.py").write_text(
        textwrap.dedent(DAGS.format(inbox=str(inbox), journal=str(journal), flags=FLAGS))
    )
    key = Fernet.generate_key().decode()
    db = Database(pg_url)
    migrate(db.engine)

    def env_for(name: str) -> dict[str, str]:
        return sluice_env(
            tmp_path / name,
            SLUICE__CORE__SQL_ALCHEMY_CONN=pg_url,
            SLUICE__CORE__FERNET_KEY=key,
            SLUICE__CORE__DAGS_FOLDER=str(dags),
            SLUICE__CORE__PARALLELISM="2",
            SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC=str(HEARTBEAT_S),
            SLUICE__SCHEDULER__SCHEDULER_HEARTBEAT_SEC=str(HEARTBEAT_S),
            SLUICE__TRIGGERER__SHUTDOWN_GRACE_PERIOD_SEC="5",
        )

    first = start_cli("run", env=env_for("first"), log=tmp_path / "first.log")
    second = start_cli("run", env=env_for("second"), log=tmp_path / "second.log")
    survivor_code: int | None = None
    try:
        logs = ("first.log", "second.log")
        for log in logs:
            wait_for(
                lambda log=log: "Sluice ready" in (tmp_path / log).read_text(),
                timeout=60,
                what=f"readiness of {log}",
            )
        wait_for(
            lambda: _count(db, Dag) == 2 + len(FLAGS), timeout=60, what="the DAGs to be parsed"
        )
        # Both parse the same folder: the DAG rows exist once.
        assert _count(db, Dag) == 2 + len(FLAGS)

        # Work for both engines: manual runs, deferrals, and one flag per watcher.
        def create(dag_id: str, n: int) -> None:
            def write(session: object) -> None:
                for _ in range(n):
                    store_runs.create_run(
                        session,  # type: ignore[arg-type]
                        dag_id,
                        run_type=store_runs.MANUAL,
                        now=store.utcnow(),
                    )

            db.call(write)

        create("deferring", DEFERRING_RUNS)
        create("work", MANUAL_RUNS // 2)
        for flag in FLAGS:
            _touch_and_wait_consumed(inbox, flag, timeout=30)
        wait_for(
            lambda: _count(db, TaskInstance, TaskInstance.state == "deferred") >= 1,
            timeout=30,
            what="a task to defer",
        )
        owners = wait_for(
            lambda: (o := _engine_pids_with_work(db)) and o,
            timeout=30,
            what="the triggerers to own triggers",
        )
        # Kill the engine that owns triggers (the first one if both do) mid-work.
        victim = first if first.pid in owners else second
        survivor = second if victim is first else first
        create("work", MANUAL_RUNS - MANUAL_RUNS // 2)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        killed_at = time.monotonic()

        # The survivor takes over every trigger within the health threshold (plus its claim
        # cadence and the time the victim's last heartbeat was already old).
        wait_for(
            lambda: (
                set(_engine_pids_with_work(db)) == {survivor.pid}
                and _count(db, Trigger, Trigger.triggerer_id.is_(None)) == 0
            ),
            timeout=THRESHOLD_S + 10,
            what="the survivor to own every trigger",
        )
        takeover_s = time.monotonic() - killed_at
        # Flags arriving after the kill are consumed by the survivor.
        for flag in FLAGS:
            _touch_and_wait_consumed(inbox, flag, timeout=30)

        expected_runs = MANUAL_RUNS + DEFERRING_RUNS + 2 * len(FLAGS)
        wait_for(
            lambda: _states(db) == Counter({"success": expected_runs}),
            timeout=90,
            what=f"{expected_runs} successful runs (now {dict(_states(db))})",
        )
    finally:
        for proc in (first, second):
            if proc.returncode is None and proc.poll() is None:
                survivor_code = stop(proc, timeout=60)

    assert survivor_code == 0
    for log in logs:  # concurrent DAG processors and schedulers never trip over each other
        text = (tmp_path / log).read_text()
        assert "UniqueViolation" not in text and "pass failed" not in text, text[-3000:]
        assert key not in text  # the Fernet key never reaches a log line
        assert "dag_id=work" in text or "dag_id=deferring" in text  # structured task fields
    assert takeover_s <= THRESHOLD_S + 5, f"takeover took {takeover_s:.1f}s"

    # Every asset event created exactly one run; no flag appearance became two events.
    assert _count(db, AssetEvent) == 2 * len(FLAGS)
    for flag in FLAGS:
        assert _count(db, DagRun, DagRun.dag_id == f"on_{flag.split('.')[0]}") == 2
    # Every task completed exactly once; only tries killed with their engine started twice.
    done = Counter(key for kind, key, _, _ in _journal(journal) if kind == "done")
    tis = db.call(
        lambda s: s.execute(
            select(DagRun.dag_id, DagRun.run_id, TaskInstance.task_id).join(
                TaskInstance, TaskInstance.dag_run_id == DagRun.id
            )
        ).all()
    )
    assert len(tis) == expected_runs
    assert done == Counter(f"{d}/{r}/{t}" for d, r, t in tis)
    starts = Counter((k, key, t) for k, key, t, _ in _journal(journal) if k != "done")
    assert all(n == 1 for n in starts.values()), "a try of a task started twice"
    # The triggerer rows of the deferrals are gone once their tasks resumed.
    assert _count(db, Trigger, Trigger.kind == "task") == 0
    # Both engines' executors ran tasks (a worker's parent is its engine process).
    engines = {ppid for _, _, _, ppid in _journal(journal)}
    assert engines == {first.pid, second.pid}, engines
    listed = run_cli("runs", "list", "deferring", "--json", env=env_for("cli"))
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == DEFERRING_RUNS
    db.dispose()
