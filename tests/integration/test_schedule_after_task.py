"""``[scheduler] schedule_after_task_execution``: the executor advances a task's run in the
transaction that records the task's end (Airflow's "mini scheduler"), so a run's tasks run
and the run ends with no scheduler at all; switched off, nothing moves until one loops.

The executor runs alone here (no scheduler part), on both databases, with real task
processes and a real DAG file.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import anyio
import pytest
from sqlalchemy import select, update

from engine.db import models
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import runs
from engine.states import DagRunState, TaskState
from tests.integration.harness import fast_executor_settings, parsed_database, running_executor
from tests.waiting import wait_until

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.orm import Session

    from engine.db.database import Database

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]

DAG_FILE = """
from engine import DAG, task

@task
def first():
    return 1

@task
def second(value):
    return value + 1

@task
def boom():
    raise ValueError("boom")

@task
def after_boom():
    return "never"

with DAG("chain", schedule=None):
    second(first())

with DAG("failing", schedule=None):
    boom() >> after_boom()
"""


def _start_run(db: Database, dag_id: str, first_task: str) -> int:
    """A running run of ``dag_id`` whose ``first_task`` is ``scheduled`` (what a scheduler
    loop does once); returns its primary key."""

    def start(session: Session) -> int:
        now = models.utcnow()
        pk = runs.create_run(session, dag_id, run_type=runs.MANUAL, now=now)
        assert pk is not None
        runs.start_queued_runs(session, dag_id, now=now)
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.dag_run_id == pk, TaskInstance.task_id == first_task)
            .values(state=TaskState.SCHEDULED)
        )
        return pk

    return db.call(start)


def _states(db: Database, run_pk: int) -> tuple[str, dict[str, str]]:
    def read(session: Session) -> tuple[str, dict[str, str]]:
        run_state = session.execute(select(DagRun.state).where(DagRun.id == run_pk)).scalar_one()
        rows = session.execute(
            select(TaskInstance.task_id, TaskInstance.state).where(
                TaskInstance.dag_run_id == run_pk
            )
        ).all()
        return str(run_state), {str(t): str(s) for t, s in rows}

    return db.call(read)


@pytest.fixture
def parsed(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "mini.py").write_text(textwrap.dedent(DAG_FILE))
    parsed = parsed_database(migrated_db_url, tmp_path, dags)
    yield parsed
    parsed.db.dispose()


async def test_a_chain_runs_to_its_end_without_a_scheduler(parsed) -> None:
    db, config, cipher, _ = parsed
    chain = _start_run(db, "chain", "first")
    failing = _start_run(db, "failing", "boom")
    settings = fast_executor_settings(config)
    assert settings.schedule_after_task_execution  # the default
    with anyio.fail_after(60):
        async with running_executor(db, cipher, settings):
            await wait_until(lambda: _states(db, chain)[0] == DagRunState.SUCCESS)
            await wait_until(lambda: _states(db, failing)[0] == DagRunState.FAILED)
    assert _states(db, chain)[1] == {"first": TaskState.SUCCESS, "second": TaskState.SUCCESS}
    assert _states(db, failing)[1] == {
        "boom": TaskState.FAILED,
        "after_boom": TaskState.UPSTREAM_FAILED,
    }


async def test_the_next_task_is_claimed_in_the_transaction_that_made_it_ready(parsed) -> None:
    # The first task's end schedules the second and claims it for the executor in the same
    # transaction: no claim of the executor's own takes it.
    db, config, cipher, _ = parsed
    chain = _start_run(db, "chain", "first")
    settings = fast_executor_settings(config)
    with anyio.fail_after(60):
        async with running_executor(db, cipher, settings) as executor:
            await wait_until(lambda: _states(db, chain)[0] == DagRunState.SUCCESS)
            assert executor.stats.claimed == 2
            assert executor.stats.claimed_with_outcome == 1


async def test_at_parallelism_1_a_claim_with_an_outcome_never_runs_two_at_once(parsed) -> None:
    # parallelism 1 and two runs' first tasks scheduled: the one slot takes one of them;
    # its end frees the slot for one task (the next of its chain, or the other run's), and
    # never more than one runs.
    db, config, cipher, _ = parsed
    chains = [_start_run(db, "chain", "first") for _ in range(2)]
    settings = fast_executor_settings(config, parallelism=1)
    most = 0
    with anyio.fail_after(60):
        async with running_executor(db, cipher, settings) as executor:

            def done() -> bool:
                nonlocal most
                most = max(most, _running(db))
                return all(_states(db, pk)[0] == DagRunState.SUCCESS for pk in chains)

            await wait_until(done, step=0.005, within=30)
            assert executor.stats.claimed == 4
    assert most == 1


def _running(db: Database) -> int:
    query = select(TaskInstance.id).where(
        TaskInstance.state.in_((TaskState.QUEUED, TaskState.RUNNING))
    )
    return len(db.call(lambda s: s.execute(query).all()))


async def test_switched_off_the_next_task_waits_for_a_scheduler(parsed) -> None:
    db, config, cipher, _ = parsed
    chain = _start_run(db, "chain", "first")
    settings = fast_executor_settings(config, schedule_after_task_execution=False)
    with anyio.fail_after(60):
        async with running_executor(db, cipher, settings) as executor:
            await wait_until(lambda: _states(db, chain)[1]["first"] == TaskState.SUCCESS)
            await wait_until(lambda: executor.running == 0)
    # the executor is idle, the first task's end recorded: nothing decided the second
    assert _states(db, chain) == (
        DagRunState.RUNNING,
        {"first": TaskState.SUCCESS, "second": TaskState.NONE},
    )
