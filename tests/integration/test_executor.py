"""The local executor on SQLite and PostgreSQL: real child processes, real DAG files.

Each test parses a small DAG file with the real DAG processor, creates a run, marks the
task instances it wants ``scheduled`` (what the scheduler does) and runs the executor
in-process; trigger firings are written the way the persister writes them.
"""

from __future__ import annotations

import os
import signal
import textwrap
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import insert, select, update

from engine.db import models
from engine.db.database import Database
from engine.db.models import Dag, DagTask, Job, TaskInstance, Trigger
from engine.db.queries import callbacks, deferrals, jobs, runs
from engine.execution.protocol import EXIT_PARENT_GONE, TaskSpec
from engine.executor import admission
from engine.executor.local import LocalExecutor
from engine.executor.task_logs import TaskLogNotFoundError, log_path, read_task_log
from engine.executor.task_specs import build_context
from engine.scheduler import orphans
from engine.states import JobState, TaskState, TriggerKind
from engine.triggerer.outbox import FiredEvent, Outbox
from engine.triggerer.persister import Persister
from tests.integration.harness import (
    fast_executor_settings,
    parsed_database,
    running_executor,
    silent_executor_job,
)
from tests.persisting import persist
from tests.waiting import eventually, wait_until
from triggers.base import TriggerEvent
from triggers.serde import deserialize_value, dumps, loads

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from engine.crypto import KwargsCipher
    from engine.dag_processing.processor import DagProcessor
    from engine.executor.settings import ExecutorSettings

pytestmark = pytest.mark.integration

DAG_FILE = """
import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta

from engine import DAG, BaseOperator, task
from triggers.base import StartTriggerArgs
from triggers.temporal import TimeDeltaTrigger

log = logging.getLogger("user.task")
FAR = timedelta(days=1)


class Wait(BaseOperator):
    def execute(self, context):
        print("waiting on a trigger")
        self.defer(
            trigger=TimeDeltaTrigger(FAR),
            method_name="done",
            kwargs={"started_try": context["try_number"]},
        )

    def done(self, context, event, started_try):
        print("resumed with", event)
        return {"event": event, "started_try": started_try}


class Loop(BaseOperator):
    def __init__(self, *, count, delay_s, **kwargs):
        super().__init__(**kwargs)
        self.count, self.delay_s = count, delay_s

    def execute(self, context, index=0, event=None):
        if event is not None:
            index += 1
        if index >= self.count:
            return index
        self.defer(
            trigger=TimeDeltaTrigger(timedelta(seconds=self.delay_s)),
            method_name="execute",
            kwargs={"index": index},
        )


class SlowAfterResume(BaseOperator):
    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(FAR), method_name="work")

    def work(self, context, event):
        time.sleep(60)


class Stubborn(BaseOperator):
    def execute(self, context):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                time.sleep(60)
            except BaseException:
                print("ignoring", flush=True)


class FromTrigger(BaseOperator):
    start_from_trigger = True
    start_trigger_args = StartTriggerArgs(
        trigger_cls="triggers.temporal.DateTimeTrigger",
        trigger_kwargs={"moment": datetime(2030, 1, 1, tzinfo=UTC)},
        next_method="done",
        next_kwargs={"note": "kept"},
        timeout=timedelta(hours=1),
    )

    def done(self, context, event, note):
        return {"event": event, "note": note}


@task
def ok(triggering_asset_events, try_number):
    print("hello from ok")
    log.warning("logged from ok")
    return {"n": 1, "try": try_number}


@task
def boom():
    raise ValueError("boom went the task")


@task(retries=1, retry_delay=timedelta(0))
def flaky(try_number):
    if try_number == 1:
        raise RuntimeError("the first try fails")
    return try_number


@task
def leaky():
    import os

    print("fernet key setting:", os.environ.get("SLUICE__CORE__FERNET_KEY"))
    print("user setting:", os.environ.get("MY_SETTING"))
    raise RuntimeError("could not log in with s3cr3t-Passw0rd")


@task
def sleeper():
    print("sleeping", flush=True)
    time.sleep(120)


@task
def leaves_a_process():
    import subprocess
    # inherits the task's output pipes, which the executor then never sees closed
    child = subprocess.Popen(["sleep", "60"])
    print("started", child.pid)
    return child.pid


@task
async def async_ok(try_number):
    await asyncio.sleep(0)  # a real suspension: the body runs in an event loop
    print("ran the async body")
    return {"async": True, "try": try_number}


@task
async def async_boom():
    await asyncio.sleep(0)
    raise ValueError("the async body failed")


with DAG("exec"):
    Wait(task_id="wait")
    ok()
    boom()
    flaky()
    leaky()
    sleeper()
    leaves_a_process()
    async_ok()
    async_boom()
    Loop(task_id="loop", count=3, delay_s=0.05)
    SlowAfterResume(task_id="slow", execution_timeout=timedelta(seconds=4))
    Stubborn(task_id="stubborn", execution_timeout=timedelta(seconds=4))
    FromTrigger(task_id="from_trigger")
"""


