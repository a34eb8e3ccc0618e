"""Retries with a delay on SQLite and PostgreSQL: a failed try with tries left waits
``up_for_retry`` (no executor slot, its run still running) until ``retry_delay`` has passed by
the scheduler's clock, then is ``scheduled`` for its next try.

The scheduler runs on a fake clock, except in the last test: the real executor and
scheduler, whose tries are shown spaced by ``retry_delay`` from the times in the task logs.
"""

from __future__ import annotations

import json
import re
import textwrap
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from click.testing import CliRunner
from cryptography.fernet import Fernet
from sqlalchemy import update

from engine.cli.main import cli
from engine.config import load_config
from engine.crypto import KwargsCipher
from engine.dag_processing.processor import DagProcessor, DagProcessorSettings
from engine.db import models
from engine.db.database import Database
from engine.db.models import Dag, DagRun, TaskInstance
from engine.db.queries import jobs, runs, tasks
from engine.execution.protocol import TaskResult
from engine.executor import admission
from engine.executor.local import LocalExecutor
from engine.executor.outcomes import Decision, Outcome, decide_outcome
from engine.executor.settings import ExecutorSettings
from engine.executor.task_logs import read_task_log
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import DagRunState, TaskState
from engine.task_retries import retry_wait_s
from tests.waiting import eventually

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    from engine.config import Config

pytestmark = pytest.mark.integration

DAGS = """
from datetime import timedelta

from engine import DAG, task


@task(retries=2, retry_delay=timedelta(minutes=1))
def steady():
    raise RuntimeError("still down")


@task
def after():
    return "after"


@task(
    retries=3,
    retry_delay=10,
    retry_exponential_backoff=True,
    max_retry_delay=timedelta(seconds=30),
)
def backing_off():
    raise RuntimeError("down")


@task(retries=1, retry_delay=timedelta(minutes=1))
def flaky(try_number):
    if try_number == 1:
        raise RuntimeError("the first try fails")
    return try_number


@task
def quick():
    return "quick"


@task(retries=2, retry_delay=timedelta(seconds=1))
def twice_down(try_number):
    if try_number < 3:
        raise RuntimeError(f"try {try_number} fails")
    return try_number


with DAG("retrying"):
    steady() >> after()

with DAG("backoff"):
    backing_off()

with DAG("flaky"):
    flaky()

with DAG("other"):
    quick()

with DAG("spaced"):
    twice_down()
"""


class FakeClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def __repr__(self) -> str:
        return f"FakeClock({self.now.isoformat()})"

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


