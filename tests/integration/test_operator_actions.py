"""Operator actions on SQLite and PostgreSQL: ``sluice tasks clear``, ``sluice tasks
set-state``, ``sluice runs cancel`` and the scheduler's ``dagrun_timeout``.

The executor's part is played by its own queries (claim, start, finish), so each test sees
exactly which writes an action makes and which later writes of the executor it refuses;
the scheduler runs on a fake clock. The last tests run the real executor: a running task's
process is stopped when its state is set from outside.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from click.testing import CliRunner
from sqlalchemy import func, select, update

from engine.authoring.deferral import Deferral, TaskDeferred
from engine.cli.main import cli
from engine.db import models
from engine.db.models import AssetEvent, DagRun, TaskInstance, Trigger
from engine.db.queries import actions, deferrals, jobs, runs, tasks
from engine.executor.task_logs import read_task_log
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import DagRunState, JobState, TaskState
from tests.integration.harness import fast_executor_settings, parsed_database, running_executor
from tests.waiting import eventually
from triggers import TimeDeltaTrigger

if TYPE_CHECKING:
    from collections.abc import Iterator
    from contextlib import AbstractAsyncContextManager
    from pathlib import Path

    from engine.config import Config
    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.executor.local import LocalExecutor

pytestmark = pytest.mark.integration

DAGS = """
import os
import time
from datetime import timedelta

from engine import DAG, Asset, task


@task(retries=2)
def extract():
    return 1


@task
def transform(value):
    return value


@task
def load(value):
    return value


with DAG("etl"):
    load(transform(extract()))


@task
def wait():
    return 1


@task
def after(value):
    return value


with DAG("waits"):
    after(wait())


@task
def step():
    return 1


with DAG("slow", dagrun_timeout=timedelta(minutes=10), max_active_runs=1):
    step()


