"""Branching on SQLite and PostgreSQL through the real scheduler and executor: a branch
whose join runs under ``none_failed_min_one_success``, short circuits (all downstream, or
only the direct tasks), and ``LatestOnlyOperator`` over the runs a catching-up schedule
creates. The task process computes what to skip; the executor skips it with the success."""

from __future__ import annotations

import textwrap
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select, update

from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import runs, tasks
from engine.executor.task_logs import read_task_log
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import TaskState
from tests.integration.harness import fast_executor_settings, parsed_database, running_executor
from tests.waiting import eventually
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from engine.db.database import Database
    from engine.executor.local import LocalExecutor
    from engine.executor.settings import ExecutorSettings

pytestmark = pytest.mark.integration

OK, SKIP, NONE = TaskState.SUCCESS, TaskState.SKIPPED, TaskState.NONE

DAG_FILE = """
from datetime import datetime, timedelta

from engine import DAG, EmptyOperator, LatestOnlyOperator, ShortCircuitOperator, TriggerRule, task


@task.branch
def pick(params):
    return params["go"]


with DAG("branch", params={{"go": "left"}}):
    chosen = pick()
    left, right = EmptyOperator(task_id="left"), EmptyOperator(task_id="right")
    right_more = EmptyOperator(task_id="right_more")
    join = EmptyOperator(task_id="join", trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    chosen >> [left, right]
    right >> right_more
    [left, right_more] >> join >> EmptyOperator(task_id="after")


@task.short_circuit
def never():
    return False


with DAG("short"):
    everything = never()
    a1 = EmptyOperator(task_id="a1")
    everything >> a1 >> EmptyOperator(task_id="a2")
    a1 >> EmptyOperator(task_id="a_done", trigger_rule="all_done")

    direct = ShortCircuitOperator(
        task_id="direct", python_callable=lambda: 0, ignore_downstream_trigger_rules=False
    )
    b1 = EmptyOperator(task_id="b1")
    direct >> b1 >> EmptyOperator(task_id="b2")
    b1 >> EmptyOperator(task_id="b_done", trigger_rule="all_done")

    goes = ShortCircuitOperator(task_id="goes", python_callable=lambda: "yes")
    goes >> EmptyOperator(task_id="c1")


with DAG(
    "latest",
    schedule=timedelta(days=1),
    start_date=datetime.fromisoformat("{start}"),
    catchup=True,
):
    LatestOnlyOperator(task_id="latest_only") >> EmptyOperator(task_id="work") >> EmptyOperator(
        task_id="report"
    )
"""


class Env:
    def __init__(
        self, db: Database, settings: ExecutorSettings, log_folder: Path, start: datetime
    ) -> None:
        self.db = db
        self.start = start  # the ``latest`` DAG's start_date
        self.settings = settings
        self.log_folder = log_folder
        self.cipher = KwargsCipher(Fernet.generate_key().decode())
        self.scheduler = Scheduler(db=db, cipher=self.cipher, settings=SchedulerSettings())

    def trigger(self, dag_id: str, conf: Any = None) -> int:
        pk = self.db.call(
            lambda s: runs.create_run(
                s, dag_id, run_type=runs.MANUAL, now=models.utcnow(), conf=conf
            )
        )
        assert pk is not None
        return pk

    def states(self, run_pk: int) -> dict[str, str]:
        rows = self.db.call(
            lambda s: s.execute(
                select(TaskInstance.task_id, TaskInstance.state).where(
                    TaskInstance.dag_run_id == run_pk
                )
            ).all()
        )
        return {str(task_id): str(state) for task_id, state in rows}

    def run_of(self, run_pk: int) -> DagRun:
        run: DagRun = self.db.call(lambda s: s.get(DagRun, run_pk))
        return run

    async def run_to_end(self, *run_pks: int) -> list[str]:
        def read(session: Any) -> list[str]:
            return [str(session.get(DagRun, pk).state) for pk in run_pks]

        async def ended() -> list[str] | None:
            await self.scheduler.schedule_once()
            states = await self.db.run(read)
            return states if all(s in ("success", "failed") for s in states) else None

        result: list[str] = await eventually(ended, within=90, step=0.05)
        return result

    @asynccontextmanager
    async def executor(self) -> AsyncIterator[LocalExecutor]:
        async with running_executor(self.db, self.cipher, self.settings) as executor:
            yield executor

    def log(self, run_pk: int, task_id: str) -> str:
        run = self.run_of(run_pk)
        return read_task_log(self.log_folder, run.dag_id, run.run_id, task_id, 1)


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    # The ``latest`` DAG's ticks fall 12 hours from now on either side: runs at now - 60 h,
    # now - 36 h and now - 12 h; the next tick, now + 12 h, is not due. Only the last run is
    # the latest, and stays so however long the test takes.
    start = (datetime.now(UTC) - timedelta(hours=60)).replace(microsecond=0)
    (dags / "branching.py").write_text(textwrap.dedent(DAG_FILE.format(start=start.isoformat())))
    db, config, _, _ = parsed_database(migrated_db_url, tmp_path, dags)
    settings = fast_executor_settings(config)
    yield Env(db, settings, config.logging.task_log_folder, start)
    db.dispose()


