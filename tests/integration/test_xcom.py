"""Results between tasks on SQLite and PostgreSQL: the real scheduler and executor run DAG
files whose tasks pass results (TaskFlow, ``multiple_outputs``, ``xcom_push`` /
``xcom_pull``, a deferred task's ``end_from_trigger`` results), and tasks whose results
cannot be stored fail.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace
from datetime import UTC, datetime
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
from engine.triggerer.outbox import FiredEvent, Outbox
from engine.triggerer.persister import Persister
from tests.integration.harness import fast_executor_settings, parsed_database, running_executor
from tests.persisting import persist
from tests.waiting import eventually
from triggers.base import TaskSuccessEvent
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager
    from pathlib import Path

    from engine.db.database import Database
    from engine.executor.local import LocalExecutor
    from engine.executor.settings import ExecutorSettings

pytestmark = pytest.mark.integration

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

DAG_FILE = """
from datetime import UTC, datetime, timedelta

from engine import DAG, BaseOperator, PythonOperator, XComArg, task
from triggers.temporal import TimeDeltaTrigger


@task
def extract():
    return {"orders": [3, 4, 5], "at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)}


@task
def split(data) -> dict[str, object]:  # a dict annotation: multiple_outputs inferred
    return {"total": sum(data["orders"]), "count": len(data["orders"]), "at": data["at"]}


@task
def load(total, count, *, whole, at):
    return {"avg": total / count, "keys": sorted(whole), "at_is_datetime": isinstance(at, datetime)}


def push(ti):
    ti.xcom_push("note", ("kept", 1))
    ti.xcom_push("when", datetime(2026, 1, 2, tzinfo=UTC))


def pull(ti, upstream):
    return {
        "note": ti.xcom_pull(task_ids="push", key="note"),
        "when": ti.xcom_pull("push", key="when").isoformat(),
        "many": ti.xcom_pull(task_ids=["extract", "push"], default="-"),
        "upstream": upstream,
    }


with DAG("flow"):
    extracted = extract()
    parts = split(extracted)
    load(parts["total"], parts["count"], whole=parts, at=parts["at"])
    pusher = PythonOperator(task_id="push", python_callable=push)
    puller = PythonOperator(
        task_id="pull", python_callable=pull, op_kwargs={"upstream": pusher.output}
    )
    extracted >> puller  # it pulls extract's result too: it must run after it


class Waits(BaseOperator):
    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(timedelta(days=1)), method_name="done")

    def done(self, context, event):
        return "resumed on a worker"


@task
def report(result, rows, ti):
    return {"result": result, "rows": rows, "pulled": ti.xcom_pull("waits", key="rows")}


with DAG("ends"):
    waits = Waits(task_id="waits")
    report(XComArg(waits), XComArg(waits)["rows"])


@task
def opaque():
    return object()


@task
def big():
    return "x" * 5000


with DAG("bad"):
    opaque()
    big()


class Multiply(BaseOperator):
    # an operator of the DAG file's own: its result is a list of multiples of factor

    template_fields = ("factor",)

    def __init__(self, *, factor, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def execute(self, context):
        return [self.factor * n for n in (1, 2, 3)]


@task
def total(values):
    return sum(values)


@task
def pair(p):
    return list(p)


with DAG("own"):
    base = Multiply(task_id="base", factor=2)
    summed = total(base.output)
    scaled = Multiply(task_id="scaled", factor=summed.output)  # a result in a template field
    total.override(task_id="incremented").expand(values=base.map(lambda n: [n, 1]))
    pair.expand(p=base.zip(scaled))
"""


class Env:
    def __init__(self, db: Database, settings: ExecutorSettings, log_folder: Path) -> None:
        self.db = db
        self.settings = settings
        self.log_folder = log_folder
        self.cipher = KwargsCipher(Fernet.generate_key().decode())
        self.scheduler = Scheduler(db=db, cipher=self.cipher, settings=SchedulerSettings())

    def trigger(self, dag_id: str) -> int:
        pk = self.db.call(
            lambda s: runs.create_run(s, dag_id, run_type=runs.MANUAL, now=models.utcnow())
        )
        assert pk is not None
        return pk

    def task_instances(self, run_pk: int) -> dict[str, TaskInstance]:
        rows = self.db.call(
            lambda s: (
                s.execute(select(TaskInstance).where(TaskInstance.dag_run_id == run_pk))
                .scalars()
                .all()
            )
        )
        return {ti.task_id: ti for ti in rows}

    def results(self, run_pk: int, task_id: str) -> dict[str, Any]:
        xcoms = self.task_instances(run_pk)[task_id].xcoms or {}
        return {key: deserialize_value(value) for key, value in xcoms.items()}

    async def until(self, run_pk: int, check: Any, *, within: float = 45) -> Any:
        """Drive the scheduler until ``check(task instances)`` holds."""

        async def step() -> Any:
            await self.scheduler.schedule_once()
            rows = await self.db.run(
                lambda s: (
                    s.execute(select(TaskInstance).where(TaskInstance.dag_run_id == run_pk))
                    .scalars()
                    .all()
                )
            )
            return check({ti.task_id: ti for ti in rows})

        return await eventually(step, within=within, step=0.05)

    async def run_to_end(self, run_pk: int) -> str:
        async def ended() -> str | None:
            await self.scheduler.schedule_once()
            run = await self.db.run(lambda s: s.get(DagRun, run_pk))
            return run.state if run.state in ("success", "failed") else None

        result: str = await eventually(ended, within=60, step=0.05)
        return result

    def executor(self, **overrides: Any) -> AbstractAsyncContextManager[LocalExecutor]:
        return running_executor(self.db, self.cipher, replace(self.settings, **overrides))

    def fire(self, trigger_id: int, event: Any) -> None:
        """What the persister writes when a task's trigger fires."""
        persister = Persister(db=self.db, outbox=Outbox())
        item = FiredEvent(trigger_id=trigger_id, event=event, seq=None, fired_at=0)
        persist(self.db, persister, [item])


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "results.py").write_text(textwrap.dedent(DAG_FILE))
    db, config, _, _ = parsed_database(migrated_db_url, tmp_path, dags)
    settings = fast_executor_settings(
        config,
        max_xcom_size_bytes=1000,
    )
    yield Env(db, settings, config.logging.task_log_folder)
    db.dispose()


