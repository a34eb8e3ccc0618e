"""``TriggerDagRunOperator`` on SQLite and PostgreSQL, with the real scheduler, executor and
triggerer in-process: the run it creates (conf, run id, templated), its ``trigger_run_id``
XCom, waiting for the run polling over the request channel or deferred to the triggerer, and
what happens when the run already exists (fail, skip, reset)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from engine.db.queries import dags
from engine.states import TaskState
from tests.integration.inprocess_engine import InProcessEngine

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

DAGS = """
from engine import DAG, TriggerDagRunOperator, task
from engine.exceptions import AirflowFailException


@task
def echo(dag_run=None):
    return dag_run.conf


@task
def boom():
    raise AirflowFailException("boom")


with DAG("target"):
    echo()

with DAG("target_fails"):
    boom()

with DAG("fire"):
    TriggerDagRunOperator(
        task_id="fire",
        trigger_dag_id="target",
        trigger_run_id="child_of_{{ run_id }}",
        conf={"parent": "{{ dag_run.run_id }}", "n": 3},
    )

with DAG("wait_polling"):
    TriggerDagRunOperator(
        task_id="wait", trigger_dag_id="target", wait_for_completion=True, poke_interval=0.1
    )

with DAG("wait_deferred"):
    TriggerDagRunOperator(
        task_id="wait",
        trigger_dag_id="target",
        wait_for_completion=True,
        deferrable=True,
        poke_interval=0.1,
    )
    TriggerDagRunOperator(
        task_id="wait_fails",
        trigger_dag_id="target_fails",
        wait_for_completion=True,
        deferrable=True,
        poke_interval=0.1,
    )

with DAG("paused_check"):
    TriggerDagRunOperator(
        task_id="strict", trigger_dag_id="target", fail_when_dag_is_paused=True
    ) >> TriggerDagRunOperator(
        task_id="lenient",
        trigger_dag_id="target",
        wait_for_completion="{{ dag_run.conf['wait'] }}",
        trigger_rule="all_done",
    )

with DAG("no_logical_date"):
    TriggerDagRunOperator(
        task_id="fire",
        trigger_dag_id="target",
        logical_date=None,
        wait_for_completion=True,
        deferrable=True,  # the triggerer watches logical dates: this one is polled
        poke_interval=0.1,
    )

for dag_id, options in [
    ("again", {}),
    ("again_skip", {"skip_when_already_exists": True}),
    ("again_reset", {"reset_dag_run": True}),
]:
    with DAG(dag_id):
        TriggerDagRunOperator(
            task_id="fire", trigger_dag_id="target", trigger_run_id="fixed", **options
        )
"""


@pytest.fixture
def engine(migrated_db_url: str, tmp_path: Path):
    engine = InProcessEngine(migrated_db_url, tmp_path, {"trigger_dags.py": DAGS})
    yield engine
    engine.db.dispose()


@pytest.mark.both_databases
async def test_it_creates_the_run_with_its_conf_and_run_id_and_pushes_the_run_id(
    engine: InProcessEngine,
) -> None:
    parent = engine.trigger("fire")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(parent) == ["success"]
            [child] = engine.runs_of("target")
            assert await engine.run_to_end(child.id) == ["success"]
    parent_run_id = engine.run(parent).run_id
    assert child.run_id == f"child_of_{parent_run_id}"
    assert child.run_type == "manual"
    assert child.logical_date is not None
    assert child.conf == {"parent": parent_run_id, "n": 3}  # templated, then sent
    assert engine.xcom(parent, "fire", "trigger_run_id") == child.run_id
    assert engine.xcom(child.id, "echo") == {"parent": parent_run_id, "n": 3}


async def test_wait_for_completion_polls_until_the_run_succeeded(engine: InProcessEngine) -> None:
    parent = engine.trigger("wait_polling")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(parent) == ["success"]
    [child] = engine.runs_of("target")
    assert child.state == "success"
    [waiter] = engine.instances(parent)
    assert child.end_date is not None and waiter.end_date is not None
    assert child.end_date <= waiter.end_date  # it ended only after the run it waited for
    assert "finished with allowed state 'success'" in engine.log(parent, "wait")


@pytest.mark.both_databases
async def test_deferrable_wait_runs_in_the_triggerer_and_fails_with_the_run(
    engine: InProcessEngine,
) -> None:
    parent = engine.trigger("wait_deferred")
    with anyio.fail_after(60):
        async with engine.running(triggerer=True):
            assert await engine.run_to_end(parent) == ["failed"]
    states = engine.states(parent)
    assert states == {"wait": TaskState.SUCCESS, "wait_fails": TaskState.FAILED}
    [child] = engine.runs_of("target")
    [failing] = engine.runs_of("target_fails")
    assert (child.state, failing.state) == ("success", "failed")
    waiter = {ti.task_id: ti for ti in engine.instances(parent)}
    assert waiter["wait"].try_number == 1 and waiter["wait"].next_method is None
    # pushed before the deferral: the XCom survives it
    assert engine.xcom(parent, "wait", "trigger_run_id") == child.run_id
    log = engine.log(parent, "wait_fails")
    assert "deferred" in log.lower()
    assert f"DAG 'target_fails' run {failing.run_id!r} failed with failed state" in log


async def test_an_existing_run_fails_the_task_or_is_skipped_or_reset(
    engine: InProcessEngine,
) -> None:
    first = engine.trigger("again")
    with anyio.fail_after(90):
        async with engine.running():
            assert await engine.run_to_end(first) == ["success"]
            [child] = engine.runs_of("target")
            assert await engine.run_to_end(child.id) == ["success"]
            assert child.run_id == "fixed"
            fails, skips, resets = (
                engine.trigger(d) for d in ("again", "again_skip", "again_reset")
            )
            assert await engine.run_to_end(fails, skips, resets) == ["failed", "success", "success"]
            assert await engine.run_to_end(child.id) == ["success"]
    assert engine.states(fails) == {"fire": TaskState.FAILED}
    assert "DagRunAlreadyExists: DAG 'target' already has run 'fixed'" in engine.log(fails, "fire")
    assert engine.states(skips) == {"fire": TaskState.SKIPPED}
    assert engine.states(resets) == {"fire": TaskState.SUCCESS}
    assert len(engine.runs_of("target")) == 1  # no second run
    [echo] = engine.instances(child.id)
    assert echo.try_number == 2  # the reset cleared it: it ran again


async def test_logical_date_none_triggers_a_run_without_one(engine: InProcessEngine) -> None:
    parent = engine.trigger("no_logical_date")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(parent) == ["success"]
    [child] = engine.runs_of("target")
    assert (child.logical_date, child.state) == (None, "success")
    assert engine.xcom(parent, "fire", "trigger_run_id") == child.run_id


async def test_a_paused_dag_fails_the_task_only_with_fail_when_dag_is_paused(
    engine: InProcessEngine,
) -> None:
    engine.db.call(lambda s: dags.set_paused(s, "target", paused=True))
    parent = engine.trigger("paused_check", conf={"wait": False})
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(parent) == ["success"]
    assert engine.states(parent) == {"strict": TaskState.FAILED, "lenient": TaskState.SUCCESS}
    assert "DagIsPaused: Dag target is paused" in engine.log(parent, "strict")
    [child] = engine.runs_of("target")  # created by the lenient one, waiting for the unpause
    assert child.state == "queued"
    assert engine.xcom(parent, "lenient", "trigger_run_id") == child.run_id
    assert engine.xcom(parent, "lenient", "trigger_dag_id") == "target"
