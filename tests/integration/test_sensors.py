"""The standard sensors through the real executor and the real triggerer, on SQLite and
PostgreSQL: PythonSensor in reschedule mode (deferred between pokes, its slot free),
BashSensor, TimeSensor deferrable, DayOfWeekSensor, and ExternalTaskSensor waiting in the
triggerer for a task of another DAG's run (success, failure, soft_fail).

As in ``test_executor``, each test creates runs and marks the task instances it wants
``scheduled`` (the scheduler's part); the executor and the triggerer run in-process.
"""

from __future__ import annotations

import textwrap
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path  # noqa: TC003 - used at runtime by the fixtures
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import select, update

from engine.db import models
from engine.db.models import DagRun, TaskInstance, Trigger
from engine.db.queries import runs
from engine.executor.local import LocalExecutor
from engine.executor.task_logs import read_task_log
from engine.states import TaskState
from engine.triggerer.metadata import DatabaseMetadataReader
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from tests.integration.harness import fast_executor_settings, parsed_database
from tests.waiting import eventually, wait_until
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from engine.authoring.external_task_trigger import ExternalQuery, ExternalStates

pytestmark = pytest.mark.integration

MONDAY = datetime(2026, 3, 2, 6, 0, tzinfo=UTC)

SENSOR_DAGS = """
from datetime import UTC, datetime, timedelta
from pathlib import Path

from engine import DAG, EmptyOperator, PokeReturnValue, task
from engine.sensors import (
    BashSensor,
    DayOfWeekSensor,
    ExternalTaskSensor,
    PythonSensor,
    TimeSensor,
)

HERE = Path(__file__).parent
SOON = (datetime.now(UTC) + timedelta(seconds=2)).time()


def flag_is_up(flag):
    with open(HERE / "pokes.txt", "a") as pokes:
        pokes.write("poke\\n")
    size = (HERE / flag).stat().st_size if (HERE / flag).exists() else None
    return PokeReturnValue(is_done=size is not None, xcom_value=size)


with DAG("sensors"):
    PythonSensor(
        task_id="python_reschedule",
        python_callable=flag_is_up,
        op_args=["flag"],
        mode="reschedule",
        poke_interval=0.2,
        timeout=120,
    )

    @task
    def ok():
        return "ran"

    ok()
    BashSensor(
        task_id="bash",
        bash_command='test -f "$FLAG"',
        env={"FLAG": str(HERE / "bash_flag")},
        retry_exit_code=1,
        poke_interval=0.1,
        timeout=120,
    )
    BashSensor(task_id="bash_broken", bash_command="exit 3", retry_exit_code=1)
    TimeSensor(task_id="time_deferrable", target_time=SOON, deferrable=True, timeout=120)
    DayOfWeekSensor(task_id="monday", week_day="Monday", use_task_logical_date=True)
    DayOfWeekSensor(
        task_id="sunday",
        week_day={"Sunday"},
        use_task_logical_date=True,
        poke_interval=0.1,
        timeout=0.5,
        soft_fail=True,
    )

with DAG("upstream"):
    EmptyOperator(task_id="load")

with DAG("downstream"):
    ExternalTaskSensor(
        task_id="wait",
        external_dag_id="upstream",
        external_task_id="load",
        failed_states=["failed"],
        mode="reschedule",
        poke_interval=0.1,
        timeout=120,
    )
    ExternalTaskSensor(
        task_id="wait_soft",
        external_dag_id="upstream",
        external_task_id="load",
        failed_states=["failed"],
        soft_fail=True,
        poke_interval=0.1,
        timeout=120,
    )
"""