class Env:
    def __init__(
        self,
        db: Database,
        cipher: KwargsCipher,
        settings: ExecutorSettings,
        processor: DagProcessor,
    ) -> None:
        self.db = db
        self.cipher = cipher
        self.settings = settings
        self.processor = processor

    def new_run(self) -> tuple[int, str, dict[str, int]]:
        """A manual run of ``exec``: (run pk, run_id, task_id -> task instance id)."""

        def create(session: Any) -> tuple[int, str, dict[str, int]]:
            pk = runs.create_run(session, "exec", run_type=runs.MANUAL, now=models.utcnow())
            state = runs.load_run_state(session, pk)
            assert state is not None
            run_id = session.execute(
                select(models.DagRun.run_id).where(models.DagRun.id == pk)
            ).scalar_one()
            return pk, str(run_id), state.ti_ids

        return self.db.call(create)

    def schedule(self, *ti_ids: int) -> None:
        self.db.call(
            lambda s: s.execute(
                update(TaskInstance)
                .where(TaskInstance.id.in_(ti_ids))
                .values(state=TaskState.SCHEDULED)
            )
        )

    def ti(self, ti_id: int) -> TaskInstance:
        return self.db.call(lambda s: s.get(TaskInstance, ti_id))

    async def until(self, ti_id: int, *states: str, within: float = 20) -> TaskInstance:
        async def in_state() -> TaskInstance | None:
            ti = await self.db.run(lambda s: s.get(TaskInstance, ti_id))
            return ti if ti.state in states else None

        return await eventually(in_state, within=within)

    def fire(self, trigger_id: int, payload: Any) -> None:
        """What the persister writes when a task's trigger fires."""
        persister = Persister(db=self.db, outbox=Outbox())
        item = FiredEvent(trigger_id=trigger_id, event=TriggerEvent(payload), seq=None, fired_at=0)
        persist(self.db, persister, [item])

    def log(self, run_id: str, task_id: str, try_number: int | None = None) -> str:
        folder = self.settings.task_log_folder
        return read_task_log(folder, "exec", run_id, task_id, try_number)

    @asynccontextmanager
    async def executor(self, **overrides: Any) -> AsyncIterator[LocalExecutor]:
        async with running_executor(
            self.db, self.cipher, replace(self.settings, **overrides)
        ) as executor:
            yield executor


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "exec_dag.py").write_text(textwrap.dedent(DAG_FILE))
    db, config, cipher, processor = parsed_database(migrated_db_url, tmp_path, dags)
    settings = fast_executor_settings(config)
    yield Env(db, cipher, settings, processor)
    db.dispose()


