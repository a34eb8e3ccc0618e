"""Pools and ``max_active_tasks`` on SQLite and PostgreSQL: what the executors' claim admits
(pool open slots, ``pool_slots``, ``include_deferred``, a missing pool, the per-run cap),
that concurrent claims of several executors never overfill a pool, and the real executor
never running two tasks of a one-slot pool at once.
"""

from __future__ import annotations

import logging
import textwrap
import threading
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import select, update

from engine.authoring.sensor_base import RESCHEDULE_METHOD
from engine.db import models
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import pools, runs
from engine.executor import admission
from engine.executor.local import LocalExecutor
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import TaskState
from tests.integration.harness import fast_executor_settings, parsed_database
from tests.waiting import eventually

if TYPE_CHECKING:
    from pathlib import Path

    from engine.db.database import Database

pytestmark = pytest.mark.integration

DAG_FILE = """
import time
from pathlib import Path

from engine import DAG, PythonOperator

GATE = Path({gate!r})


def hold(name):
    (GATE / f"{{name}}.started").touch()
    while not (GATE / "release").exists():
        time.sleep(0.02)


with DAG("pooled"):
    for i in range(3):
        PythonOperator(
            task_id=f"t{{i}}", python_callable=hold, op_kwargs={{"name": f"t{{i}}"}}, pool="one"
        )

with DAG("slots", default_args={{"pool": "three", "pool_slots": 2}}):
    PythonOperator(task_id="big1", python_callable=hold, op_args=["big1"])
    PythonOperator(task_id="big2", python_callable=hold, op_args=["big2"])
    PythonOperator(task_id="small", python_callable=hold, op_args=["small"], pool_slots=1)
    PythonOperator(task_id="huge", python_callable=hold, op_args=["huge"], pool_slots=4)

with DAG("lost"):
    PythonOperator(task_id="orphan", python_callable=hold, op_args=["orphan"], pool="nope")

with DAG("capped", max_active_tasks=2):
    for i in range(4):
        PythonOperator(task_id=f"c{{i}}", python_callable=hold, op_args=[f"c{{i}}"])
"""


class Env:
    def __init__(self, db: Database, settings: Any, gate: Path) -> None:
        self.db = db
        self.settings = settings
        self.gate = gate

    def new_run(self, dag_id: str) -> dict[str, int]:
        """A run of ``dag_id`` with every task scheduled: task_id -> task instance id."""

        def create(session: Any) -> dict[str, int]:
            pk = runs.create_run(session, dag_id, run_type=runs.MANUAL, now=models.utcnow())
            session.execute(
                update(TaskInstance)
                .where(TaskInstance.dag_run_id == pk)
                .values(state=TaskState.SCHEDULED)
            )
            rows = session.execute(
                select(TaskInstance.task_id, TaskInstance.id).where(TaskInstance.dag_run_id == pk)
            )
            return {str(t): int(i) for t, i in rows}

        return self.db.call(create)

    def claim(self, limit: int = 10, job_id: int = 1) -> list[int]:
        now = models.utcnow()
        return self.db.call(
            lambda s: admission.claim_task_instances(s, job_id=job_id, limit=limit, now=now)
        )

    def set_state(self, ti_id: int, state: str) -> None:
        self.db.call(
            lambda s: s.execute(
                update(TaskInstance).where(TaskInstance.id == ti_id).values(state=state)
            )
        )

    def set_pool(self, name: str, slots: int, **kwargs: Any) -> pools.PoolUsage:
        return self.db.call(lambda s: pools.set_pool(s, name, slots=slots, **kwargs))

    def pool(self, name: str) -> pools.PoolUsage:
        usage = self.db.call(lambda s: pools.get_pool(s, name))
        assert usage is not None
        return usage


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    gate = tmp_path / "gate"
    gate.mkdir()
    (dags / "pools.py").write_text(textwrap.dedent(DAG_FILE.format(gate=str(gate))))
    db, config, _, _ = parsed_database(migrated_db_url, tmp_path, dags)
    environment = Env(db, fast_executor_settings(config), gate)
    environment.set_pool("one", 1)
    environment.set_pool("three", 3)
    yield environment
    db.dispose()


def test_the_migration_creates_default_pool_with_airflows_128_slots(env: Env) -> None:
    default = env.pool("default_pool")
    assert (default.slots, default.include_deferred, default.open) == (128, False, 128)
    with pytest.raises(pools.PoolError, match="default_pool cannot be deleted"):
        env.db.call(lambda s: pools.delete_pool(s, "default_pool"))


def test_a_one_slot_pool_admits_one_task_until_it_ends(env: Env) -> None:
    tis = env.new_run("pooled")
    first = env.claim()
    assert len(first) == 1 and env.claim() == []
    usage = env.pool("one")
    assert (usage.queued, usage.running, usage.open) == (1, 0, 0)
    env.set_state(first[0], TaskState.RUNNING)
    assert env.claim() == [] and env.pool("one").running == 1
    env.set_state(first[0], TaskState.RESTARTING)  # cleared: its process is being stopped
    assert env.claim() == [] and env.pool("one").running == 1
    env.set_state(first[0], TaskState.SUCCESS)
    second = env.claim()
    assert len(second) == 1 and second != first and set(second) <= set(tis.values())