@task(outlets=[Asset("marked")])
def sleeper():
    with open(os.environ["SLUICE_TEST_PID_FILE"], "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(600)


with DAG("long"):
    sleeper()
"""


class FakeClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


class Env:
    def __init__(self, db: Database, cipher: KwargsCipher, config: Config) -> None:
        self.db = db
        self.cipher = cipher
        self.config = config
        self.clock = FakeClock(models.utcnow().replace(microsecond=0))
        self.scheduler = Scheduler(
            db=db, cipher=cipher, settings=SchedulerSettings(), clock=self.clock
        )

    def schedule_once(self) -> None:
        anyio.run(self.scheduler.schedule_once)

    def new_run(self, dag_id: str) -> tuple[int, str, dict[str, int]]:
        """A manual run, admitted and with its first tasks scheduled."""

        def create(session: Any) -> tuple[int, str]:
            pk = runs.create_run(session, dag_id, run_type=runs.MANUAL, now=self.clock())
            assert pk is not None
            return pk, runs.run_id_of(session, pk)

        pk, run_id = self.db.call(create)
        self.schedule_once()
        return pk, run_id, self.ti_ids(pk)

    def ti_ids(self, run_pk: int) -> dict[str, int]:
        state = self.db.call(lambda s: runs.load_run_state(s, run_pk))
        assert state is not None
        return state.ti_ids

    def ti(self, ti_id: int) -> TaskInstance:
        ti = self.db.call(lambda s: s.get(TaskInstance, ti_id))
        assert ti is not None
        return ti

    def state(self, ti_id: int) -> str:
        return str(self.ti(ti_id).state)

    def run_state(self, run_pk: int) -> str:
        run = self.db.call(lambda s: s.get(DagRun, run_pk))
        assert run is not None
        return str(run.state)

    def start(self, ti_id: int) -> int:
        """What an executor does to start a scheduled task: returns its job id."""

        def step(session: Any) -> int:
            job_id = jobs.start_job(session, job_type=tasks.EXECUTOR_JOB)
            session.execute(
                update(TaskInstance)
                .where(TaskInstance.id == ti_id, TaskInstance.state == TaskState.SCHEDULED)
                .values(state=TaskState.QUEUED, executor_job_id=job_id)
            )
            now = self.clock()
            run = tasks.start_task_run(session, ti_id, job_id=job_id, pid=1, hostname="h", now=now)
            assert run is not None
            return job_id

        return self.db.call(step)

    def finish(self, ti_id: int, job_id: int, state: str) -> bool:
        finish = tasks.finish_task
        return self.db.call(
            lambda s: finish(s, ti_id, job_id=job_id, state=state, elapsed_s=1, now=self.clock())
        )

    def run_task(self, ti_id: int, state: str) -> None:
        assert self.finish(ti_id, self.start(ti_id), state)
        self.schedule_once()

    def defer(self, ti_id: int) -> int:
        """Start the task and defer it on a one-hour timer: returns the trigger id."""
        job_id = self.start(ti_id)
        deferral = Deferral.from_exception(
            TaskDeferred(trigger=TimeDeltaTrigger(timedelta(hours=1)), method_name="resume")
        )
        trigger_id = self.db.call(
            lambda s: deferrals.defer_task(
                s,
                self.cipher,
                ti_id,
                job_id=job_id,
                deferral=deferral,
                trigger_timeout=None,
                elapsed_s=1,
            )
        )
        assert trigger_id is not None
        return int(trigger_id)

    def trigger_exists(self, trigger_id: int) -> bool:
        return self.db.call(lambda s: s.get(Trigger, trigger_id)) is not None

    def cli(self, *args: str, input: str | None = None, code: int = 0) -> str:
        result = CliRunner().invoke(cli, list(args), obj={"config": self.config}, input=input)
        assert result.exit_code == code, result.output
        return result.output


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path) -> Iterator[Env]:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "action_dags.py").write_text(textwrap.dedent(DAGS))
    db, config, cipher, _ = parsed_database(migrated_db_url, tmp_path, dags)
    yield Env(db, cipher, _with_url(config, migrated_db_url))  # the CLI's own connection
    db.dispose()


def _with_url(config: Config, url: str) -> Config:
    return replace(config, core=replace(config.core, sql_alchemy_conn=url))


# --- clear --------------------------------------------------------------------------------


@pytest.mark.both_databases
def test_clear_only_failed_with_downstream_reruns_them_and_requeues_the_run(env: Env) -> None:
    run_pk, run_id, tis = env.new_run("etl")
    env.run_task(tis["extract"], TaskState.SUCCESS)
    env.run_task(tis["transform"], TaskState.FAILED)
    assert env.state(tis["load"]) == TaskState.UPSTREAM_FAILED
    assert env.run_state(run_pk) == DagRunState.FAILED
    before = env.ti(tis["transform"])

    # Asked first: "n" changes nothing.
    out = env.cli(
        "tasks", "clear", "etl", "--run", run_id, "-t", "^transform$", "-d", "-f",
        input="n\n", code=1,
    )  # fmt: skip
    assert "transform" in out and "load" in out and "extract" not in out and "Aborted" in out
    assert env.state(tis["transform"]) == TaskState.FAILED

    out = env.cli("tasks", "clear", "etl", "--run", run_id, "-t", "^transform$", "-d", "-f", "-y")
    assert f"run {run_id}: queued" in out
    transform, load = env.ti(tis["transform"]), env.ti(tis["load"])
    assert (transform.state, load.state) == (TaskState.NONE, TaskState.NONE)
    assert transform.try_number == before.try_number == 1  # kept: the next try is try 2
    assert transform.max_tries == 1 + 0  # try_number + retries
    assert env.state(tis["extract"]) == TaskState.SUCCESS  # not failed: not cleared
    assert env.run_state(run_pk) == DagRunState.QUEUED

    env.schedule_once()  # admitted again; transform runs again, then load
    assert env.run_state(run_pk) == DagRunState.RUNNING
    assert env.state(tis["transform"]) == TaskState.SCHEDULED
    env.run_task(tis["transform"], TaskState.SUCCESS)
    assert env.ti(tis["transform"]).try_number == 2
    env.run_task(tis["load"], TaskState.SUCCESS)
    assert env.run_state(run_pk) == DagRunState.SUCCESS


def test_a_cleared_task_gets_its_retries_again(env: Env) -> None:
    run_pk, _, tis = env.new_run("etl")
    extract = tis["extract"]
    for _ in range(2):  # retries=2: tries 1 and 2 fail and wait up_for_retry ...
        job = env.start(extract)
        retry_at = env.clock() + timedelta(minutes=5)
        assert env.db.call(
            lambda s, job=job, at=retry_at: tasks.retry_task(
                s, extract, job_id=job, elapsed_s=1, now=env.clock(), retry_at=at
            )
        )
        env.clock.advance(minutes=5)
        env.schedule_once()
    env.run_task(extract, TaskState.FAILED)  # ... try 3 fails for good
    ti = env.ti(extract)
    assert (ti.state, ti.try_number, ti.max_tries) == (TaskState.FAILED, 3, 2)  # Airflow: retries
    assert env.run_state(run_pk) == DagRunState.FAILED

    env.cli("tasks", "clear", "etl", "-t", "extract", "--yes")
    ti = env.ti(extract)
    assert (ti.state, ti.try_number, ti.max_tries) == (TaskState.NONE, 3, 5)
    assert env.run_state(run_pk) == DagRunState.QUEUED


def test_clearing_a_deferred_task_removes_its_trigger(env: Env) -> None:
    run_pk, run_id, tis = env.new_run("waits")
    trigger_id = env.defer(tis["wait"])
    assert env.state(tis["wait"]) == TaskState.DEFERRED and env.trigger_exists(trigger_id)

    out = env.cli("tasks", "clear", "waits", "--run", run_id, "--yes", "--json")
    assert '"new_state": "none"' in out
    ti = env.ti(tis["wait"])
    assert (ti.state, ti.trigger_id, ti.next_method) == (TaskState.NONE, None, None)
    assert not env.trigger_exists(trigger_id)  # the triggerer stops it at its next sync
    assert env.run_state(run_pk) == DagRunState.RUNNING  # it was not finished
    env.schedule_once()
    assert env.state(tis["wait"]) == TaskState.SCHEDULED


def test_clearing_a_running_task_waits_for_its_executor_to_stop_it(env: Env) -> None:
    _, _, tis = env.new_run("etl")
    job = env.start(tis["extract"])
    env.cli("tasks", "clear", "etl", "--only-running", "-y")
    ti = env.ti(tis["extract"])
    assert (ti.state, ti.executor_job_id) == (TaskState.RESTARTING, job)
    env.schedule_once()
    assert env.state(tis["extract"]) == TaskState.RESTARTING  # never a second process
    changed = env.db.call(lambda s: actions.changed_task_instances(s, [tis["extract"]], job_id=job))
    assert changed == {tis["extract"]: TaskState.RESTARTING}
    # The process's own outcome is refused; once it is gone, the task is none again.
    assert not env.finish(tis["extract"], job, TaskState.SUCCESS)
    release = actions.release_restarted_task
    assert env.db.call(lambda s: release(s, tis["extract"], job_id=job))
    env.schedule_once()
    ti = env.ti(tis["extract"])
    assert (ti.state, ti.try_number, ti.max_tries) == (TaskState.SCHEDULED, 1, 3)


def test_a_restarting_task_of_a_dead_executor_runs_again(env: Env) -> None:
    _, _, tis = env.new_run("etl")
    job = env.start(tis["extract"])
    env.cli("tasks", "clear", "etl", "-y")
    env.db.call(lambda s: jobs.end_job(s, job, state=JobState.FAILED))
    released = env.db.call(lambda s: actions.release_orphaned_restarts(s, threshold_s=10))
    assert released == [tis["extract"]]
    assert env.state(tis["extract"]) == TaskState.NONE


def test_clear_by_date_range_and_bad_input(env: Env) -> None:
    _, _, first = env.new_run("etl")
    env.clock.advance(days=2)
    _, _, second = env.new_run("etl")
    for tis in (first, second):
        env.run_task(tis["extract"], TaskState.FAILED)
    cutoff = (env.clock() - timedelta(days=1)).isoformat()
    env.cli("tasks", "clear", "etl", "--start-date", cutoff, "-f", "-y")
    assert env.state(second["extract"]) == TaskState.NONE
    assert env.state(first["extract"]) == TaskState.FAILED
    assert "no DAG 'nope'" in env.cli("tasks", "clear", "nope", "-y", code=1)
    assert "no run 'r'" in env.cli("tasks", "clear", "etl", "--run", "r", "-y", code=1)
    assert "is not a regex" in env.cli("tasks", "clear", "etl", "-t", "(", "-y", code=1)
    assert "no task instances" in env.cli("tasks", "clear", "etl", "-t", "zzz", "-y")


# --- set-state ----------------------------------------------------------------------------


def test_mark_success_clears_failed_downstream_and_requeues_the_run(env: Env) -> None:
    run_pk, run_id, tis = env.new_run("etl")
    job = env.start(tis["extract"])  # the try fails with retries left: up_for_retry
    later = env.clock() + timedelta(minutes=5)
    retry = tasks.retry_task
    assert env.db.call(
        lambda s: retry(s, tis["extract"], job_id=job, elapsed_s=1, now=env.clock(), retry_at=later)
    )
    assert env.state(tis["extract"]) == TaskState.UP_FOR_RETRY
    out = env.cli("tasks", "set-state", "etl", run_id, "extract", "failed")
    assert "up_for_retry" in out and "failed" in out
    env.schedule_once()
    assert env.state(tis["load"]) == TaskState.UPSTREAM_FAILED
    assert env.run_state(run_pk) == DagRunState.FAILED

    out = env.cli("tasks", "set-state", "etl", run_id, "extract", "success")
    assert env.state(tis["extract"]) == TaskState.SUCCESS
    assert env.state(tis["transform"]) == TaskState.NONE  # cleared: it runs now
    assert env.state(tis["load"]) == TaskState.NONE
    assert env.run_state(run_pk) == DagRunState.QUEUED
    env.schedule_once()
    assert env.state(tis["transform"]) == TaskState.SCHEDULED


def test_mark_a_running_task_success_refuses_its_outcome_and_writes_no_outlet(env: Env) -> None:
    run_pk, run_id, tis = env.new_run("etl")
    job = env.start(tis["extract"])
    env.cli("tasks", "set-state", "etl", run_id, "extract", "success", "--downstream")
    assert [env.state(tis[t]) for t in ("extract", "transform", "load")] == ["success"] * 3
    assert env.ti(tis["extract"]).executor_job_id is None
    assert not env.finish(tis["extract"], job, TaskState.FAILED)  # the process's outcome
    assert env.state(tis["extract"]) == TaskState.SUCCESS
    env.schedule_once()
    assert env.run_state(run_pk) == DagRunState.SUCCESS


def test_set_state_of_a_deferred_task_removes_its_trigger(env: Env) -> None:
    run_pk, run_id, tis = env.new_run("waits")
    trigger_id = env.defer(tis["wait"])
    env.cli("tasks", "set-state", "waits", run_id, "wait", "skipped")
    assert env.state(tis["wait"]) == TaskState.SKIPPED
    assert not env.trigger_exists(trigger_id)
    env.schedule_once()
    assert env.state(tis["after"]) == TaskState.SKIPPED
    assert env.run_state(run_pk) == DagRunState.SUCCESS
    out = env.cli("tasks", "set-state", "waits", run_id, "nope", "failed", code=1)
    assert "no task 'nope'" in out
    out = env.cli("tasks", "set-state", "waits", run_id, "wait", "running", code=2)
    assert "'running' is not one of 'success', 'failed', 'skipped'" in out


# --- cancel -------------------------------------------------------------------------------


@pytest.mark.both_databases
def test_cancel_fails_running_and_deferred_tasks_and_skips_the_rest(env: Env) -> None:
    run_pk, run_id, tis = env.new_run("etl")
    job = env.start(tis["extract"])
    out = env.cli("runs", "cancel", "etl", run_id)
    assert f"run {run_id} of etl: running -> failed" in out
    assert [env.state(tis[t]) for t in ("extract", "transform", "load")] == [
        TaskState.FAILED,
        TaskState.SKIPPED,
        TaskState.SKIPPED,
    ]
    assert env.run_state(run_pk) == DagRunState.FAILED
    # A scheduler that listed the run before the cancel advances it afterwards: its leaf is
    # skipped, so the leaf rule alone would say success; the cancel's state stands.
    env.db.call(lambda s: env.scheduler._advance_run(s, run_pk))
    assert env.run_state(run_pk) == DagRunState.FAILED
    assert not env.finish(tis["extract"], job, TaskState.SUCCESS)
    assert "already ended: failed" in env.cli("runs", "cancel", "etl", run_id, code=1)

    waits_pk, waits_run, waits = env.new_run("waits")
    trigger_id = env.defer(waits["wait"])
    env.cli("runs", "cancel", "waits", waits_run, "--json")
    assert env.state(waits["wait"]) == TaskState.FAILED
    assert env.state(waits["after"]) == TaskState.SKIPPED
    assert not env.trigger_exists(trigger_id)
    env.schedule_once()
    assert env.run_state(waits_pk) == DagRunState.FAILED  # stays failed


# --- dagrun_timeout -----------------------------------------------------------------------


def test_dagrun_timeout_fails_the_run_and_lets_the_next_one_in(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    first_pk, _, first = env.new_run("slow")
    job = env.start(first["step"])
    second_pk, _, second = env.new_run("slow")
    assert env.run_state(second_pk) == DagRunState.QUEUED  # max_active_runs=1

    env.clock.advance(minutes=9, seconds=59)
    env.schedule_once()
    assert env.run_state(first_pk) == DagRunState.RUNNING  # not yet

    env.clock.advance(seconds=1)
    env.schedule_once()
    assert env.run_state(first_pk) == DagRunState.FAILED
    assert env.state(first["step"]) == TaskState.SKIPPED  # running: skipped, and stopped
    assert not env.finish(first["step"], job, TaskState.SUCCESS)
    assert env.run_state(second_pk) == DagRunState.RUNNING  # the next run got its slot
    assert env.state(second["step"]) == TaskState.SCHEDULED
    timed_out = [r for r in caplog.records if getattr(r, "action", "") == "dag_run_timed_out"]
    assert len(timed_out) == 1 and "dagrun_timeout 600s" in timed_out[0].getMessage()
    end = env.db.call(lambda s: s.get(DagRun, first_pk))
    assert end is not None and end.end_date == env.clock()


def test_dagrun_timeout_leaves_dags_without_one_alone(env: Env) -> None:
    run_pk, _, _ = env.new_run("etl")
    env.clock.advance(days=30)
    env.schedule_once()
    assert env.run_state(run_pk) == DagRunState.RUNNING


# --- the real executor stops what runs for a changed task ---------------------------------


def executor(env: Env) -> AbstractAsyncContextManager[LocalExecutor]:
    return running_executor(env.db, env.cipher, fast_executor_settings(env.config))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_running_task_marked_success_is_stopped(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("SLUICE_TEST_PID_FILE", str(pid_file))
    run_pk, run_id, tis = await anyio.to_thread.run_sync(env.new_run, "long")
    with anyio.fail_after(60):
        async with executor(env) as local:
            await eventually(lambda: _true_async(pid_file.exists() and pid_file.read_text()))
            pid = int(pid_file.read_text())
            assert _alive(pid)
            await anyio.to_thread.run_sync(
                lambda: env.cli("tasks", "set-state", "long", run_id, "sleeper", "success")
            )
            await eventually(lambda: _true_async(not _alive(pid)), within=30)
            await eventually(lambda: _true_async(local.running == 0), within=30)
    ti = env.ti(tis["sleeper"])
    assert ti.state == TaskState.SUCCESS
    count = env.db.call(
        lambda s: s.execute(select(func.count()).select_from(AssetEvent)).scalar_one()
    )
    assert count == 0  # marking success records no outlet event
    log = read_task_log(env.config.logging.task_log_folder, "long", run_id, "sleeper", 1)
    assert "state externally set to success; stopping" in log
    await env.scheduler.schedule_once()
    assert env.run_state(run_pk) == DagRunState.SUCCESS


async def _true_async(value: Any) -> Any:
    return value