@pytest.mark.both_databases
async def test_a_branch_skips_the_other_path_and_its_join_runs(env: Env) -> None:
    left = env.trigger("branch")
    right = env.trigger("branch", conf={"go": ["right"]})
    with anyio.fail_after(120):
        async with env.executor():
            assert await env.run_to_end(left, right) == ["success", "success"]
    assert env.states(left) == {
        "pick": OK,
        "left": OK,
        "right": SKIP,  # skipped by the branch, with its success
        "right_more": SKIP,  # all_success below a skipped task: skipped by the scheduler
        "join": OK,  # none_failed_min_one_success: left succeeded
        "after": OK,
    }
    assert env.states(right) == {
        "pick": OK,
        "left": SKIP,
        "right": OK,
        "right_more": OK,
        "join": OK,
        "after": OK,
    }
    xcoms = env.db.call(
        lambda s: s.execute(
            select(TaskInstance.xcoms).where(
                TaskInstance.dag_run_id == left, TaskInstance.task_id == "pick"
            )
        ).scalar_one()
    )
    assert deserialize_value(xcoms["return_value"]) == "left"  # the branch's choice is its result
    assert "try 1: task succeeded; skipping right ===" in env.log(left, "pick")
    assert "Branch 'pick' follows ['left']; skipping ['right']" in env.log(left, "pick")


async def test_a_branch_to_a_task_not_downstream_fails_and_skips_nothing(env: Env) -> None:
    run_pk = env.trigger("branch", conf={"go": "after"})
    with anyio.fail_after(120):
        async with env.executor():
            assert await env.run_to_end(run_pk) == ["failed"]
    states = env.states(run_pk)
    assert states["pick"] == TaskState.FAILED
    assert {states[t] for t in ("left", "right", "right_more", "join", "after")} == {
        TaskState.UPSTREAM_FAILED
    }
    assert "task 'after' is not directly downstream of it" in env.log(run_pk, "pick")


async def test_short_circuits_skip_all_downstream_or_only_the_direct_tasks(env: Env) -> None:
    run_pk = env.trigger("short")
    with anyio.fail_after(120):
        async with env.executor():
            assert await env.run_to_end(run_pk) == ["success"]
    assert env.states(run_pk) == {
        "never": OK,
        "a1": SKIP,
        "a2": SKIP,
        "a_done": SKIP,  # ignore_downstream_trigger_rules=True: its all_done is ignored
        "direct": OK,
        "b1": SKIP,
        "b2": SKIP,
        "b_done": OK,  # only the direct task was skipped: all_done runs after it
        "goes": OK,
        "c1": OK,
    }


async def test_latest_only_runs_downstream_for_the_latest_interval_and_manual_runs(
    env: Env,
) -> None:
    manual = env.trigger("latest")
    with anyio.fail_after(120):
        async with env.executor():

            async def three_scheduled_runs() -> list[int] | None:
                await env.scheduler.schedule_once()
                pks = await env.db.run(
                    lambda s: list(
                        s.execute(
                            select(DagRun.id)
                            .where(DagRun.dag_id == "latest", DagRun.run_type == runs.SCHEDULED)
                            .order_by(DagRun.logical_date)
                        ).scalars()
                    )
                )
                return pks if len(pks) == 3 else None

            scheduled = await eventually(three_scheduled_runs, within=30, step=0.05)
            assert await env.run_to_end(manual, *scheduled) == ["success"] * 4
    behind = {"latest_only": OK, "work": SKIP, "report": SKIP}
    latest = {"latest_only": OK, "work": OK, "report": OK}
    assert [env.states(pk) for pk in scheduled] == [behind, behind, latest]
    assert env.states(manual) == latest
    ends = [_utc(env.run_of(pk).data_interval_end) for pk in scheduled]
    assert ends == [env.start + timedelta(days=k) for k in range(3)]


def _utc(value: datetime | None) -> datetime:
    assert value is not None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def test_skipping_marks_only_waiting_tasks_of_the_same_run(env: Env) -> None:
    one, other = env.trigger("branch"), env.trigger("branch")

    def prepare(session: Any) -> int:
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.dag_run_id == one, TaskInstance.task_id == "left")
            .values(state=TaskState.SCHEDULED)
        )
        return int(
            session.execute(
                select(TaskInstance.id).where(
                    TaskInstance.dag_run_id == one, TaskInstance.task_id == "pick"
                )
            ).scalar_one()
        )

    ti_id = env.db.call(prepare)
    now = models.utcnow()
    skipped = env.db.call(
        lambda s: tasks.skip_waiting_tasks(s, ti_id, ["left", "right", "gone"], now=now)
    )
    assert skipped == ["right"]
    assert env.states(one)["left"] == TaskState.SCHEDULED  # decided before: kept
    assert env.states(one)["right"] == SKIP
    assert set(env.states(other).values()) == {NONE}
    assert env.db.call(lambda s: tasks.skip_waiting_tasks(s, ti_id, [], now=now)) == []