class Env:
    def __init__(self, db_url: str, tmp_path: Path) -> None:
        self.dags = tmp_path / "dags"
        self.dags.mkdir()
        (self.dags / "sensor_dags.py").write_text(textwrap.dedent(SENSOR_DAGS))
        self.db, config, self.cipher, _ = parsed_database(db_url, tmp_path, self.dags)
        self.settings = fast_executor_settings(config)

    def new_run(self, dag_id: str, logical_date: datetime | None = None) -> tuple[int, str, dict]:
        def create(session: Any) -> tuple[int, str, dict[str, int]]:
            pk = runs.create_run(
                session,
                dag_id,
                run_type=runs.MANUAL,
                now=models.utcnow(),
                logical_date=logical_date,
            )
            assert pk is not None
            state = runs.load_run_state(session, pk)
            assert state is not None
            run_id = session.execute(select(DagRun.run_id).where(DagRun.id == pk)).scalar_one()
            return pk, str(run_id), state.ti_ids

        return self.db.call(create)

    def set_state(self, state: str, *ti_ids: int) -> None:
        self.db.call(
            lambda s: s.execute(
                update(TaskInstance).where(TaskInstance.id.in_(ti_ids)).values(state=state)
            )
        )

    def schedule(self, *ti_ids: int) -> None:
        self.set_state(TaskState.SCHEDULED, *ti_ids)

    async def until(self, ti_id: int, *states: str, within: float = 30) -> TaskInstance:
        async def in_state() -> TaskInstance | None:
            ti = await self.db.run(lambda s: s.get(TaskInstance, ti_id))
            return ti if ti.state in states else None

        return await eventually(in_state, within=within)

    def log(self, dag_id: str, run_id: str, task_id: str) -> str:
        return read_task_log(self.settings.task_log_folder, dag_id, run_id, task_id, None)

    def trigger_classpath(self, ti: TaskInstance) -> str:
        return self.db.call(lambda s: s.get(Trigger, ti.trigger_id).classpath)

    @asynccontextmanager
    async def running(self, **overrides: Any) -> AsyncIterator[None]:
        """The executor and the triggerer, both stopped at the end."""
        triggerer = Triggerer(
            db=self.db,
            cipher=self.cipher,
            settings=TriggererSettings(
                capacity=100,
                heartbeat_s=0.2,
                # one triggerer, no takeover under test: a lease that survives a loaded
                # machine (the suite's engines and browsers beside it) for 5 s without a beat
                health_check_threshold_s=5.0,
                claim_idle_interval_s=0.05,
                new_trigger_poll_s=0.05,
                shutdown_grace_s=2,
            ),
        )
        executor = LocalExecutor(
            db=self.db, cipher=self.cipher, settings=replace(self.settings, **overrides)
        )
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await tg.start(executor.run)
            try:
                yield
            finally:
                executor.shutdown()
                triggerer.shutdown()


async def pokes_at_least(path: Path, count: int) -> bool:
    file = anyio.Path(path)
    return await file.exists() and (await file.read_text()).count("poke") >= count


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    env = Env(migrated_db_url, tmp_path)
    yield env
    env.db.dispose()


@pytest.fixture
def external_reads(monkeypatch: pytest.MonkeyPatch) -> list[ExternalStates]:
    """Every snapshot an ``ExternalTaskTrigger`` poll read, in order: the triggerer's real
    ``MetadataReader``, counted (appended before the trigger judges it)."""
    reads: list[ExternalStates] = []
    real = DatabaseMetadataReader.external_states

    async def counted(self: DatabaseMetadataReader, query: ExternalQuery) -> ExternalStates:
        states = await real(self, query)
        reads.append(states)
        return states

    monkeypatch.setattr(DatabaseMetadataReader, "external_states", counted)
    return reads


def saw_task_state(states: ExternalStates, task_id: str, state: str) -> bool:
    return any(found.get(task_id) == state for found in states.task_states.values())


@pytest.mark.both_databases
async def test_python_sensor_in_reschedule_mode_frees_its_slot_between_pokes(env: Env) -> None:
    _, run_id, tis = env.new_run("sensors")
    sensor_id = tis["python_reschedule"]
    env.schedule(sensor_id)
    with anyio.fail_after(60):
        async with env.running(parallelism=1):
            deferred = await env.until(sensor_id, TaskState.DEFERRED)
            assert env.trigger_classpath(deferred) == "triggers.temporal.DateTimeTrigger"
            env.schedule(tis["ok"])  # one slot: it runs only because the sensor gave it back
            await env.until(tis["ok"], TaskState.SUCCESS)
            await eventually(lambda: pokes_at_least(env.dags / "pokes.txt", 3))
            assert env.db.call(lambda s: s.get(TaskInstance, sensor_id)).state != "success"
            (env.dags / "flag").write_text("12345")
            done = await env.until(sensor_id, TaskState.SUCCESS, TaskState.FAILED)
    assert done.state == TaskState.SUCCESS
    assert deserialize_value(done.xcoms["return_value"]) == 5  # the PokeReturnValue's value
    assert done.try_number == 1 and done.deferral_count >= 2
    text = env.log("sensors", run_id, "python_reschedule")
    assert "rescheduled in" in text and "slot freed" in text


async def test_bash_sensor_pokes_until_exit_zero_and_fails_on_another_code(env: Env) -> None:
    _, run_id, tis = env.new_run("sensors")
    env.schedule(tis["bash"], tis["bash_broken"])
    with anyio.fail_after(60):
        async with env.running():
            broken = await env.until(tis["bash_broken"], TaskState.SUCCESS, TaskState.FAILED)
            running = await env.until(tis["bash"], TaskState.RUNNING)
            assert running.state == TaskState.RUNNING  # poke mode: it holds its slot
            not_yet = "Command exited with return code 1"  # a first poke found no flag
            await wait_until(lambda: not_yet in env.log("sensors", run_id, "bash"), within=30)
            (env.dags / "bash_flag").write_text("")
            done = await env.until(tis["bash"], TaskState.SUCCESS, TaskState.FAILED)
    assert done.state == TaskState.SUCCESS
    assert broken.state == TaskState.FAILED
    assert "neither 0 (done) nor retry_exit_code 1" in env.log("sensors", run_id, "bash_broken")
    assert "Command exited with return code 1" in env.log("sensors", run_id, "bash")


