"""``@asset`` / ``@asset.multi``, setup and teardown tasks, and edge labels through the real
DAG processor (in-process parse), scheduler and executor: an ``@asset`` materialises its asset
and the ``@asset`` scheduled on it runs with it as its inlet; ``@asset.multi`` updates every
outlet and starts what waits on all of them; a teardown runs after its work failed, and the
run's state ignores a teardown's failure unless ``on_failure_fail_dagrun``; labels are
stored with the DAG's tasks and shown."""

from __future__ import annotations

import textwrap
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.models import Asset, AssetEvent, DagRun, DagTask, TaskInstance
from engine.db.queries import runs
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import TaskState
from engine.views.dags import show_dag
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

OK, FAILED = TaskState.SUCCESS, TaskState.FAILED

DAG_FILE = """
from pathlib import Path

from engine import (
    DAG, Asset, BaseNotifier, EmptyOperator, Label, PythonOperator, asset, setup, task, teardown
)


class FileNotifier(BaseNotifier):
    template_fields = ("message",)

    def __init__(self, message):
        super().__init__()
        self.message = message

    def notify(self, context):
        Path(NOTES).write_text(self.message)


NOTES = "{notes}"
with DAG("notified", on_success_callback=FileNotifier("{{ dag_run.dag_id }} ended: {{ reason }}")):
    EmptyOperator(task_id="only", on_success_callback=[FileNotifier("task {{ ti.task_id }}")])


@asset(schedule=None, uri="file:///data/raw_orders", group="orders", extra={"owner": "etl"})
def raw_orders(self, context):
    return [self.name, self.uri, context["dag_run"].dag_id]


@asset(schedule=raw_orders)
def order_report(self, raw_orders, limit=3):
    return [self.name, raw_orders.name, raw_orders.uri, limit]


@asset.multi(schedule=None, outlets=[Asset("left"), Asset("right")])
def both_sides():
    return "made both"


both = both_sides
with DAG("after_both", schedule=both):
    EmptyOperator(task_id="consume")


def boom():
    raise ValueError("boom")


@setup
def create_cluster():
    return "cluster-1"


@task
def run_job(cluster):
    raise RuntimeError(f"job on {cluster} failed")


@teardown
def delete_cluster(cluster):
    return f"deleted {cluster}"


with DAG("work_fails"):
    cluster = create_cluster()
    run_job(cluster) >> delete_cluster(cluster)


for dag_id, fail_dagrun in (("teardown_fails", False), ("teardown_fails_run", True)):
    with DAG(dag_id):
        made = EmptyOperator(task_id="make").as_setup()
        work = EmptyOperator(task_id="work")
        gone = PythonOperator(task_id="release", python_callable=boom)
        made >> work >> gone.as_teardown(setups=made, on_failure_fail_dagrun=fail_dagrun)


with DAG("labelled"):
    check = EmptyOperator(task_id="check")
    load, alert, audit = (EmptyOperator(task_id=t) for t in ("load", "alert", "audit"))
    check >> Label("valid") >> load
    check >> Label("invalid") >> [alert, audit]
"""


