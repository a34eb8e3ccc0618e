"""Two whole engines (`sluice run`) on one PostgreSQL database; kill -9 one mid-work.

Every part runs twice: two DAG processors, two schedulers, two executors, two triggerers.
Tasks append ``start``/``defer``/``done`` lines (with their engine's pid) to one journal, so
the test sees which process ran what and how often. The checks are the HA
promises of docs/production.md:

- every DAG run is created once: rounds of distinct flag files fired while both schedulers
  run make exactly one run per asset event (each event consumed by one run, no run without one),
- every task completes once: the victim is killed while it runs tasks (``hold`` tasks that
  wait for a release file, ``retries=1``): a try whose worker died counts as a failed try, so
  each of those completes once, as try 2, on the survivor (as does a try whose body ended
  in the instant before the kill, its outcome not recorded: its first completion was lost
  with its worker),
- a task without retries that the victim was running when it died ends ``failed`` (its
  failure callback runs once, on the survivor, with the reason; its run fails),
- every deferred task resumes once, also one whose trigger the victim owned when it died,
- killing an engine loses nothing: the survivor owns every trigger within the health
  threshold (2.1 x the heartbeat) plus one claim interval plus a 2 s margin for a loaded
  2-core machine (``TAKEOVER_BOUND_S``).
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

from engine.db import models
from engine.db.database import Database
from engine.db.models import (
    AssetEventQueue,
    Dag,
    DagRun,
    DagRunAssetEvent,
    Job,
    TaskInstance,
    Trigger,
)
from engine.db.queries import runs
from engine.task_log_files import read_task_log
from engine.triggerer.settings import CLAIM_IDLE_INTERVAL_S
from tests.cli import invoke
from tests.e2e.helpers import (
    asset_event_count,
    engine_env,
    log_tail,
    start_engine,
    stop,
    wait_for,
)

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

HEARTBEAT_S = 1.0
THRESHOLD_S = 2.1 * HEARTBEAT_S
LOADED_MACHINE_MARGIN_S = 2.0  # the survivor's claim commit, the polling of this test, load
TAKEOVER_BOUND_S = THRESHOLD_S + CLAIM_IDLE_INTERVAL_S + LOADED_MACHINE_MARGIN_S
SLOTS = 2  # [core] parallelism of each engine
FLAGS = tuple(f"f{n}.flag" for n in range(8))  # one watcher (and DAG) each
ROUNDS_BOTH_ALIVE = 3  # rounds of every flag while both schedulers run
MANUAL_RUNS = 12
DEFERRING_RUNS = 6
HOLD_RUNS = 2 * SLOTS  # enough to occupy every slot of both engines
WAIT_S = 60  # every wait is bounded; generous for a loaded 2-core machine

DAGS = """
import os
import time

from engine import DAG, Asset, AssetWatcher, BaseOperator, task
from triggers import DirectoryFileDeleteTrigger, FileTrigger

INBOX = {inbox!r}
JOURNAL = {journal!r}
HOLD_RELEASE = {hold_release!r}
DEFER_RELEASE = {defer_release!r}
HOLD_LIMIT_S = 120


