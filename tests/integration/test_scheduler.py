"""The scheduler on SQLite and PostgreSQL: asset events -> DAG runs -> ready tasks."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select, update

from engine.crypto import KwargsCipher
from engine.dag_processing.processor import DagProcessor, DagProcessorSettings
from engine.db import models
from engine.db.database import Database
from engine.db.models import Asset, Dag, DagRun, DagRunAssetEvent, TaskInstance
from engine.db.queries import advancing, assets, runs, watcher_events
from engine.exceptions import DatabaseUnavailable
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import TaskState
from tests.integration.harness import silent_executor_job
from tests.waiting import wait_until

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

DAGS = """
from engine import DAG, Asset, task

a, b, c = Asset("a"), Asset("b"), Asset("c")

@task
def first():
    return 1

@task
def second():
    return 2

with DAG("needs_a_and_b", schedule=a & b):
    first() >> second()

with DAG("a_or_c", schedule=a | c):
    first()

with DAG("list_b_c", schedule=[b, c]):
    first()
"""


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "flows.py").write_text(textwrap.dedent(DAGS))
    db = Database(migrated_db_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    processor = DagProcessor(db=db, cipher=cipher, settings=_settings(dags, tmp_path))
    anyio.run(processor.parse_once)
    yield db, cipher
    db.dispose()


def _settings(dags: Path, tmp_path: Path) -> DagProcessorSettings:
    from engine.config import load_config

    config = load_config(
        environ={"SLUICE_HOME": str(tmp_path / "home"), "SLUICE__CORE__DAGS_FOLDER": str(dags)}
    )
    return DagProcessorSettings.from_config(config)


def _emit(db: Database, asset: str, n: int = 1, *, keep_while_paused: bool = True) -> list[int]:
    """Store asset events the way the persister does (event + queue rows, one transaction)."""

    def write(session: Any) -> list[int]:
        asset_id = session.execute(select(Asset.id).where(Asset.name == asset)).scalar_one()
        rows = [
            {
                "asset_id": asset_id,
                "payload": {"i": i},
                "dedup_key": f"{asset}-{i}-{models.utcnow()}",
                "timestamp": models.utcnow(),
            }
            for i in range(n)
        ]
        new = assets.insert_asset_events(session, rows)
        assets.enqueue_asset_events(session, new, keep_while_paused=keep_while_paused)
        return [event_id for event_id, _ in new]

    return db.call(write)


def _runs(db: Database) -> dict[str, list[list[int]]]:
    def read(session: Any) -> dict[str, list[list[int]]]:
        out: dict[str, list[list[int]]] = {}
        for run in session.execute(select(DagRun).order_by(DagRun.id)).scalars():
            events = session.execute(
                select(DagRunAssetEvent.asset_event_id).where(DagRunAssetEvent.dag_run_id == run.id)
            ).scalars()
            out.setdefault(run.dag_id, []).append(sorted(events))
        return out

    return db.call(read)


def _scheduler(db: Database, cipher: KwargsCipher) -> Scheduler:
    return Scheduler(db=db, cipher=cipher, settings=SchedulerSettings())


def test_conditions_decide_which_dags_run_and_all_events_are_attached(env) -> None:
    db, cipher = env
    scheduler = _scheduler(db, cipher)
    a_events = _emit(db, "a", 2)
    anyio.run(scheduler.schedule_once)
    runs = _runs(db)
    assert runs == {"a_or_c": [a_events]}  # a & b waits for b; [b, c] needs both
    b_events = _emit(db, "b")
    anyio.run(scheduler.schedule_once)
    runs = _runs(db)
    assert runs["needs_a_and_b"] == [sorted(a_events + b_events)]  # a's events kept waiting
    assert "list_b_c" not in runs
    c_events = _emit(db, "c")
    anyio.run(scheduler.schedule_once)
    runs = _runs(db)
    assert runs["list_b_c"] == [sorted(b_events + c_events)]
    assert runs["a_or_c"] == [a_events, c_events]
    anyio.run(scheduler.schedule_once)
    assert _runs(db) == runs  # consumed events never create a second run


@pytest.mark.both_databases
def test_tasks_become_ready_in_dependency_order_and_runs_finish(env) -> None:
    db, cipher = env
    scheduler = _scheduler(db, cipher)
    _emit(db, "a")
    _emit(db, "b")
    anyio.run(scheduler.schedule_once)

    def states(session: Any) -> dict[str, str]:
        rows = session.execute(
            select(TaskInstance.task_id, TaskInstance.state).where(
                TaskInstance.dag_id == "needs_a_and_b"
            )
        )
        return dict(rows.all())

    assert db.call(states) == {"first": TaskState.SCHEDULED, "second": TaskState.NONE}
    db.call(
        lambda s: s.execute(
            update(TaskInstance)
            .where(TaskInstance.dag_id == "needs_a_and_b", TaskInstance.task_id == "first")
            .values(state=TaskState.SUCCESS)
        )
    )
    anyio.run(scheduler.schedule_once)
    assert db.call(states)["second"] == TaskState.SCHEDULED
    db.call(
        lambda s: s.execute(
            update(TaskInstance)
            .where(TaskInstance.dag_id == "needs_a_and_b", TaskInstance.task_id == "second")
            .values(state=TaskState.FAILED)
        )
    )
    anyio.run(scheduler.schedule_once)
    run = db.call(
        lambda s: s.execute(select(DagRun).where(DagRun.dag_id == "needs_a_and_b")).scalar_one()
    )
    assert run.state == "failed"
    assert run.end_date is not None


def test_paused_dag_keeps_its_events_and_runs_on_unpause(env) -> None:
    db, cipher = env
    scheduler = _scheduler(db, cipher)
    db.call(lambda s: s.execute(update(Dag).where(Dag.dag_id == "a_or_c").values(is_paused=True)))
    events = _emit(db, "a")
    anyio.run(scheduler.schedule_once)
    assert "a_or_c" not in _runs(db)
    db.call(lambda s: s.execute(update(Dag).where(Dag.dag_id == "a_or_c").values(is_paused=False)))
    anyio.run(scheduler.schedule_once)
    assert _runs(db)["a_or_c"] == [events]


def test_paused_dag_drops_events_when_configured_to(env) -> None:
    """``[scheduler] keep_events_while_paused = false``: Airflow's behaviour."""
    db, cipher = env
    scheduler = _scheduler(db, cipher)
    db.call(lambda s: s.execute(update(Dag).where(Dag.dag_id == "a_or_c").values(is_paused=True)))
    _emit(db, "a", keep_while_paused=False)
    db.call(lambda s: s.execute(update(Dag).where(Dag.dag_id == "a_or_c").values(is_paused=False)))
    anyio.run(scheduler.schedule_once)
    assert "a_or_c" not in _runs(db)
    after = _emit(db, "a", keep_while_paused=False)  # unpaused again: queued as usual
    anyio.run(scheduler.schedule_once)
    assert _runs(db)["a_or_c"] == [after]