class Env:
    def __init__(self, db: Database, cipher: KwargsCipher, config: Config) -> None:
        self.db = db
        self.cipher = cipher
        self.config = config
        self.clock = FakeClock(models.utcnow().replace(microsecond=0))

    def scheduler(self, *, clock: Any = None) -> Scheduler:
        return Scheduler(
            db=self.db,
            cipher=self.cipher,
            settings=SchedulerSettings(loop_interval_s=0.02),
            clock=clock or self.clock,
        )

    def schedule_once(self, scheduler: Scheduler) -> None:
        anyio.run(scheduler.schedule_once)

    def new_run(self, dag_id: str, *, now: datetime) -> tuple[int, str, dict[str, int]]:
        """A manual run: (run pk, run_id, task_id -> task instance id)."""

        def create(session: Any) -> tuple[int, str, dict[str, int]]:
            pk = runs.create_run(session, dag_id, run_type=runs.MANUAL, now=now)
            assert pk is not None
            state = runs.load_run_state(session, pk)
            assert state is not None
            return pk, runs.run_id_of(session, pk), state.ti_ids

        return self.db.call(create)

    def ti(self, ti_id: int) -> TaskInstance:
        ti = self.db.call(lambda s: s.get(TaskInstance, ti_id))
        assert ti is not None
        return ti

    def run_state(self, run_pk: int) -> str:
        run = self.db.call(lambda s: s.get(DagRun, run_pk))
        assert run is not None
        return str(run.state)

    def fail_try(self, ti_id: int, *, now: datetime) -> Outcome:
        """What an executor does with a try that fails at ``now``: claim, start, decide,
        record (``up_for_retry`` while tries remain)."""

        def step(session: Any) -> Outcome:
            job_id = jobs.start_job(session, job_type=tasks.EXECUTOR_JOB)
            claimed = admission.claim_task_instances(session, job_id=job_id, limit=10, now=now)
            assert claimed == [ti_id]
            run = tasks.start_task_run(
                session, ti_id, job_id=job_id, pid=None, hostname="h", now=now
            )
            assert run is not None
            outcome = decide_outcome(
                TaskResult(TaskState.FAILED, 0.1, error="RuntimeError: down"),
                run,
                returncode=1,
                interrupted=False,
                killed_for_timeout=False,
                wall_s=0.1,
                now=now,
            )
            if outcome.decision is Decision.RETRY:
                assert outcome.retry_at is not None
                recorded = tasks.retry_task(
                    session, ti_id, job_id=job_id, elapsed_s=0.1, now=now, retry_at=outcome.retry_at
                )
            else:
                recorded = tasks.finish_task(
                    session, ti_id, job_id=job_id, state=TaskState.FAILED, elapsed_s=0.1, now=now
                )
            assert recorded
            return outcome

        return self.db.call(step)

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.db.call(
            lambda s: s.execute(update(Dag).where(Dag.dag_id == dag_id).values(is_paused=paused))
        )

    def cli(self, *args: str) -> str:
        result = CliRunner().invoke(
            cli, list(args), obj={"config": self.config}, catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        return result.stdout

    async def until(self, ti_id: int, *states: str, within: float = 30) -> TaskInstance:
        async def in_state() -> TaskInstance | None:
            ti = await self.db.run(lambda s: s.get(TaskInstance, ti_id))
            return ti if ti is not None and ti.state in states else None

        found: TaskInstance = await eventually(in_state, within=within)
        return found

    async def run_ended(self, run_pk: int, within: float = 30) -> None:
        async def ended() -> bool:
            run = await self.db.run(lambda s: s.get(DagRun, run_pk))
            return run is not None and run.state in (DagRunState.SUCCESS, DagRunState.FAILED)

        await eventually(ended, within=within)

    @staticmethod
    def executor_settings(config: Config, **overrides: Any) -> ExecutorSettings:
        return replace(
            ExecutorSettings.from_config(config),
            heartbeat_s=0.2,
            poll_interval_s=0.02,
            shutdown_grace_s=5,
            kill_grace_s=0.5,
            **overrides,
        )

    @staticmethod
    def read_log(config: Config, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        folder = config.logging.task_log_folder
        return read_task_log(folder, dag_id, run_id, task_id, try_number)


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path) -> Iterator[Env]:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "retry_dags.py").write_text(textwrap.dedent(DAGS))
    db = Database(migrated_db_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    config = load_config(
        environ={
            "SLUICE_HOME": str(tmp_path / "home"),
            "SLUICE__CORE__DAGS_FOLDER": str(dags),
            "SLUICE__CORE__SQL_ALCHEMY_CONN": migrated_db_url,
        }
    )
    processor = DagProcessor(
        db=db, cipher=cipher, settings=DagProcessorSettings.from_config(config)
    )
    report = anyio.run(processor.parse_once)
    assert report is not None and not report.errors, report
    yield Env(db, cipher, config)
    db.dispose()


@asynccontextmanager
async def engine_parts(env: Env, scheduler: Scheduler, **executor: Any) -> AsyncIterator[None]:
    """The scheduler and a local executor running in-process until the block ends."""
    local = LocalExecutor(
        db=env.db, cipher=env.cipher, settings=env.executor_settings(env.config, **executor)
    )
    async with anyio.create_task_group() as tg:
        await tg.start(scheduler.run)
        await tg.start(local.run)
        try:
            yield
        finally:
            local.shutdown()
            scheduler.shutdown()


# --- the scheduler on a fake clock --------------------------------------------------------


@pytest.mark.both_databases
def test_a_failed_try_waits_up_for_retry_until_its_delay_has_passed(env: Env) -> None:
    clock = env.clock
    scheduler = env.scheduler()
    run_pk, _, tis = env.new_run("retrying", now=clock())
    env.schedule_once(scheduler)
    assert env.ti(tis["steady"]).state == TaskState.SCHEDULED

    failed_at = clock.advance(seconds=5)
    outcome = env.fail_try(tis["steady"], now=failed_at)
    assert outcome.retry_at == failed_at + timedelta(minutes=1)
    ti = env.ti(tis["steady"])
    assert (ti.state, ti.try_number, ti.end_date) == (TaskState.UP_FOR_RETRY, 1, failed_at)
    assert (ti.next_retry_at, ti.executor_job_id) == (failed_at + timedelta(minutes=1), None)

    clock.advance(seconds=59.999)
    env.schedule_once(scheduler)
    assert env.ti(tis["steady"]).state == TaskState.UP_FOR_RETRY  # not yet
    assert env.run_state(run_pk) == DagRunState.RUNNING  # waiting is not finished
    assert env.ti(tis["after"]).state == TaskState.NONE

    clock.advance(seconds=0.001)  # exactly retry_at
    scheduled_before = scheduler.stats.tasks_scheduled
    env.schedule_once(scheduler)
    ti = env.ti(tis["steady"])
    assert (ti.state, ti.next_retry_at, ti.try_number) == (TaskState.SCHEDULED, None, 1)
    assert scheduler.stats.tasks_scheduled == scheduled_before + 1

    # Try 2 waits the same delay; try 3 is the last: the task fails, and so does the run.
    second = env.fail_try(tis["steady"], now=clock.advance(seconds=3))
    assert (second.decision, second.retry_at) == (Decision.RETRY, clock() + timedelta(minutes=1))
    clock.advance(minutes=1)
    env.schedule_once(scheduler)
    assert env.ti(tis["steady"]).state == TaskState.SCHEDULED
    last = env.fail_try(tis["steady"], now=clock.advance(seconds=3))
    assert (last.decision, last.retry_at) == (Decision.FAIL, None)
    env.schedule_once(scheduler)
    ti = env.ti(tis["steady"])
    assert (ti.state, ti.try_number, ti.next_retry_at) == (TaskState.FAILED, 3, None)
    assert env.ti(tis["after"]).state == TaskState.UPSTREAM_FAILED
    assert env.run_state(run_pk) == DagRunState.FAILED


def test_a_task_waiting_for_its_retry_is_not_claimed_and_shows_in_runs_list(env: Env) -> None:
    scheduler = env.scheduler()
    _, run_id, tis = env.new_run("retrying", now=env.clock())
    env.schedule_once(scheduler)
    env.fail_try(tis["steady"], now=env.clock())

    def claim(session: Any) -> list[int]:
        job_id = jobs.start_job(session, job_type=tasks.EXECUTOR_JOB)
        return admission.claim_task_instances(session, job_id=job_id, limit=10, now=env.clock())

    assert env.db.call(claim) == []  # no executor takes it, so it holds no slot
    (listed,) = json.loads(env.cli("runs", "list", "retrying", "--json"))
    assert (listed["run_id"], listed["state"]) == (run_id, DagRunState.RUNNING)
    assert listed["tasks"] == {"steady": "up_for_retry", "after": "none"}
    assert "up_for_retry" in env.cli("runs", "list", "retrying")


def test_exponential_backoff_doubles_the_wait_up_to_max_retry_delay(env: Env) -> None:
    """retry_delay 10 s, backoff, max_retry_delay 30 s: waits in [10, 20), [20, 30], 30."""
    clock = env.clock
    scheduler = env.scheduler()
    _, run_id, tis = env.new_run("backoff", now=clock())
    env.schedule_once(scheduler)
    waits = []
    for try_number in (1, 2, 3):
        failed_at = clock.advance(seconds=1)
        outcome = env.fail_try(tis["backing_off"], now=failed_at)
        ti = env.ti(tis["backing_off"])
        assert ti.next_retry_at is not None and ti.next_retry_at == outcome.retry_at
        wait = (ti.next_retry_at - failed_at).total_seconds()
        assert wait == retry_wait_s(
            delay_s=10.0,
            exponential_backoff=True,
            max_delay_s=30.0,
            try_number=try_number,
            key=f"backoff#backing_off#{run_id}#{try_number}",
        )
        waits.append(wait)
        clock.advance(seconds=wait - 0.5)
        env.schedule_once(scheduler)
        assert env.ti(tis["backing_off"]).state == TaskState.UP_FOR_RETRY
        clock.advance(seconds=0.5)
        env.schedule_once(scheduler)
        assert env.ti(tis["backing_off"]).state == TaskState.SCHEDULED
    assert 10 <= waits[0] < 20 and 20 <= waits[1] <= 30 and waits[2] == 30


def test_a_paused_dags_retry_waits_for_the_unpause(env: Env) -> None:
    scheduler = env.scheduler()
    run_pk, _, tis = env.new_run("retrying", now=env.clock())
    env.schedule_once(scheduler)
    env.fail_try(tis["steady"], now=env.clock())
    env.set_paused("retrying", True)
    env.clock.advance(minutes=10)
    env.schedule_once(scheduler)
    assert env.ti(tis["steady"]).state == TaskState.UP_FOR_RETRY
    env.set_paused("retrying", False)
    env.schedule_once(scheduler)
    assert env.ti(tis["steady"]).state == TaskState.SCHEDULED
    assert env.run_state(run_pk) == DagRunState.RUNNING


def test_a_retry_without_a_time_is_due_at_once(env: Env) -> None:
    """Put in up_for_retry by hand (no next_retry_at): the next loop schedules it."""
    scheduler = env.scheduler()
    _, _, tis = env.new_run("retrying", now=env.clock())
    env.schedule_once(scheduler)
    env.db.call(
        lambda s: s.execute(
            update(TaskInstance)
            .where(TaskInstance.id == tis["steady"])
            .values(state=TaskState.UP_FOR_RETRY, next_retry_at=None)
        )
    )
    env.schedule_once(scheduler)
    assert env.ti(tis["steady"]).state == TaskState.SCHEDULED


# --- the real executor --------------------------------------------------------------------


async def test_the_executor_slot_is_free_while_a_task_waits_for_its_retry(env: Env) -> None:
    """One slot: while ``flaky`` waits its minute, another DAG's task runs in it; once the
    (fake) clock reaches the retry time, ``flaky`` runs its second try and succeeds."""
    clock = env.clock
    scheduler = env.scheduler()
    with anyio.fail_after(60):
        async with engine_parts(env, scheduler, parallelism=1):
            flaky_pk, _, flaky = env.new_run("flaky", now=clock())
            waiting = await env.until(flaky["flaky"], TaskState.UP_FOR_RETRY)
            _, _, other = env.new_run("other", now=clock())
            quick = await env.until(other["quick"], TaskState.SUCCESS)
            assert env.ti(flaky["flaky"]).state == TaskState.UP_FOR_RETRY
            assert env.run_state(flaky_pk) == DagRunState.RUNNING
            assert waiting.next_retry_at is not None
            clock.now = waiting.next_retry_at  # the retry delay has passed
            done = await env.until(flaky["flaky"], TaskState.SUCCESS, TaskState.FAILED)
            await env.run_ended(flaky_pk)
    assert (done.state, done.try_number) == (TaskState.SUCCESS, 2)
    assert waiting.end_date and quick.start_date and quick.end_date and done.start_date
    assert waiting.end_date <= quick.start_date and quick.end_date <= done.start_date
    assert env.run_state(flaky_pk) == DagRunState.SUCCESS


HEADER = re.compile(r"^=== (\S+) spaced\.twice_down run \S+ try (\d) of 3: starting", re.M)
RETRIED = re.compile(
    r"^=== (\S+) try (\d): task failed: RuntimeError: try \d fails; "
    r"it will be retried at (\S+) \(in 1s\) ===$",
    re.M,
)


async def test_tries_are_spaced_by_retry_delay(env: Env) -> None:
    """The real clock: each try starts no sooner than the retry time its predecessor's log
    announced, which is retry_delay (1 s) after that try failed."""
    scheduler = env.scheduler(clock=models.utcnow)
    with anyio.fail_after(60):
        async with engine_parts(env, scheduler, parallelism=2):
            run_pk, run_id, tis = env.new_run("spaced", now=models.utcnow())
            done = await env.until(tis["twice_down"], TaskState.SUCCESS, TaskState.FAILED)
            await env.run_ended(run_pk)
    assert (done.state, done.try_number) == (TaskState.SUCCESS, 3)
    logs = [env.read_log(env.config, "spaced", run_id, "twice_down", n) for n in (1, 2, 3)]
    for n in (1, 2):
        failed = RETRIED.search(logs[n - 1])
        started = HEADER.search(logs[n])
        assert failed is not None and started is not None, logs
        failed_at, retry_at = (datetime.fromisoformat(failed[i]) for i in (1, 3))
        assert (int(failed[2]), int(started[2])) == (n, n + 1)
        assert timedelta(seconds=0.5) < retry_at - failed_at <= timedelta(seconds=1)
        assert datetime.fromisoformat(started[1]) >= retry_at
    assert env.run_state(run_pk) == DagRunState.SUCCESS