def journal(line):
    fd = os.open(JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\\n").encode())
    finally:
        os.close(fd)


# A try killed with its engine is a failed try: one retry, at once, finishes it.
@task(retries=1, retry_delay=0)
def record(dag_id, run_id, task_id, try_number):
    key = f"{{dag_id}}/{{run_id}}/{{task_id}}"
    journal(f"start {{key}} {{try_number}} {{os.getppid()}}")
    time.sleep(0.5)  # long enough that one engine's two slots cannot take all the work
    journal(f"done {{key}} {{try_number}} {{os.getppid()}}")
    return key


@task(retries=1, retry_delay=0)
def hold(dag_id, run_id, task_id, try_number):
    # Busy until the test releases it: the engine running it is killed mid-work.
    key = f"{{dag_id}}/{{run_id}}/{{task_id}}"
    journal(f"start {{key}} {{try_number}} {{os.getppid()}}")
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not os.path.exists(HOLD_RELEASE):
        if time.monotonic() > deadline:
            raise RuntimeError("the test never released the hold tasks")
        time.sleep(0.05)
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

with DAG("hold", schedule=None):
    hold()


class DeferThenRecord(BaseOperator):
    def execute(self, context):
        key = f"{{context['dag_id']}}/{{context['run_id']}}/{{context['task_id']}}"
        journal(f"defer {{key}} {{context['try_number']}} {{os.getppid()}}")
        self.defer(trigger=FileTrigger(DEFER_RELEASE, poke_interval=0.1), method_name="resume")

    def resume(self, context, event=None):
        key = f"{{context['dag_id']}}/{{context['run_id']}}/{{context['task_id']}}"
        journal(f"done {{key}} {{context['try_number']}} {{os.getppid()}}")
        return key


with DAG("deferring", schedule=None):
    DeferThenRecord(task_id="wait")


def failed_once(context):
    key = f"{{context['dag_id']}}/{{context['run_id']}}/{{context['task_id']}}"
    message = str(context["exception"]).replace(" ", "_")
    journal(f"failcb {{key}} {{context['ti'].try_number}} {{os.getppid()}} {{message}}")


@task(retries=0, on_failure_callback=failed_once)
def doomed(dag_id, run_id, task_id, try_number):
    key = f"{{dag_id}}/{{run_id}}/{{task_id}}"
    journal(f"start {{key}} {{try_number}} {{os.getppid()}}")
    time.sleep(HOLD_LIMIT_S)  # until its engine is killed


with DAG("doomed", schedule=None):
    doomed() >> record()
"""

Entry = tuple[str, str, int, int]  # kind, dag_id/run_id/task_id, try number, engine pid


def _journal(path: Path) -> list[Entry]:
    """Complete journal lines (a line being appended right now is left for the next read)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().split("\n")[:-1]:
        kind, key, try_number, pid = line.split()[:4]  # a failcb line: the message follows
        rows.append((kind, key, int(try_number), int(pid)))
    return rows


def _unfinished_by_pid(rows: list[Entry], prefix: str) -> dict[int, set[tuple[str, int]]]:
    """pid -> (key, try) of the ``prefix`` tasks it started and has not finished."""
    done = {(key, t) for kind, key, t, _ in rows if kind == "done"}
    out: dict[int, set[tuple[str, int]]] = {}
    for kind, key, t, pid in rows:
        if kind == "start" and key.startswith(prefix) and (key, t) not in done:
            out.setdefault(pid, set()).add((key, t))
    return out


def _count(db: Database, model: type, *where: object) -> int:
    return int(
        db.call(
            lambda s: s.execute(select(func.count()).select_from(model).where(*where)).scalar_one()
        )
    )


def _states(db: Database) -> Counter[str]:
    return Counter(db.call(lambda s: list(s.execute(select(DagRun.state)).scalars())))


def _trigger_owner_pids(db: Database) -> list[int | None]:
    """The pid of the job that owns each trigger row (None: unassigned)."""
    query = select(Job.pid).select_from(Trigger).outerjoin(Job, Job.id == Trigger.triggerer_id)
    return list(db.call(lambda s: s.execute(query).scalars().all()))


def _deferred_by_owner(db: Database) -> dict[int, set[str]]:
    """pid of a triggerer -> keys of the deferred tasks whose trigger it owns."""
    query = (
        select(Job.pid, DagRun.dag_id, DagRun.run_id, TaskInstance.task_id)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .join(Trigger, Trigger.id == TaskInstance.trigger_id)
        .join(Job, Job.id == Trigger.triggerer_id)
        .where(TaskInstance.state == "deferred")
    )
    out: dict[int, set[str]] = {}
    for pid, dag_id, run_id, task_id in db.call(lambda s: s.execute(query).all()):
        out.setdefault(int(pid), set()).add(f"{dag_id}/{run_id}/{task_id}")
    return out


def _task_instance(db: Database, key: str) -> TaskInstance:
    dag_id, run_id, task_id = key.split("/")
    query = (
        select(TaskInstance)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(DagRun.dag_id == dag_id, DagRun.run_id == run_id, TaskInstance.task_id == task_id)
    )
    return db.call(lambda s: s.execute(query).scalar_one())


def _create_runs(db: Database, dag_id: str, n: int) -> None:
    def write(session: object) -> None:
        for _ in range(n):
            runs.create_run(
                session,  # type: ignore[arg-type]
                dag_id,
                run_type=runs.MANUAL,
                now=models.utcnow(),
            )

    db.call(write)


def _fire_round(inbox: Path, db: Database, rounds_so_far: int) -> None:
    """Drop every flag file at once; wait until each is taken and every event is consumed by
    a run (nothing left queued), so that the next round queues one event per DAG again."""
    for flag in FLAGS:
        (inbox / flag).write_text(flag)
    wait_for(
        lambda: not any((inbox / flag).exists() for flag in FLAGS),
        timeout=WAIT_S,
        what=f"round {rounds_so_far} of flag files to be taken",
    )
    expected = rounds_so_far * len(FLAGS)
    wait_for(
        lambda: asset_event_count(db) >= expected and _count(db, AssetEventQueue) == 0,
        timeout=WAIT_S,
        what=f"{expected} asset events, each consumed by a run",
    )


def test_two_engines_share_work_and_the_survivor_carries_a_killed_ones(
    migrated_pg_url: str, tmp_path: Path
) -> None:
    dags, inbox, journal = tmp_path / "dags", tmp_path / "inbox", tmp_path / "journal"
    hold_release, defer_release = tmp_path / "hold.release", tmp_path / "defer.release"
    dags.mkdir()
    inbox.mkdir()
    (dags / "ha_flows.py").write_text(
        textwrap.dedent(
            DAGS.format(
                inbox=str(inbox),
                journal=str(journal),
                hold_release=str(hold_release),
                defer_release=str(defer_release),
                flags=FLAGS,
            )
        )
    )
    key = Fernet.generate_key().decode()
    db = Database(migrated_pg_url)

    def env_for(name: str) -> dict[str, str]:
        return engine_env(
            tmp_path / name,
            url=migrated_pg_url,
            dags=dags,
            parallelism=SLOTS,
            heartbeat_s=HEARTBEAT_S,
            SLUICE__CORE__FERNET_KEY=key,
        )

    logs = (tmp_path / "first.log", tmp_path / "second.log")
    first = start_engine(env_for("first"), logs[0])
    second: subprocess.Popen[bytes] | None = None
    survivor_code: int | None = None
    try:
        second = start_engine(env_for("second"), logs[1])
        engines = (first, second)
        wait_for(
            lambda: _count(db, Dag) == 4 + len(FLAGS), timeout=WAIT_S, what="the DAGs to be parsed"
        )

        # Both engines alive: manual work, and rounds of every flag file (both schedulers
        # race to turn each round's events into runs).
        _create_runs(db, "work", MANUAL_RUNS // 2)
        for n in range(1, ROUNDS_BOTH_ALIVE + 1):
            _fire_round(inbox, db, n)
        assert all(proc.poll() is None for proc in engines), "an engine died"

        # Deferrals, then hold tasks that occupy every slot of both engines.
        _create_runs(db, "deferring", DEFERRING_RUNS)
        wait_for(
            lambda: (
                _count(db, TaskInstance, TaskInstance.state == "deferred") == DEFERRING_RUNS
                and _count(db, Trigger, Trigger.kind == "task", Trigger.triggerer_id.is_(None)) == 0
            ),
            timeout=WAIT_S,
            what="every deferring task to defer and its trigger to be claimed",
        )
        _create_runs(db, "hold", HOLD_RUNS)

        def victim_at_work() -> (
            tuple[subprocess.Popen[bytes], set[tuple[str, int]], set[str]] | None
        ):
            """An engine running a task (started, not done) that owns a deferred trigger."""
            running = _unfinished_by_pid(_journal(journal), "hold/")
            deferred = _deferred_by_owner(db)
            for proc in engines:
                if running.get(proc.pid) and deferred.get(proc.pid):
                    return proc, running[proc.pid], deferred[proc.pid]
            return None

        victim, held, victim_deferred = wait_for(
            victim_at_work,
            timeout=WAIT_S,
            what="an engine running a task and owning a deferred task's trigger",
        )
        survivor = second if victim is first else first
        _create_runs(db, "work", MANUAL_RUNS - MANUAL_RUNS // 2)  # queued at the kill
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        killed_at = time.monotonic()

        wait_for(
            lambda: set(_trigger_owner_pids(db)) == {survivor.pid},
            timeout=TAKEOVER_BOUND_S + 10,
            what="the survivor to own every trigger",
            step=0.02,
        )
        takeover_s = time.monotonic() - killed_at

        hold_release.touch()  # the survivor's holds finish, then the victim's re-run
        _fire_round(inbox, db, ROUNDS_BOTH_ALIVE + 1)  # the survivor alone
        defer_release.touch()  # every deferred task resumes, the victim's ones included
        flag_runs = (ROUNDS_BOTH_ALIVE + 1) * len(FLAGS)
        expected_runs = MANUAL_RUNS + DEFERRING_RUNS + HOLD_RUNS + flag_runs
        wait_for(
            lambda: _states(db) == Counter({"success": expected_runs}),
            timeout=2 * WAIT_S,
            what=f"{expected_runs} successful runs (now {dict(_states(db))})",
        )
    finally:
        hold_release.touch()  # nothing left waiting on the test when it failed midway
        defer_release.touch()
        for proc in (first, second):
            if proc is not None and proc.returncode is None and proc.poll() is None:
                survivor_code = stop(proc, timeout=60)

    assert survivor_code == 0, log_tail(logs[0] if survivor is first else logs[1])
    for log in logs:  # concurrent DAG processors and schedulers never trip over each other
        text = log.read_text()
        assert "UniqueViolation" not in text and "pass failed" not in text, text[-3000:]
        assert key not in text  # the Fernet key never reaches a log line
        assert "dag_id=work" in text or "dag_id=deferring" in text  # structured task fields
    assert takeover_s <= TAKEOVER_BOUND_S, f"takeover took {takeover_s:.1f}s"

    _assert_one_run_per_asset_event(db)
    rows = _journal(journal)
    # Every task completed exactly once; only the tries killed with their engine started twice.
    done = Counter(key for kind, key, _, _ in rows if kind == "done")
    tis = db.call(
        lambda s: s.execute(
            select(DagRun.dag_id, DagRun.run_id, TaskInstance.task_id).join(
                TaskInstance, TaskInstance.dag_run_id == DagRun.id
            )
        ).all()
    )
    assert len(tis) == expected_runs
    assert set(done) == {f"{d}/{r}/{t}" for d, r, t in tis}
    # Each task completed once, but a try whose body ended on the victim in the instant
    # before the kill, its outcome not recorded yet, is a try its worker died in: it ran
    # again, once, as try 2 on the survivor (a step's work is at-least-once, its end recorded
    # once).
    for key in (k for k, n in done.items() if n > 1):
        finished = [(t, pid) for kind, k, t, pid in rows if kind == "done" and k == key]
        assert finished == [(1, victim.pid), (2, survivor.pid)], (key, finished)
        ti = _task_instance(db, key)
        assert (ti.state, ti.try_number) == ("success", 2), key
    starts = Counter((k, key, t) for k, key, t, _ in rows if k != "done")
    assert all(n == 1 for n in starts.values()), "a try of a task started twice"
    # The tasks the victim was running when it died finished as try 2, on the survivor.
    for held_key, try_number in held:
        assert try_number == 1
        finished = [(t, pid) for kind, k, t, pid in rows if kind == "done" and k == held_key]
        assert finished == [(2, survivor.pid)], (held_key, finished)
        ti = _task_instance(db, held_key)
        assert (ti.state, ti.try_number) == ("success", 2), held_key
    # The deferred tasks whose trigger the victim owned resumed once (same try), on the survivor.
    for deferred_key in victim_deferred:
        deferred = [t for kind, k, t, _ in rows if kind == "defer" and k == deferred_key]
        resumed = [(t, pid) for kind, k, t, pid in rows if kind == "done" and k == deferred_key]
        assert resumed == [(deferred[0], survivor.pid)] and len(deferred) == 1, deferred_key
    # The triggerer rows of the deferrals are gone once their tasks resumed.
    assert _count(db, Trigger, Trigger.kind == "task") == 0
    # Both engines' executors ran tasks (a worker's parent is its engine process).
    assert {pid for _, _, _, pid in rows} == {first.pid, second.pid}
    listed = invoke("runs", "list", "deferring", "--json", env=env_for("cli"))
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == DEFERRING_RUNS
    db.dispose()


def test_a_task_without_retries_killed_with_its_engine_fails_and_its_callback_runs_once(
    migrated_pg_url: str, tmp_path: Path
) -> None:
    dags, journal, logs_folder = tmp_path / "dags", tmp_path / "journal", tmp_path / "task_logs"
    dags.mkdir()
    unused = tmp_path / "unused"
    (dags / "ha_flows.py").write_text(
        textwrap.dedent(
            DAGS.format(
                inbox=str(unused),
                journal=str(journal),
                hold_release=str(unused),
                defer_release=str(unused),
                flags=(),
            )
        )
    )
    key = Fernet.generate_key().decode()
    db = Database(migrated_pg_url)

    def env_for(name: str) -> dict[str, str]:
        return engine_env(
            tmp_path / name,
            url=migrated_pg_url,
            dags=dags,
            parallelism=SLOTS,
            heartbeat_s=HEARTBEAT_S,
            SLUICE__CORE__FERNET_KEY=key,
            SLUICE__LOGGING__TASK_LOG_FOLDER=str(logs_folder),  # one host: one log folder
        )

    logs = (tmp_path / "first.log", tmp_path / "second.log")
    engines = [start_engine(env_for("first"), logs[0])]
    try:
        engines.append(start_engine(env_for("second"), logs[1]))
        wait_for(lambda: _count(db, Dag) == 4, timeout=WAIT_S, what="the DAGs to be parsed")
        _create_runs(db, "doomed", 1)
        (victim_pid, started) = wait_for(
            lambda: next(iter(_unfinished_by_pid(_journal(journal), "doomed/").items()), None),
            timeout=WAIT_S,
            what="the doomed task to start",
        )
        victim = next(proc for proc in engines if proc.pid == victim_pid)
        survivor = next(proc for proc in engines if proc is not victim)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        wait_for(
            lambda: _states(db) == Counter({"failed": 1}), timeout=WAIT_S, what="the run to fail"
        )
        wait_for(
            lambda: any(kind == "failcb" for kind, *_ in _journal(journal)),
            timeout=WAIT_S,
            what="the failure callback to run",
        )
        survivor_code = stop(survivor, timeout=60)
    finally:
        for proc in engines:
            if proc.poll() is None:
                stop(proc, timeout=60)
    assert survivor_code == 0
    ((task_key, try_number),) = started
    rows = _journal(journal)
    assert [r for r in rows if r[0] == "start"] == [("start", task_key, 1, victim.pid)]
    assert [r for r in rows if r[0] == "failcb"] == [("failcb", task_key, 1, survivor.pid)]
    (line,) = [ln for ln in journal.read_text().splitlines() if ln.startswith("failcb")]
    assert "stopped_heartbeating_at" in line  # the reason, as the callback's exception
    ti = _task_instance(db, task_key)
    assert (ti.state, ti.try_number, try_number) == ("failed", 1, 1)
    dag_id, run_id, _ = task_key.split("/")
    after = _task_instance(db, f"{dag_id}/{run_id}/record")
    assert after.state == "upstream_failed"
    log = read_task_log(logs_folder, dag_id, run_id, "doomed", 1)
    assert "stopped heartbeating at" in log and "running on_failure_callback" in log
    db.dispose()


def _assert_one_run_per_asset_event(db: Database) -> None:
    """Each flag's asset events: every one consumed by exactly one run of its DAG, and each
    of that DAG's runs consumed exactly one (each round queued one event per DAG)."""
    rounds = ROUNDS_BOTH_ALIVE + 1
    assert asset_event_count(db) == rounds * len(FLAGS)
    links = db.call(
        lambda s: s.execute(
            select(DagRunAssetEvent.asset_event_id, DagRun.dag_id, DagRun.id).join(
                DagRun, DagRun.id == DagRunAssetEvent.dag_run_id
            )
        ).all()
    )
    per_event = Counter(event_id for event_id, _, _ in links)
    per_run = Counter(run_pk for _, _, run_pk in links)
    assert len(per_event) == rounds * len(FLAGS) and set(per_event.values()) == {1}, per_event
    assert set(per_run.values()) == {1}, per_run
    for flag in FLAGS:
        name = flag.split(".")[0]
        assert asset_event_count(db, f"flag-{name}") == rounds
        assert _count(db, DagRun, DagRun.dag_id == f"on_{name}") == rounds
        linked = {run_pk for _, dag_id, run_pk in links if dag_id == f"on_{name}"}
        assert len(linked) == rounds