@pytest.mark.parametrize("migrated_db_url", ["postgres"], indirect=True)
def test_two_schedulers_never_create_two_runs_from_one_event(env) -> None:
    db, cipher = env
    one, two = _scheduler(db, cipher), _scheduler(db, cipher)
    emitted = []

    async def race() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                emitted.extend(await anyio.to_thread.run_sync(_emit, db, "c"))
                tg.start_soon(one.schedule_once)
                tg.start_soon(two.schedule_once)
        await one.schedule_once()

    anyio.run(race)
    attached = [e for run in _runs(db)["a_or_c"] for e in run]
    assert sorted(attached) == sorted(emitted)  # every event in exactly one run


@pytest.mark.both_databases
async def test_an_idle_scheduler_loops_on_another_writers_commit_not_on_its_poll(env) -> None:
    """With both polls at a minute, a run appears for an event another connection stored:
    the write woke the loop (PostgreSQL: the notification; SQLite: the file's commit)."""
    db, cipher = env
    slow = SchedulerSettings(loop_interval_s=60.0, idle_poll_s=60.0)
    scheduler = Scheduler(db=db, cipher=cipher, settings=slow)
    first_loop_done = _after_each_loop(scheduler)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(scheduler.run)
            await first_loop_done.wait()  # (a loop still running would see the event itself)
            loops = scheduler.stats.loops
            await anyio.to_thread.run_sync(_emit, db, "a")
            await wait_until(lambda: scheduler.stats.runs_created == 1)
            assert scheduler.stats.loops > loops
            scheduler.shutdown()
    assert list(_runs(db)) == ["a_or_c"]