class Env:
    notes: Path

    def __init__(self, db: Database, settings: ExecutorSettings) -> None:
        self.db = db
        self.settings = settings
        self.cipher = KwargsCipher(Fernet.generate_key().decode())
        self.scheduler = Scheduler(db=db, cipher=self.cipher, settings=SchedulerSettings())

    def trigger(self, dag_id: str) -> int:
        pk = self.db.call(
            lambda s: runs.create_run(s, dag_id, run_type=runs.MANUAL, now=models.utcnow())
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

    def result(self, run_pk: int, task_id: str) -> Any:
        xcoms = self.db.call(
            lambda s: s.execute(
                select(TaskInstance.xcoms).where(
                    TaskInstance.dag_run_id == run_pk, TaskInstance.task_id == task_id
                )
            ).scalar_one()
        )
        return deserialize_value(xcoms["return_value"])

    def runs_of(self, dag_id: str) -> list[tuple[int, str, str]]:
        rows = self.db.call(
            lambda s: s.execute(
                select(DagRun.id, DagRun.run_type, DagRun.state)
                .where(DagRun.dag_id == dag_id)
                .order_by(DagRun.id)
            ).all()
        )
        return [(int(pk), str(kind), str(state)) for pk, kind, state in rows]

    async def run_to_end(self, *run_pks: int) -> list[str]:
        def read(session: Any) -> list[str]:
            return [str(session.get(DagRun, pk).state) for pk in run_pks]

        async def ended() -> list[str] | None:
            await self.scheduler.schedule_once()
            states = await self.db.run(read)
            return states if all(s in ("success", "failed") for s in states) else None

        result: list[str] = await eventually(ended, within=90, step=0.05)
        return result

    async def finished_run_of(self, dag_id: str) -> tuple[int, str, str]:
        async def ended() -> tuple[int, str, str] | None:
            await self.scheduler.schedule_once()
            found = await anyio.to_thread.run_sync(self.runs_of, dag_id)
            done = [run for run in found if run[2] in ("success", "failed")]
            return done[0] if done else None

        result: tuple[int, str, str] = await eventually(ended, within=90, step=0.05)
        return result

    @asynccontextmanager
    async def executor(self) -> AsyncIterator[LocalExecutor]:
        async with running_executor(self.db, self.cipher, self.settings) as executor:
            yield executor


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    notes = tmp_path / "notes.txt"
    (dags / "asset_functions.py").write_text(
        textwrap.dedent(DAG_FILE).replace("{notes}", str(notes))
    )
    db, config, _, _ = parsed_database(migrated_db_url, tmp_path, dags)
    env = Env(db, fast_executor_settings(config))
    env.notes = notes
    yield env
    db.dispose()


@pytest.mark.both_databases
async def test_an_asset_function_materialises_and_starts_the_asset_scheduled_on_it(
    env: Env,
) -> None:
    stored = env.db.call(
        lambda s: s.execute(select(Asset.uri).where(Asset.name == "raw_orders")).scalar_one()
    )
    assert stored == "file:///data/raw_orders"
    producer = env.trigger("raw_orders")
    with anyio.fail_after(120):
        async with env.executor():
            assert await env.run_to_end(producer) == ["success"]
            consumer_pk, kind, state = await env.finished_run_of("order_report")
    assert env.result(producer, "raw_orders") == [
        "raw_orders",
        "file:///data/raw_orders",
        "raw_orders",
    ]
    assert (kind, state) == ("asset_triggered", "success")
    # self is the asset; the parameter named raw_orders is the upstream asset, its inlet
    assert env.result(consumer_pk, "order_report") == [
        "order_report",
        "raw_orders",
        "file:///data/raw_orders",
        3,
    ]
    events = env.db.call(
        lambda s: (
            s.execute(select(Asset.name).join(AssetEvent, AssetEvent.asset_id == Asset.id))
            .scalars()
            .all()
        )
    )
    assert sorted(events) == ["order_report", "raw_orders"]


async def test_a_multi_asset_function_updates_every_outlet(env: Env) -> None:
    run_pk = env.trigger("both_sides")
    with anyio.fail_after(120):
        async with env.executor():
            assert await env.run_to_end(run_pk) == ["success"]
            _, kind, state = await env.finished_run_of("after_both")
    assert (kind, state) == ("asset_triggered", "success")
    events = env.db.call(
        lambda s: (
            s.execute(select(Asset.name).join(AssetEvent, AssetEvent.asset_id == Asset.id))
            .scalars()
            .all()
        )
    )
    assert sorted(events) == ["left", "right"]


@pytest.mark.both_databases
async def test_a_teardown_runs_after_failed_work_and_teardown_failures_follow_the_flag(
    env: Env,
) -> None:
    work_fails = env.trigger("work_fails")
    teardown_fails = env.trigger("teardown_fails")
    teardown_fails_run = env.trigger("teardown_fails_run")
    with anyio.fail_after(120):
        async with env.executor():
            outcome = await env.run_to_end(work_fails, teardown_fails, teardown_fails_run)
    # the work failed: the teardown still ran, and the run failed (the work is a leaf)
    assert env.states(work_fails) == {
        "create_cluster": OK,
        "run_job": FAILED,
        "delete_cluster": OK,
    }
    assert env.result(work_fails, "delete_cluster") == "deleted cluster-1"
    # a failed teardown leaves the run to its work; on_failure_fail_dagrun makes it count
    assert env.states(teardown_fails) == {"make": OK, "work": OK, "release": FAILED}
    assert env.states(teardown_fails_run) == {"make": OK, "work": OK, "release": FAILED}
    assert outcome == ["failed", "success", "failed"]


DAG_IDS = ("labelled", "work_fails")


def test_labels_and_roles_are_stored_and_shown(env: Env) -> None:
    rows = env.db.call(
        lambda s: {
            t.task_id: (t.edge_labels, t.is_setup, t.is_teardown, t.trigger_rule)
            for t in s.execute(
                select(DagTask).where(DagTask.dag_id.in_(["labelled", "work_fails"]))
            )
            .scalars()
            .all()
        }
    )
    assert rows["check"][0] == {"alert": "invalid", "audit": "invalid", "load": "valid"}
    assert rows["load"][0] is None
    assert rows["create_cluster"][1:3] == (True, False)
    assert rows["delete_cluster"][1:] == (False, True, "all_done_setup_success")
    shown = env.db.call(lambda s: show_dag(s, "labelled"))
    assert shown is not None
    check = next(t for t in shown["tasks"] if t["task_id"] == "check")
    assert check["edge_labels"] == {"alert": "invalid", "audit": "invalid", "load": "valid"}
    setup_shown = env.db.call(lambda s: show_dag(s, "work_fails"))
    assert setup_shown is not None
    assert {t["task_id"]: t["role"] for t in setup_shown["tasks"]} == {
        "create_cluster": "setup",
        "run_job": None,
        "delete_cluster": "teardown",
    }


async def test_a_notifier_is_a_callback_that_renders_its_templates(env: Env) -> None:
    run_pk = env.trigger("notified")
    with anyio.fail_after(120):
        async with env.executor():
            assert await env.run_to_end(run_pk) == ["success"]

            async def dag_callback_wrote() -> bool:
                return env.notes.exists() and env.notes.read_text() == "notified ended: success"

            await eventually(dag_callback_wrote, within=60, step=0.05)