@pytest.mark.both_databases
async def test_success_stores_the_return_value_and_the_output_in_the_log(env: Env) -> None:
    _, run_id, tis = env.new_run()
    env.schedule(tis["ok"])
    with anyio.fail_after(30):
        async with env.executor() as executor:
            ti = await env.until(tis["ok"], TaskState.SUCCESS)
            await wait_idle(executor)
    assert deserialize_value(ti.xcoms["return_value"]) == {"n": 1, "try": 1}
    assert (ti.try_number, ti.start_date is not None, ti.end_date is not None) == (1, True, True)
    assert ti.executor_job_id is None and ti.hostname
    text = env.log(run_id, "ok")
    assert "hello from ok" in text and "logged from ok" in text
    assert "try 1 of 1: starting" in text and "task succeeded" in text
    job = env.db.call(lambda s: s.execute(select(Job).where(Job.job_type == "executor")).scalar())
    assert job.state == JobState.SUCCESS  # ended cleanly on shutdown


async def test_a_process_left_holding_the_tasks_output_is_killed_and_the_try_recorded(
    env: Env,
) -> None:
    # The executor records a step once the task process closed its output after reporting,
    # without waiting for its exit; a process the task left running holds the output open,
    # and the try is recorded at the task process's exit, its group killed, as before.
    _, run_id, tis = env.new_run()
    env.schedule(tis["leaves_a_process"])
    with anyio.fail_after(30):
        async with env.executor() as executor:
            ti = await env.until(tis["leaves_a_process"], TaskState.SUCCESS, TaskState.FAILED)
            await wait_idle(executor)
    assert ti.state == TaskState.SUCCESS
    pid = deserialize_value(ti.xcoms["return_value"])
    assert f"started {pid}" in env.log(run_id, "leaves_a_process")
    await wait_until(lambda: not _alive(pid), within=10)