def _after_each_loop(scheduler: Scheduler) -> anyio.Event:
    """An event set once the scheduler's first loop (``schedule_once``) has ended."""
    done = anyio.Event()
    once = scheduler.schedule_once

    async def then_done() -> None:
        await once()
        done.set()

    scheduler.schedule_once = then_done  # type: ignore[method-assign]
    return done


def _store_as_a_triggerer(db: Database, asset: str) -> int:
    """Store one watcher event through the triggerer's own statement (``store_watcher_events``,
    on PostgreSQL the one autocommitted INSERT of its persister)."""
    with db.engine.connect() as conn:
        asset_id = conn.execute(select(Asset.id).where(Asset.name == asset)).scalar_one()
        conn.commit()
        row = (asset_id, '{"i": 1}', f"{asset}-{models.utcnow()}", 1, "w", None)
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        stored = watcher_events.store_watcher_events(conn, [row])
        conn.commit()
        return stored


@pytest.mark.both_databases
async def test_an_idle_scheduler_loops_on_a_triggerer_s_stored_event(env) -> None:
    """The same for an event a triggerer of its own process stored with its batch statement
    (the scheduler no longer polls every 50 ms while idle: the write must wake it)."""
    db, cipher = env
    slow = SchedulerSettings(loop_interval_s=60.0, idle_poll_s=60.0)
    scheduler = Scheduler(db=db, cipher=cipher, settings=slow)
    first_loop_done = _after_each_loop(scheduler)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(scheduler.run)
            await first_loop_done.wait()
            loops = scheduler.stats.loops
            assert await anyio.to_thread.run_sync(_store_as_a_triggerer, db, "a") == 1
            await wait_until(lambda: scheduler.stats.runs_created == 1)
            assert scheduler.stats.loops > loops
            scheduler.shutdown()
    assert list(_runs(db)) == ["a_or_c"]


def test_the_loop_polls_fast_only_while_runs_run_or_it_made_progress(env) -> None:
    db, cipher = env
    settings = SchedulerSettings(loop_interval_s=0.05, idle_poll_s=1.0)
    scheduler = Scheduler(db=db, cipher=cipher, settings=settings)
    before = scheduler.stats.progress()
    assert scheduler._poll_after(before) == 1.0  # idle: nothing running, nothing changed
    scheduler.stats.running_runs = 1
    assert scheduler._poll_after(before) == 0.05
    scheduler.stats.running_runs = 0
    scheduler.stats.runs_finished += 1
    assert scheduler._poll_after(before) == 0.05
    _emit(db, "a")
    anyio.run(scheduler.schedule_once)  # a run created, admitted, its first task scheduled
    assert scheduler.stats.running_runs == 1
    assert scheduler._poll_after(scheduler.stats.progress()) == 0.05