async def test_time_sensor_deferrable_waits_on_the_triggerer(env: Env) -> None:
    _, _, tis = env.new_run("sensors")
    env.schedule(tis["time_deferrable"])
    with anyio.fail_after(60):
        async with env.running():
            deferred = await env.until(tis["time_deferrable"], TaskState.DEFERRED)
            assert env.trigger_classpath(deferred) == "triggers.temporal.DateTimeTrigger"
            done = await env.until(tis["time_deferrable"], TaskState.SUCCESS, TaskState.FAILED)
    assert done.state == TaskState.SUCCESS and done.deferral_count == 1


async def test_day_of_week_sensor_succeeds_on_its_day_and_soft_fails_otherwise(env: Env) -> None:
    _, _, tis = env.new_run("sensors", logical_date=MONDAY)
    env.schedule(tis["monday"], tis["sunday"])
    with anyio.fail_after(60):
        async with env.running():
            monday = await env.until(tis["monday"], TaskState.SUCCESS, TaskState.FAILED)
            sunday = await env.until(
                tis["sunday"], TaskState.SUCCESS, TaskState.FAILED, TaskState.SKIPPED
            )
    assert (monday.state, sunday.state) == (TaskState.SUCCESS, TaskState.SKIPPED)


async def test_external_task_sensor_waits_in_the_triggerer_for_another_dags_task(
    env: Env, external_reads: list[ExternalStates]
) -> None:
    logical_date = datetime(2026, 3, 1, tzinfo=UTC)
    _, _, up = env.new_run("upstream", logical_date)
    _, _, down = env.new_run("downstream", logical_date)
    env.schedule(down["wait"])
    with anyio.fail_after(60):
        async with env.running(parallelism=1):
            deferred = await env.until(down["wait"], TaskState.DEFERRED)
            path = "engine.authoring.external_task_trigger.ExternalTaskTrigger"
            assert env.trigger_classpath(deferred) == path
            env.set_state(TaskState.RUNNING, up["load"])
            before = len(external_reads)

            def polls_that_saw_it_running() -> int:
                later = external_reads[before:]
                return sum(saw_task_state(states, "load", "running") for states in later)

            # Three polls read it running: the first two were judged "wait" (the trigger
            # polled again), so no event came of them; still waiting, slot free.
            await wait_until(lambda: polls_that_saw_it_running() >= 3, within=30)
            assert (await env.until(down["wait"], TaskState.DEFERRED)).deferral_count == 1
            env.set_state(TaskState.SUCCESS, up["load"])
            done = await env.until(down["wait"], TaskState.SUCCESS, TaskState.FAILED)
    assert done.state == TaskState.SUCCESS and done.deferral_count == 1


async def test_external_task_sensor_fails_or_skips_when_the_external_task_failed(
    env: Env,
) -> None:
    logical_date = datetime(2026, 3, 5, 12, tzinfo=UTC)
    _, _, up = env.new_run("upstream", logical_date)
    _, run_id, down = env.new_run("downstream", logical_date)
    other_day = datetime(2026, 3, 4, 12, tzinfo=UTC)
    _, _, up_other = env.new_run("upstream", other_day)
    env.set_state(TaskState.SUCCESS, up_other["load"])  # another logical date: not matched
    env.schedule(down["wait"], down["wait_soft"])
    with anyio.fail_after(60):
        async with env.running():
            await env.until(down["wait"], TaskState.DEFERRED)
            await env.until(down["wait_soft"], TaskState.DEFERRED)
            env.set_state(TaskState.FAILED, up["load"])
            ends = (TaskState.SUCCESS, TaskState.FAILED, TaskState.SKIPPED)
            hard = await env.until(down["wait"], *ends)
            soft = await env.until(down["wait_soft"], *ends)
    assert (hard.state, soft.state) == (TaskState.FAILED, TaskState.SKIPPED)
    text = env.log("downstream", run_id, "wait")
    assert "ExternalTaskFailedError" in text
    assert f"task 'load' of DAG 'upstream' at logical date {logical_date.isoformat()}" in text


async def test_the_wait_ends_when_the_sensor_times_out(env: Env) -> None:
    logical_date = datetime(2026, 3, 6, tzinfo=UTC)
    env.new_run("upstream", logical_date)
    _, _, down = env.new_run("downstream", logical_date)
    env.schedule(down["wait_soft"])
    with anyio.fail_after(60):
        async with env.running():
            deferred = await env.until(down["wait_soft"], TaskState.DEFERRED)
            assert deferred.trigger_timeout is not None
            soon = models.utcnow() + timedelta(milliseconds=200)
            env.db.call(
                lambda s: s.execute(
                    update(TaskInstance)
                    .where(TaskInstance.id == down["wait_soft"])
                    .values(trigger_timeout=soon)
                )
            )
            ended = await env.until(
                down["wait_soft"], TaskState.SUCCESS, TaskState.FAILED, TaskState.SKIPPED
            )
    assert ended.state == TaskState.SKIPPED  # timed out with soft_fail