def test_pool_slots_count_what_each_task_takes(env: Env) -> None:
    tis = env.new_run("slots")
    claimed = env.claim()
    # big1 takes 2 of 3 slots; big2 (2) no longer fits, small (1) does; huge (4) never fits
    assert sorted(claimed) == sorted([tis["big1"], tis["small"]])
    assert env.pool("three").open == 0
    env.set_state(tis["big1"], TaskState.SUCCESS)
    assert env.claim() == [tis["big2"]]
    env.set_state(tis["big2"], TaskState.SUCCESS)
    env.set_state(tis["small"], TaskState.SUCCESS)
    assert env.claim() == []  # huge waits: 4 slots of a 3-slot pool
    env.set_pool("three", 4)
    assert env.claim() == [tis["huge"]]


def test_deferred_tasks_occupy_their_slots_only_with_include_deferred(env: Env) -> None:
    tis = env.new_run("pooled")
    (first,) = env.claim()
    env.set_state(first, TaskState.DEFERRED)
    assert env.pool("one").deferred == 1 and env.pool("one").open == 1
    env.set_pool("one", 1, include_deferred=True)
    assert env.pool("one").open == 0 and env.claim() == []
    env.db.call(  # a sensor in reschedule mode between pokes: Airflow's up_for_reschedule
        lambda s: s.execute(
            update(TaskInstance)
            .where(TaskInstance.id == first)
            .values(next_method=RESCHEDULE_METHOD)
        )
    )
    assert env.pool("one").open == 1  # holds no slot, even where deferred tasks count
    env.set_pool("one", 1, include_deferred=False)
    (second,) = env.claim()
    assert second != first and second in tis.values()


def test_a_task_in_a_missing_pool_waits_scheduled_and_is_warned_about_once(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    tis = env.new_run("lost")
    caplog.set_level(logging.WARNING, logger="engine.executor.admission")
    warned = admission.PoolWarnings()  # an executor's
    assert env.claim() == []
    env.db.call(lambda s: admission.warn_unstartable(s, warned, now_s=1e9))
    env.db.call(lambda s: admission.warn_unstartable(s, warned, now_s=2e9))
    warnings = [r for r in caplog.records if getattr(r, "action", "") == "pool_missing"]
    assert len(warnings) == 1
    record = warnings[0]
    assert (record.dag_id, record.task_id, record.pool) == ("lost", "orphan", "nope")
    assert "lost.orphan" in record.getMessage() and "'nope'" in record.getMessage()
    env.set_pool("nope", 1)
    assert env.claim() == [tis["orphan"]]


def test_max_active_tasks_caps_each_run_of_the_dag(env: Env) -> None:
    first = env.new_run("capped")
    second = env.new_run("capped")
    claimed = env.claim(limit=10)
    assert len(set(claimed) & set(first.values())) == 2
    assert len(set(claimed) & set(second.values())) == 2  # per run, as in Airflow 3
    assert env.claim() == []
    env.set_state(claimed[0], TaskState.SUCCESS)
    assert len(env.claim()) == 1


@pytest.mark.both_databases
def test_concurrent_claims_of_many_executors_never_overfill_a_pool(env: Env) -> None:
    for _ in range(3):
        env.new_run("pooled")  # 9 tasks in the one-slot pool
    env.set_pool("one", 2)
    barrier = threading.Barrier(6)
    claimed: list[list[int]] = []

    def executor(job_id: int) -> None:
        barrier.wait()
        claimed.append(env.claim(limit=5, job_id=job_id))

    threads = [threading.Thread(target=executor, args=(job,)) for job in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    every = [ti for batch in claimed for ti in batch]
    assert len(claimed) == 6 and len(every) == 2 and len(set(every)) == 2
    assert env.pool("one").queued == 2


@pytest.mark.both_databases
async def test_the_executor_never_runs_two_tasks_of_a_one_slot_pool_at_once(env: Env) -> None:
    run_pk = env.db.call(
        lambda s: runs.create_run(s, "pooled", run_type=runs.MANUAL, now=models.utcnow())
    )
    scheduler = Scheduler(db=env.db, cipher=None, settings=SchedulerSettings())  # type: ignore[arg-type]
    executor = LocalExecutor(db=env.db, cipher=None, settings=env.settings)  # type: ignore[arg-type]
    most = 0

    def active(session: Any) -> list[str]:
        rows = session.execute(
            select(TaskInstance.task_id).where(
                TaskInstance.dag_run_id == run_pk,
                TaskInstance.state.in_([TaskState.QUEUED, TaskState.RUNNING]),
            )
        )
        return list(rows.scalars())

    async def watch() -> None:
        nonlocal most
        while True:
            most = max(most, len(await env.db.run(active)))
            await anyio.sleep(0.005)

    async def ended() -> str | None:
        await scheduler.schedule_once()
        run = await env.db.run(lambda s: s.get(DagRun, run_pk))
        return run.state if run.state in ("success", "failed") else None

    with anyio.fail_after(90):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await tg.start(executor.run)

            async def one_started() -> bool:
                await scheduler.schedule_once()
                return any(env.gate.glob("*.started"))

            await eventually(one_started, within=30)
            # one task holds the slot; the others wait however long it holds it
            for _ in range(20):
                await scheduler.schedule_once()
                await anyio.sleep(0.01)
            assert len(list(env.gate.glob("*.started"))) == 1
            assert env.pool("one").running == 1
            (env.gate / "release").touch()
            assert await eventually(ended, within=60) == "success"
            executor.shutdown()
            tg.cancel_scope.cancel()
    assert most == 1
    assert sorted(p.name for p in env.gate.glob("*.started")) == [
        "t0.started",
        "t1.started",
        "t2.started",
    ]