@pytest.mark.both_databases
def test_a_loop_advances_only_runs_with_a_task_to_decide(env) -> None:
    """A run whose every task is in flight is left alone; one with a task in ``none`` or an
    ended one is advanced (and ends when its tasks did)."""
    db, cipher = env
    scheduler = _scheduler(db, cipher)
    _emit(db, "c")  # a_or_c (one task) and list_b_c (waits for b)
    anyio.run(scheduler.schedule_once)  # a_or_c: created, admitted, its task scheduled

    def set_first(state: str) -> None:
        db.call(
            lambda s: s.execute(
                update(TaskInstance).where(TaskInstance.dag_id == "a_or_c").values(state=state)
            )
        )

    for in_flight in (TaskState.SCHEDULED, TaskState.QUEUED, TaskState.RUNNING):
        set_first(in_flight)
        assert db.call(advancing.unfinished_runs, read_only=True) == ([], 1)
    set_first(TaskState.SUCCESS)
    to_advance, running = db.call(advancing.unfinished_runs, read_only=True)
    assert len(to_advance) == 1
    assert running == 1
    anyio.run(scheduler.schedule_once)
    assert db.call(advancing.unfinished_runs, read_only=True) == ([], 0)
    run = db.call(lambda s: s.execute(select(DagRun).where(DagRun.dag_id == "a_or_c")).scalar_one())
    assert run.state == "success"


@pytest.mark.both_databases
async def test_after_its_own_outage_the_scheduler_waits_a_threshold_before_calling_an_executor_dead(
    env, caplog: pytest.LogCaptureFixture
) -> None:
    """The database was away for longer than the thresholds, then comes back: an executor
    could not heartbeat meanwhile either, and its next beat may be a second away. The first
    loops that work again must not fail its running try for the silence the outage made; once
    the database has been back for a threshold, a still silent executor is dead."""
    db, cipher = env
    threshold = 10.0
    settings = SchedulerSettings(
        loop_interval_s=0.01,
        idle_poll_s=0.01,
        heartbeat_s=0.01,
        executor_health_check_threshold_s=threshold,
        task_heartbeat_timeout_s=threshold,
    )
    now = [1000.0]  # the scheduler's monotonic clock, moved by hand
    scheduler = Scheduler(db=db, cipher=cipher, settings=settings, monotonic=lambda: now[0])
    ti_id = db.call(_a_try_running_on_a_silent_executor)
    outage, failed, worked = [True], [0], [0]
    once = scheduler.schedule_once

    async def through_the_outage() -> None:
        if outage[0]:
            failed[0] += 1
            raise DatabaseUnavailable("connection refused (the test's outage)")
        await once()
        worked[0] += 1

    scheduler.schedule_once = through_the_outage  # type: ignore[method-assign]

    def state() -> str:
        return str(db.call(lambda s: s.get(TaskInstance, ti_id).state))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(scheduler.run)
            await wait_until(lambda: failed[0] >= 1)  # a loop failed
            now[0] += 60.0  # the outage lasts a minute
            outage[0] = False
            scheduler.nudge()
            await wait_until(lambda: worked[0] >= 3)
            assert state() == TaskState.RUNNING  # the old code failed it here
            now[0] += threshold + 1  # back for a threshold: its executor had time to beat
            scheduler.nudge()
            await wait_until(lambda: state() == TaskState.FAILED)
            scheduler.shutdown()
    [lost] = [r.getMessage() for r in caplog.records if getattr(r, "action", "") == "task_lost"]
    assert lost.startswith("Task a_or_c.first (run manual__") and "try 1 of 1" in lost, lost
    assert lost.endswith("its process is presumed dead; the try failed, failed"), lost


def _a_try_running_on_a_silent_executor(session: Any) -> int:
    """A manual run of ``a_or_c`` whose task runs on an executor silent for a minute."""
    job = silent_executor_job(session)
    run_pk = runs.create_run(session, "a_or_c", run_type=runs.MANUAL, now=models.utcnow())
    ti_id = int(
        session.execute(
            select(TaskInstance.id).where(TaskInstance.dag_run_id == run_pk)
        ).scalar_one()
    )
    session.execute(
        update(TaskInstance)
        .where(TaskInstance.id == ti_id)
        .values(state=TaskState.RUNNING, executor_job_id=job, try_number=1)
    )
    return ti_id