@pytest.mark.both_databases
async def test_taskflow_results_flow_downstream_and_are_stored_key_by_key(env: Env) -> None:
    run_pk = env.trigger("flow")
    with anyio.fail_after(90):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "success"
    tis = env.task_instances(run_pk)
    assert {ti.state for ti in tis.values()} == {TaskState.SUCCESS}
    assert env.results(run_pk, "extract") == {"return_value": {"orders": [3, 4, 5], "at": AT}}
    assert env.results(run_pk, "split") == {
        "total": 12,
        "count": 3,
        "at": AT,
        "return_value": {"total": 12, "count": 3, "at": AT},
    }
    assert env.results(run_pk, "load") == {
        "return_value": {"avg": 4.0, "keys": ["at", "count", "total"], "at_is_datetime": True}
    }
    assert env.results(run_pk, "push") == {
        "note": ("kept", 1),
        "when": datetime(2026, 1, 2, tzinfo=UTC),
    }
    assert env.results(run_pk, "pull")["return_value"] == {
        "note": ("kept", 1),
        "when": "2026-01-02T00:00:00+00:00",
        "many": [{"orders": [3, 4, 5], "at": AT}, "-"],  # push returned None: no return_value
        "upstream": None,
    }


async def test_an_own_operators_output_map_and_zip_feed_other_tasks(env: Env) -> None:
    run_pk = env.trigger("own")
    with anyio.fail_after(90):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "success"
    assert env.results(run_pk, "base") == {"return_value": [2, 4, 6]}
    assert env.results(run_pk, "total") == {"return_value": 12}
    assert env.results(run_pk, "scaled") == {"return_value": [12, 24, 36]}
    rows = env.db.call(
        lambda s: s.execute(
            select(TaskInstance.task_id, TaskInstance.map_index, TaskInstance.xcoms)
            .where(TaskInstance.dag_run_id == run_pk, TaskInstance.map_index >= 0)
            .order_by(TaskInstance.task_id, TaskInstance.map_index)
        ).all()
    )
    copies = [(t, deserialize_value(x["return_value"])) for t, _, x in rows]
    assert copies == [
        ("incremented", 3),
        ("incremented", 5),
        ("incremented", 7),
        ("pair", [2, 12]),
        ("pair", [4, 24]),
        ("pair", [6, 36]),
    ]


async def test_end_from_trigger_results_are_results_like_any_other(env: Env) -> None:
    run_pk = env.trigger("ends")
    with anyio.fail_after(90):
        async with env.executor():
            tis = await env.until(run_pk, lambda t: t["waits"].state == TaskState.DEFERRED and t)
            event = TaskSuccessEvent(xcoms={"return_value": {"ok": True}, "rows": 3})
            env.fire(tis["waits"].trigger_id, event)
            assert await env.run_to_end(run_pk) == "success"
    assert env.results(run_pk, "report") == {
        "return_value": {"result": {"ok": True}, "rows": 3, "pulled": 3}
    }


async def test_unstorable_and_oversized_results_fail_their_task(env: Env) -> None:
    run_pk = env.trigger("bad")
    with anyio.fail_after(90):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "failed"
    tis = env.task_instances(run_pk)
    assert tis["opaque"].state == TaskState.FAILED and tis["opaque"].xcoms is None
    assert tis["big"].state == TaskState.FAILED and tis["big"].xcoms is None
    run_id = env.db.call(lambda s: s.get(DagRun, run_pk).run_id)
    opaque_log = read_task_log(env.log_folder, "bad", run_id, "opaque", 1)
    assert "TypeError: task 'opaque': its return value of type object cannot be stored" in (
        opaque_log
    )
    big_log = read_task_log(env.log_folder, "bad", run_id, "big", 1)
    assert "task 'big': its return value is 5,002 bytes of JSON, over [core]" in big_log
    assert "max_xcom_size_bytes = 1,000" in big_log


async def test_a_fresh_try_clears_the_results_a_resumed_one_reads_the_runs(env: Env) -> None:
    """``start_task_run``: the results of the run's succeeded tasks travel with the try; a
    new try of a task drops the results of its earlier one."""
    run_pk = env.trigger("flow")
    tis = env.task_instances(run_pk)

    def set_state(task_id: str, **values: Any) -> None:
        env.db.call(
            lambda s: s.execute(
                update(TaskInstance).where(TaskInstance.id == tis[task_id].id).values(**values)
            )
        )

    set_state("extract", state=TaskState.SUCCESS, xcoms={"return_value": [1]})
    set_state("split", state=TaskState.QUEUED, executor_job_id=7, xcoms={"total": 5})
    run = env.db.call(
        lambda s: tasks.start_task_run(
            s, tis["split"].id, job_id=7, pid=None, hostname="h", now=models.utcnow()
        )
    )
    assert run is not None and run.xcoms == {"extract": {"return_value": [1]}}
    assert env.task_instances(run_pk)["split"].xcoms is None