def _alive(pid: int) -> bool:
    """Running (a killed child not reaped yet is a zombie: dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def test_an_async_task_runs_and_its_failure_fails_the_try(env: Env) -> None:
    """An ``async def`` under @task is run to completion in the task process: its return
    value is the result and what it raises fails the try (never success unrun)."""
    _, run_id, tis = env.new_run()
    env.schedule(tis["async_ok"], tis["async_boom"])
    with anyio.fail_after(30):
        async with env.executor() as executor:
            ok = await env.until(tis["async_ok"], TaskState.SUCCESS, TaskState.FAILED)
            boom = await env.until(tis["async_boom"], TaskState.SUCCESS, TaskState.FAILED)
            await wait_idle(executor)
    assert ok.state == TaskState.SUCCESS
    assert deserialize_value(ok.xcoms["return_value"]) == {"async": True, "try": 1}
    text = env.log(run_id, "async_ok")
    assert "ran the async body" in text and "never awaited" not in text
    assert boom.state == TaskState.FAILED and boom.xcoms is None
    assert "ValueError: the async body failed" in env.log(run_id, "async_boom")


async def test_a_task_never_sees_or_logs_the_engine_secrets(env: Env, monkeypatch) -> None:
    """The task's process does not inherit the Fernet key setting, and a configured secret
    it prints (here in an exception's message and traceback) is replaced in its log."""
    monkeypatch.setenv("SLUICE__CORE__FERNET_KEY", "a-fernet-key-from-the-environment")
    monkeypatch.setenv("MY_SETTING", "kept")
    _, run_id, tis = env.new_run()
    env.schedule(tis["leaky"])
    with anyio.fail_after(30):
        async with env.executor(secrets=("s3cr3t-Passw0rd",)) as executor:
            await env.until(tis["leaky"], TaskState.FAILED)
            await wait_idle(executor)
    text = env.log(run_id, "leaky")
    assert "fernet key setting: None" in text and "user setting: kept" in text
    assert "s3cr3t-Passw0rd" not in text
    assert "RuntimeError: could not log in with ***" in text


async def test_failure_records_the_traceback_in_the_log(env: Env) -> None:
    _, run_id, tis = env.new_run()
    env.schedule(tis["boom"])
    with anyio.fail_after(30):
        async with env.executor():
            ti = await env.until(tis["boom"], TaskState.FAILED)
    assert ti.end_date is not None and ti.xcoms is None
    text = env.log(run_id, "boom")
    assert "Traceback (most recent call last)" in text
    assert "ValueError: boom went the task" in text
    assert "task failed: ValueError: boom went the task" in text


async def test_a_failed_try_is_retried_with_a_new_try_number_and_log(env: Env) -> None:
    _, run_id, tis = env.new_run()
    env.schedule(tis["flaky"])
    with anyio.fail_after(30):
        async with env.executor():
            await env.until(tis["flaky"], TaskState.UP_FOR_RETRY)
            env.schedule(tis["flaky"])  # the scheduler's part once the retry delay passed
            ti = await env.until(tis["flaky"], TaskState.SUCCESS)
    assert ti.try_number == 2
    assert deserialize_value(ti.xcoms["return_value"]) == 2
    first = env.log(run_id, "flaky", 1)
    assert "RuntimeError: the first try fails" in first and "it will be retried" in first
    assert "try 2 of 2: starting" in env.log(run_id, "flaky")  # the latest try by default
    with pytest.raises(TaskLogNotFoundError, match="try 3"):
        env.log(run_id, "flaky", 3)


@pytest.mark.both_databases
async def test_deferral_frees_the_slot_and_stores_an_encrypted_trigger(env: Env) -> None:
    _, run_id, tis = env.new_run()
    env.schedule(tis["wait"])
    with anyio.fail_after(30):
        async with env.executor(parallelism=1) as executor:
            await env.until(tis["wait"], TaskState.RUNNING, TaskState.DEFERRED)
            env.schedule(tis["ok"])  # only runs once "wait" gave its slot back
            ok = await env.until(tis["ok"], TaskState.SUCCESS)
            wait = await env.until(tis["wait"], TaskState.DEFERRED)
            await wait_idle(executor)
    assert ok.start_date > wait.start_date
    assert (wait.next_method, loads(wait.next_kwargs)) == ("done", {"started_try": 1})
    assert wait.trigger_timeout is None and wait.deferral_count == 1
    trigger = env.db.call(lambda s: s.get(Trigger, wait.trigger_id))
    assert trigger.kind == TriggerKind.TASK
    assert trigger.classpath == "triggers.temporal.DateTimeTrigger"
    assert "moment" not in trigger.kwargs  # stored encrypted
    moment = env.cipher.decrypt_kwargs(trigger.kwargs)["moment"]
    assert moment > datetime.now(UTC) + timedelta(hours=23)
    assert "waiting on a trigger" in env.log(run_id, "wait")


async def test_resumed_task_gets_the_event_and_its_defer_kwargs(env: Env) -> None:
    _, run_id, tis = env.new_run()
    env.schedule(tis["wait"])
    with anyio.fail_after(30):
        async with env.executor():
            wait = await env.until(tis["wait"], TaskState.DEFERRED)
            env.fire(wait.trigger_id, {"answer": 42})
            ti = await env.until(tis["wait"], TaskState.SUCCESS)
    result = deserialize_value(ti.xcoms["return_value"])
    assert result == {"event": {"answer": 42}, "started_try": 1}
    assert ti.try_number == 1 and ti.next_method is None and ti.trigger_id is None
    text = env.log(run_id, "wait")
    assert text.count("=== ") == 4  # start, deferred, resume, succeeded: one file per try
    assert "resuming at done() after 1 deferral(s)" in text


@pytest.mark.both_databases
async def test_tasks_another_process_schedules_or_resumes_are_claimed_without_a_poll(
    env: Env, migrated_db_url: str
) -> None:
    """With an hour's claim poll, only the wake-up (PostgreSQL LISTEN/NOTIFY from migration
    0019's row triggers; inotify on a SQLite database's directory) can make the executor
    claim what another process (a Database of its own) made scheduled: a ready task, then
    the same task resumed when its trigger fires."""
    _, _, tis = env.new_run()
    other = Env(Database(migrated_db_url), env.cipher, env.settings, env.processor)
    try:
        with anyio.fail_after(60):
            async with env.executor(poll_interval_s=3600.0):
                other.schedule(tis["wait"])
                wait = await env.until(tis["wait"], TaskState.DEFERRED, within=30)
                other.fire(wait.trigger_id, {"answer": 42})
                ti = await env.until(tis["wait"], TaskState.SUCCESS, within=30)
    finally:
        other.db.dispose()
    assert deserialize_value(ti.xcoms["return_value"])["event"] == {"answer": 42}


async def test_task_deferring_several_times_through_the_real_triggerer(env: Env) -> None:
    from engine.triggerer.settings import TriggererSettings
    from engine.triggerer.triggerer import Triggerer

    _, run_id, tis = env.new_run()
    env.schedule(tis["loop"])
    settings = TriggererSettings(
        capacity=100,
        heartbeat_s=0.2,
        health_check_threshold_s=1.0,
        claim_idle_interval_s=0.05,
        shutdown_grace_s=2,
    )
    triggerer = Triggerer(db=env.db, cipher=env.cipher, settings=settings)
    with anyio.fail_after(40):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            async with env.executor():
                ti = await env.until(tis["loop"], TaskState.SUCCESS, within=35)
            triggerer.shutdown()
    assert deserialize_value(ti.xcoms["return_value"]) == 3
    assert ti.deferral_count == 3 and ti.try_number == 1
    assert env.log(run_id, "loop").count("resuming at execute() after") == 3


async def test_execution_timeout_counts_the_time_spent_deferred(env: Env) -> None:
    _, run_id, tis = env.new_run()
    env.schedule(tis["slow"])
    with anyio.fail_after(30):
        async with env.executor():
            slow = await env.until(tis["slow"], TaskState.DEFERRED)
            # The deferral may not outlive the try's deadline (start + 4 s).
            assert slow.trigger_timeout <= slow.start_date + timedelta(seconds=4)
            env.fire(slow.trigger_id, None)
            ti = await env.until(tis["slow"], TaskState.FAILED)
    elapsed = (ti.end_date - ti.start_date).total_seconds()
    assert 4 <= elapsed < 12
    text = env.log(run_id, "slow")
    assert "execution_timeout (4s) exceeded after 4." in text
    assert "across 1 deferral" in text


@pytest.mark.parametrize("parallelism", [1, 4])
async def test_a_deferral_past_the_execution_deadline_fails_the_task(
    env: Env, parallelism: int
) -> None:
    # As under `sluice run` (no wake-up from other connections' commits on SQLite); at
    # parallelism 1 the deferral's record finds the one slot's executor saturated: the task
    # another connection schedules again must still be claimed, by the poll.
    _, run_id, tis = env.new_run()
    env.schedule(tis["slow"])
    settings = replace(env.settings, parallelism=parallelism)
    with anyio.fail_after(30):
        async with running_executor(env.db, env.cipher, settings, watch_commits=False):
            await env.until(tis["slow"], TaskState.DEFERRED)
            # What the scheduler does every loop; the deferral ends at the try's deadline.
            await wait_until(lambda: env.db.call(deferrals.fail_timed_out_deferrals), within=10)
            ti = await env.until(tis["slow"], TaskState.FAILED)
    assert ti.try_number == 1
    assert "execution_timeout (4s) exceeded" in env.log(run_id, "slow")


async def test_a_task_ignoring_its_timeout_is_killed(env: Env) -> None:
    _, run_id, tis = env.new_run()
    env.schedule(tis["stubborn"])
    with anyio.fail_after(30):
        async with env.executor():
            await env.until(tis["stubborn"], TaskState.FAILED)
    text = env.log(run_id, "stubborn")
    assert "ignoring" in text
    assert "did not stop when interrupted and its process was killed" in text


async def test_a_killed_task_process_fails_with_the_exit_reason(env: Env) -> None:
    _, run_id, tis = env.new_run()
    env.schedule(tis["sleeper"])
    with anyio.fail_after(30):
        async with env.executor() as executor:
            running = await env.until(tis["sleeper"], TaskState.RUNNING)
            await wait_for_log(env, run_id, "sleeper", "sleeping")
            os.kill(running.pid, signal.SIGKILL)
            ti = await env.until(tis["sleeper"], TaskState.FAILED)
            await wait_idle(executor)
    assert ti.end_date is not None
    assert "task process exited with code -9 (signal SIGKILL)" in env.log(run_id, "sleeper")


async def test_shutdown_interrupts_running_tasks_which_rerun_as_the_same_try(env: Env) -> None:
    _, run_id, tis = env.new_run()
    env.schedule(tis["sleeper"])
    with anyio.fail_after(30):
        async with env.executor(shutdown_grace_s=0.2) as executor:
            await env.until(tis["sleeper"], TaskState.RUNNING)
            await wait_for_log(env, run_id, "sleeper", "sleeping")
            executor.shutdown()
            ti = await env.until(tis["sleeper"], TaskState.SCHEDULED)
    assert (ti.try_number, ti.executor_job_id, ti.pid) == (0, None, None)
    assert "interrupted by the executor shutting down" in env.log(run_id, "sleeper", 1)


async def test_cancelling_the_executor_kills_its_children_and_leaves_them_recoverable(
    env: Env,
) -> None:
    _, run_id, tis = env.new_run()
    env.schedule(tis["sleeper"])
    executor = LocalExecutor(db=env.db, cipher=env.cipher, settings=env.settings)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(executor.run)
            running = await env.until(tis["sleeper"], TaskState.RUNNING)
            await wait_for_log(env, run_id, "sleeper", "sleeping")
            tg.cancel_scope.cancel()  # a hard stop: no graceful shutdown
    with pytest.raises(ProcessLookupError):
        os.kill(running.pid, 0)  # killed and reaped
    now = models.utcnow()
    recover = partial(orphans.recover_orphaned_tasks, threshold_s=60, now=now)
    recovery = env.db.call(recover)
    assert [lost.facts.ti_id for lost in recovery.lost] == [tis["sleeper"]]  # its job ended with it
    ti = env.ti(tis["sleeper"])  # retries=0: its one try failed with its process
    assert (ti.state, ti.try_number, ti.next_method, ti.end_date) == ("failed", 1, None, now)


async def test_start_from_trigger_defers_without_a_worker_then_resumes(env: Env) -> None:
    _, run_id, tis = env.new_run()
    ti_id = tis["from_trigger"]

    def start(session: Any) -> bool:
        runs.set_task_states(
            session,
            session.get(TaskInstance, ti_id).dag_run_id,
            {"from_trigger": "scheduled"},
            now=models.utcnow(),
        )
        return deferrals.start_from_trigger(session, env.cipher, ti_id)

    token = env.db.call(lambda s: s.get(DagTask, ("exec", "from_trigger")).start_trigger)
    assert token and "DateTimeTrigger" not in token  # stored encrypted
    await env.processor.parse_once()  # unchanged args: the row is left alone
    assert env.db.call(lambda s: s.get(DagTask, ("exec", "from_trigger")).start_trigger) == token
    assert env.db.call(start)
    ti = env.ti(ti_id)
    assert (ti.state, ti.next_method, loads(ti.next_kwargs)) == (
        "deferred",
        "done",
        {"note": "kept"},
    )
    assert ti.try_number == 1 and ti.trigger_timeout is not None
    trigger = env.db.call(lambda s: s.get(Trigger, ti.trigger_id))
    assert env.cipher.decrypt_kwargs(trigger.kwargs)["moment"] == datetime(2030, 1, 1, tzinfo=UTC)
    with pytest.raises(TaskLogNotFoundError):
        env.log(run_id, "from_trigger")  # no worker ran it
    assert not env.db.call(lambda s: deferrals.start_from_trigger(s, env.cipher, ti_id))  # once
    env.fire(ti.trigger_id, "fired")
    with anyio.fail_after(30):
        async with env.executor():
            done = await env.until(ti_id, TaskState.SUCCESS)
    assert deserialize_value(done.xcoms["return_value"]) == {"event": "fired", "note": "kept"}
    assert done.try_number == 1


@pytest.mark.both_databases
async def test_two_executors_never_run_the_same_task(env: Env) -> None:
    tis = [env.new_run()[2]["ok"] for _ in range(6)]
    env.schedule(*tis)
    with anyio.fail_after(40):
        async with env.executor(parallelism=2) as one, env.executor(parallelism=2) as two:
            for ti_id in tis:
                await env.until(ti_id, TaskState.SUCCESS)
            await wait_idle(one)
            await wait_idle(two)
    assert one.stats.claimed + two.stats.claimed == len(tis)
    assert all(env.ti(ti_id).try_number == 1 for ti_id in tis)


async def test_a_full_disk_under_the_log_does_not_lose_the_outcome(env: Env, capfd) -> None:
    _, run_id, tis = env.new_run()
    path = log_path(env.settings.task_log_folder, "exec", run_id, "ok", 1)
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/full")  # every write fails with ENOSPC
    env.schedule(tis["ok"])
    with anyio.fail_after(30):
        async with env.executor():
            ti = await env.until(tis["ok"], TaskState.SUCCESS)
    assert deserialize_value(ti.xcoms["return_value"]) == {"n": 1, "try": 1}
    err = capfd.readouterr().err
    assert "unwritable" in err and "hello from ok" in err  # the log went to stderr


def test_a_task_process_exits_when_its_executor_goes(env: Env) -> None:
    import subprocess
    import sys

    _, run_id, tis = env.new_run()
    fileloc = env.db.call(lambda s: s.get(Dag, "exec").fileloc)
    context = build_context(
        dag_id="exec",
        run_id=run_id,
        task_id="sleeper",
        try_number=1,
        events=[],
        default_deferrable=False,
    )
    spec = TaskSpec(
        ti_id=tis["sleeper"],
        dag_id="exec",
        run_id=run_id,
        task_id="sleeper",
        fileloc=fileloc,
        try_number=1,
        try_started_at=models.utcnow().isoformat(),
        context=dumps(context),
    )
    command = [
        sys.executable,
        "-P",
        "-m",
        "engine.execution.task_runner",
        "--ti-id",
        str(spec.ti_id),
    ]
    pipe = subprocess.PIPE
    with subprocess.Popen(command, stdin=pipe, stdout=pipe, stderr=pipe) as child:
        try:
            assert child.stdin is not None and child.stderr is not None
            child.stdin.write(spec.to_json().encode() + b"\n")
            child.stdin.flush()
            assert child.stderr.readline() == b"sleeping\n"  # the task is running
            child.stdin.close()  # what the death of the executor does to the pipe
            assert child.wait(timeout=10) == EXIT_PARENT_GONE
        finally:
            child.kill()


@pytest.mark.both_databases
def test_recovery_fails_or_retries_the_running_tries_of_a_dead_executor(env: Env) -> None:
    _, _, tis = env.new_run()
    old = models.utcnow() - timedelta(minutes=5)

    def seed(session: Any) -> tuple[int, int]:
        dead = session.execute(
            insert(Job)
            .values(job_type="executor", state="running", latest_heartbeat=old, start_date=old)
            .returning(Job.id)
        ).scalar_one()
        alive = jobs.start_job(session, job_type="executor")
        rows = {
            "ok": (TaskState.RUNNING, dead, None),  # retries=0
            "flaky": (TaskState.RUNNING, dead, "resume"),  # retries=1, a resumed step
            "wait": (TaskState.QUEUED, dead, "done"),  # never started
            "boom": (TaskState.RUNNING, alive, None),
            "loop": (TaskState.DEFERRED, None, "step"),  # held by no executor
        }
        for task_id, (state, job, method) in rows.items():
            session.execute(
                update(TaskInstance)
                .where(TaskInstance.id == tis[task_id])
                .values(state=state, executor_job_id=job, next_method=method, try_number=1)
            )
        return dead, alive

    dead, _ = env.db.call(seed)
    now = models.utcnow()
    recovery = env.db.call(partial(orphans.recover_orphaned_tasks, threshold_s=10, now=now))
    assert recovery.requeued == [tis["wait"]]
    lost = {t.facts.task_id: t for t in recovery.lost}
    assert sorted(lost) == ["flaky", "ok"]
    assert f"executor (job {dead}" in lost["ok"].reason
    assert "stopped heartbeating at" in lost["ok"].reason
    ok, flaky, wait = env.ti(tis["ok"]), env.ti(tis["flaky"]), env.ti(tis["wait"])
    assert (ok.state, ok.try_number, ok.executor_job_id, ok.end_date) == ("failed", 1, None, now)
    assert (flaky.state, flaky.try_number, flaky.next_method) == ("up_for_retry", 1, None)
    assert flaky.next_retry_at == now == lost["flaky"].retry_at  # its retry_delay: 0
    # not started: back to scheduled, its try not consumed, resuming where it deferred
    assert (wait.state, wait.try_number, wait.next_method) == ("scheduled", 1, "done")
    assert env.ti(tis["boom"]).state == "running"  # its executor is alive
    assert env.ti(tis["loop"]).state == "deferred"
    requests = env.db.call(callbacks.pending_callback_requests)
    by_ti = {r.data[callbacks.LOST_TRY]["ti_id"]: r.data[callbacks.LOST_TRY] for r in requests}
    assert sorted(by_ti) == sorted([tis["ok"], tis["flaky"]])
    assert (by_ti[tis["ok"]]["state"], by_ti[tis["ok"]]["retry_at"]) == ("failed", None)
    assert by_ti[tis["flaky"]]["state"] == "up_for_retry"
    again = env.db.call(partial(orphans.recover_orphaned_tasks, threshold_s=10, now=now))
    assert (again.requeued, again.lost) == ([], [])  # once


def test_a_silent_executor_keeps_its_running_tries_until_the_task_heartbeat_timeout(
    env: Env,
) -> None:
    """Silent for 60 s: its queued try is requeued (health threshold 10 s), its running try
    is kept (it may only have lost the database for a while) until 300 s of silence."""
    _, _, tis = env.new_run()

    def seed(session: Any) -> None:
        job = silent_executor_job(session)
        for task_id, state in (("ok", TaskState.RUNNING), ("wait", TaskState.QUEUED)):
            session.execute(
                update(TaskInstance)
                .where(TaskInstance.id == tis[task_id])
                .values(state=state, executor_job_id=job, try_number=1)
            )

    env.db.call(seed)
    now = models.utcnow()
    recover = partial(
        orphans.recover_orphaned_tasks, threshold_s=10, running_threshold_s=300, now=now
    )
    recovery = env.db.call(recover)
    assert (recovery.requeued, recovery.lost) == ([tis["wait"]], [])
    assert env.ti(tis["ok"]).state == "running"
    later = partial(orphans.recover_orphaned_tasks, threshold_s=10, running_threshold_s=30, now=now)
    assert [t.facts.task_id for t in env.db.call(later).lost] == ["ok"]
    assert env.ti(tis["ok"]).state == "failed"


@pytest.mark.both_databases
def test_claims_never_hand_out_a_task_twice(env: Env) -> None:
    tis = list(env.new_run()[2].values())
    env.schedule(*tis)
    now = models.utcnow()
    first = env.db.call(lambda s: admission.claim_task_instances(s, job_id=1, limit=3, now=now))
    rest = env.db.call(lambda s: admission.claim_task_instances(s, job_id=2, limit=50, now=now))
    assert len(first) == 3 and not set(first) & set(rest)
    assert sorted(first + rest) == sorted(tis)


async def wait_idle(executor: LocalExecutor) -> None:
    await wait_until(lambda: executor.running == 0)


async def wait_for_log(env: Env, run_id: str, task_id: str, text: str) -> None:
    def present() -> bool:
        try:
            return text in env.log(run_id, task_id)
        except TaskLogNotFoundError:
            return False

    await wait_until(present)
