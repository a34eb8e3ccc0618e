"""Dynamic task mapping on SQLite and PostgreSQL: the real DAG processor, scheduler and
executor run DAG files with mapped tasks (literal lists, upstream lists and dicts,
``expand_kwargs``, a cross product, a classic operator), and the copies' results reach the
task below them; an empty input skips, a failing copy fails the tasks below it, a copy
retries alone, a result that cannot be mapped over fails its task, and the CLI prints a
copy's result and log.
"""

from __future__ import annotations

import json
import textwrap
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from click.testing import CliRunner
from cryptography.fernet import Fernet
from sqlalchemy import select

from engine.cli.main import cli
from engine.config import load_config
from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import actions, runs
from engine.executor.task_logs import read_task_log
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import TaskState
from engine.triggerer.outbox import FiredEvent, Outbox
from engine.triggerer.persister import Persister
from tests.integration.harness import fast_executor_settings, parsed_database, running_executor
from tests.persisting import persist
from tests.waiting import eventually
from triggers.base import TriggerEvent
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from engine.config import Config
    from engine.db.database import Database
    from engine.executor.local import LocalExecutor
    from engine.executor.settings import ExecutorSettings

pytestmark = pytest.mark.integration

DAG_FILE = """
from datetime import timedelta

from engine import DAG, BaseOperator, BashOperator, PythonOperator, task
from triggers.temporal import TimeDeltaTrigger


@task
def numbers():
    return [1, 2, 3]


@task
def add(x, y, ti, map_index):
    assert ti.map_index == map_index
    return {"sum": x + y, "index": map_index}


@task
def total(values):
    return sorted(v["sum"] for v in values)


@task
def pairs():
    return {"a": 1, "b": 2}


@task
def show(pair):
    key, value = pair
    return f"{key}={value}"


@task
def joined(texts):
    return ",".join(texts)


@task
def kwargs_rows():
    return [{"x": 1, "y": 100}, {"x": 2, "y": 200}]


def pull(ti):
    return {
        "one": ti.xcom_pull(task_ids="add", map_indexes=1),
        "some": ti.xcom_pull(task_ids="add", map_indexes=[0, 2]),
        "all": ti.xcom_pull(task_ids="add"),
    }


with DAG("literal"):
    added = add.partial(y=10).expand(x=[1, 2, 3])
    total(added)
    puller = PythonOperator(task_id="pull", python_callable=pull)
    added >> puller
    echoed = BashOperator.partial(task_id="echo").expand(
        bash_command=["echo first", "echo second"]
    )


@task
def letters():
    return ["a", "b"]


@task(trigger_rule="always")
def eager(x):
    return x


@task
def collect_all(values):
    return list(values)


@task
def double(x):
    return x * 2


def shout(item):
    key, value = item
    return (key.upper(), value * 10)


with DAG("upstream"):
    crossed = add.expand(x=numbers(), y=[100, 200])
    zipped = show.override(task_id="show_zip").expand(pair=numbers().zip(letters()))
    joined.override(task_id="zipped")(zipped)
    shouted = show.override(task_id="show_map").expand(pair=pairs().map(shout))
    joined.override(task_id="mapped")(shouted)
    collect_all(eager.expand(x=numbers()))  # "always" still waits for what it maps over
    first = double.override(task_id="double_first").expand(x=[1, 2, 3])
    collect_all.override(task_id="chained")(double.expand(x=first))  # copies over copies
    total(crossed)
    joined(show.expand(pair=pairs()))
    total.override(task_id="by_kwargs")(add.expand_kwargs(kwargs_rows()))
    total.override(task_id="by_literal_kwargs")(
        add.expand_kwargs([{"x": 5, "y": 5}, {"x": 6, "y": 6}])
    )


@task
def nothing():
    return []


@task
def never(x):
    raise AssertionError("an empty input must run no copy")


@task
def after(values):
    return "ran"


@task(trigger_rule="all_done")
def cleanup():
    return "cleaned"


with DAG("empty"):
    mapped = never.expand(x=nothing())
    after(mapped)
    mapped >> cleanup()


@task
def fragile(x):
    if x == 2:
        raise ValueError("two is bad")
    return x


with DAG("one_fails"):
    after(fragile.expand(x=[1, 2, 3]))


@task(retries=1, retry_delay=timedelta(0))
def flaky(x, ti):
    if x == 2 and ti.try_number == 1:
        raise ValueError("first try of copy 1 fails")
    return x * 10


@task
def collect(values):
    return list(values)


class Waits(BaseOperator):
    def __init__(self, *, label, **kwargs):
        super().__init__(**kwargs)
        self.label = label

    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(timedelta(days=1)), method_name="done")

    def done(self, context, event):
        return f"{self.label} resumed as copy {context['ti'].map_index} with {event}"


with DAG("deferred"):
    collect(Waits.partial(task_id="waits").expand(label=["a", "b"]))


with DAG("retry"):
    collect.override(task_id="sum_up")(flaky.expand(x=[1, 2, 3]))


@task
def scalar():
    return 5


with DAG("unmappable"):
    never.expand(x=scalar())
"""


class Env:
    def __init__(self, db: Database, settings: ExecutorSettings, config: Config) -> None:
        self.db = db
        self.settings = settings
        self.config = config
        self.cipher = KwargsCipher(Fernet.generate_key().decode())
        self.scheduler = Scheduler(db=db, cipher=self.cipher, settings=SchedulerSettings())

    def trigger(self, dag_id: str) -> int:
        pk = self.db.call(
            lambda s: runs.create_run(s, dag_id, run_type=runs.MANUAL, now=models.utcnow())
        )
        assert pk is not None
        return pk

    def instances(self, run_pk: int) -> dict[tuple[str, int], TaskInstance]:
        rows = self.db.call(
            lambda s: (
                s.execute(select(TaskInstance).where(TaskInstance.dag_run_id == run_pk))
                .scalars()
                .all()
            )
        )
        return {(ti.task_id, ti.map_index): ti for ti in rows}

    def states(self, run_pk: int) -> dict[tuple[str, int], str]:
        return {key: ti.state for key, ti in self.instances(run_pk).items()}

    def result(self, run_pk: int, task_id: str, map_index: int = -1) -> Any:
        xcoms = self.instances(run_pk)[(task_id, map_index)].xcoms or {}
        return deserialize_value(xcoms["return_value"])

    def run_id(self, run_pk: int) -> str:
        return str(self.db.call(lambda s: runs.run_id_of(s, run_pk)))

    async def run_to_end(self, run_pk: int) -> str:
        async def ended() -> str | None:
            await self.scheduler.schedule_once()
            run = await self.db.run(lambda s: s.get(DagRun, run_pk))
            return run.state if run.state in ("success", "failed") else None

        result: str = await eventually(ended, within=90, step=0.05)
        return result

    async def run_dag(self, dag_id: str) -> tuple[int, str]:
        run_pk = self.trigger(dag_id)
        with anyio.fail_after(120):
            async with self.executor():
                state = await self.run_to_end(run_pk)
        return run_pk, state

    @asynccontextmanager
    async def executor(self) -> AsyncIterator[LocalExecutor]:
        async with running_executor(self.db, self.cipher, self.settings) as executor:
            yield executor

    async def until(self, run_pk: int, check: Any) -> Any:
        """Drive the scheduler until ``check(task instances)`` holds."""

        async def step() -> Any:
            await self.scheduler.schedule_once()
            return check(await anyio.to_thread.run_sync(self.instances, run_pk))

        return await eventually(step, within=60, step=0.05)

    def fire(self, trigger_id: int, payload: Any) -> None:
        """What the persister writes when a deferred task's trigger fires."""
        persister = Persister(db=self.db, outbox=Outbox())
        item = FiredEvent(trigger_id=trigger_id, event=TriggerEvent(payload), seq=None, fired_at=0)
        persist(self.db, persister, [item])

    def cli(self, *args: str, code: int = 0) -> str:
        result = CliRunner().invoke(cli, list(args), obj={"config": self.config})
        assert result.exit_code == code, result.output
        return result.output


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "mapping.py").write_text(textwrap.dedent(DAG_FILE))
    db, config, _, _ = parsed_database(migrated_db_url, tmp_path, dags)
    cli_config = load_config(
        environ={
            "SLUICE_HOME": str(tmp_path / "home"),
            "SLUICE__CORE__DAGS_FOLDER": str(dags),
            "SLUICE__CORE__SQL_ALCHEMY_CONN": migrated_db_url,
        }
    )
    yield Env(db, fast_executor_settings(config), cli_config)
    db.dispose()


async def test_literal_lists_map_and_the_results_reach_the_task_below(env: Env) -> None:
    run_pk, state = await env.run_dag("literal")
    assert state == "success"
    states = env.states(run_pk)
    assert {k for k in states if k[0] == "add"} == {("add", 0), ("add", 1), ("add", 2)}
    assert set(states.values()) == {TaskState.SUCCESS}
    assert [env.result(run_pk, "add", i) for i in range(3)] == [
        {"sum": 11, "index": 0},
        {"sum": 12, "index": 1},
        {"sum": 13, "index": 2},
    ]
    assert env.result(run_pk, "total") == [11, 12, 13]
    assert env.result(run_pk, "pull") == {
        "one": {"sum": 12, "index": 1},
        "some": [{"sum": 11, "index": 0}, {"sum": 13, "index": 2}],
        "all": [{"sum": 11, "index": 0}, {"sum": 12, "index": 1}, {"sum": 13, "index": 2}],
    }
    assert [env.result(run_pk, "echo", i) for i in range(2)] == ["first", "second"]


@pytest.mark.both_databases
async def test_upstream_lists_dicts_and_expand_kwargs_map_over_results(env: Env) -> None:
    run_pk, state = await env.run_dag("upstream")
    assert state == "success"
    # numbers() x [100, 200]: the cross product, the last argument fastest
    assert [env.result(run_pk, "add", i)["sum"] for i in range(6)] == [
        101,
        201,
        102,
        202,
        103,
        203,
    ]
    assert env.result(run_pk, "joined") == "a=1,b=2"
    assert env.result(run_pk, "by_kwargs") == [101, 202]
    assert env.result(run_pk, "by_literal_kwargs") == [10, 12]
    assert env.result(run_pk, "zipped") == "1=a,2=b"  # as long as the shortest
    assert env.result(run_pk, "mapped") == "A=10,B=20"
    assert env.result(run_pk, "collect_all") == [1, 2, 3]
    assert env.result(run_pk, "chained") == [4, 8, 12]


async def test_an_empty_input_skips_the_task_and_the_rules_below_decide(env: Env) -> None:
    run_pk, state = await env.run_dag("empty")
    assert state == "success"
    states = env.states(run_pk)
    assert states[("never", -1)] == TaskState.SKIPPED
    assert not [k for k in states if k[0] == "never" and k[1] >= 0]
    assert states[("after", -1)] == TaskState.SKIPPED
    assert states[("cleanup", -1)] == TaskState.SUCCESS


async def test_one_failing_copy_fails_the_tasks_below_and_the_run(env: Env) -> None:
    run_pk, state = await env.run_dag("one_fails")
    assert state == "failed"
    states = env.states(run_pk)
    assert [states[("fragile", i)] for i in range(3)] == [
        TaskState.SUCCESS,
        TaskState.FAILED,
        TaskState.SUCCESS,
    ]
    assert states[("after", -1)] == TaskState.UPSTREAM_FAILED
    run_id = env.run_id(run_pk)
    log = read_task_log(
        env.config.logging.task_log_folder, "one_fails", run_id, "fragile", 1, map_index=1
    )
    assert "two is bad" in log and "[map_index 1]" in log
    printed = env.cli("tasks", "logs", "one_fails", run_id, "fragile", "--map-index", "1")
    assert "two is bad" in printed


async def test_a_copy_retries_alone(env: Env) -> None:
    run_pk, state = await env.run_dag("retry")
    assert state == "success"
    tis = env.instances(run_pk)
    assert [tis[("flaky", i)].try_number for i in range(3)] == [1, 2, 1]
    assert env.result(run_pk, "sum_up") == [10, 20, 30]


async def test_a_result_that_cannot_be_mapped_over_fails_its_task(env: Env) -> None:
    run_pk, state = await env.run_dag("unmappable")
    assert state == "failed"
    states = env.states(run_pk)
    assert states[("scalar", -1)] == TaskState.FAILED
    assert states[("never", -1)] == TaskState.UPSTREAM_FAILED
    log = read_task_log(
        env.config.logging.task_log_folder, "unmappable", env.run_id(run_pk), "scalar", 1
    )
    assert "UnmappableXComTypePushed" in log and "must return a list or a dict" in log


async def test_the_cli_prints_a_copys_result_and_lists_the_copies(env: Env) -> None:
    run_pk, state = await env.run_dag("literal")
    assert state == "success"
    run_id = env.run_id(run_pk)
    printed = env.cli("tasks", "result", "literal", run_id, "add", "--map-index", "2", "--json")
    shown = json.loads(printed)
    assert shown["map_index"] == 2 and shown["results"]["return_value"]["sum"] == 13
    hint = env.cli("tasks", "result", "literal", run_id, "add", code=1)
    assert "is mapped: pass --map-index 0..2" in hint
    listed = json.loads(env.cli("runs", "list", "literal", "--json"))
    assert listed[0]["tasks"]["add[1]"] == TaskState.SUCCESS
    shown = json.loads(env.cli("dags", "show", "literal", "--json"))
    mapped = {task["task_id"]: task["mapped"] for task in shown["tasks"]}
    assert mapped == {"add": "x [3]", "total": None, "pull": None, "echo": "bash_command [2]"}
    table = env.cli("dags", "show", "literal")
    assert "x [3]" in table and "bash_command [2]" in table


async def test_each_copy_defers_and_resumes_on_its_own(env: Env) -> None:
    run_pk = env.trigger("deferred")

    def both_deferred(tis: dict[tuple[str, int], TaskInstance]) -> Any:
        copies = [tis.get(("waits", i)) for i in range(2)]
        deferred = all(c is not None and c.state == TaskState.DEFERRED for c in copies)
        return copies if deferred else None

    with anyio.fail_after(120):
        async with env.executor():
            copies = await env.until(run_pk, both_deferred)
            for copy in copies:
                env.fire(copy.trigger_id, {"copy": copy.map_index})
            assert await env.run_to_end(run_pk) == "success"
    assert env.result(run_pk, "collect") == [
        "a resumed as copy 0 with {'copy': 0}",
        "b resumed as copy 1 with {'copy': 1}",
    ]


async def test_a_run_that_starts_over_expands_its_mapped_tasks_afresh(env: Env) -> None:
    run_pk, state = await env.run_dag("literal")
    assert state == "success"
    env.db.call(lambda s: runs.rerun_run(s, run_pk, now=models.utcnow(), backfill_id=None))
    assert {k: v for k, v in env.states(run_pk).items() if k[0] == "add"} == {
        ("add", i): TaskState.NONE for i in range(3)
    }
    with anyio.fail_after(120):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "success"
    tis = env.instances(run_pk)
    assert [tis[("add", i)].try_number for i in range(3)] == [2, 2, 2]  # the copies were reused
    assert env.result(run_pk, "total") == [11, 12, 13]


async def test_clearing_a_failed_copy_reruns_that_copy_only(env: Env) -> None:
    run_pk, state = await env.run_dag("one_fails")
    assert state == "failed"
    run_id = env.run_id(run_pk)

    def clear(session: Any) -> actions.ActionResult:
        chosen = actions.select_task_instances(
            session,
            "one_fails",
            run_id=run_id,
            task_regex="^fragile$",
            only_failed=True,
            downstream=True,
        )
        return actions.clear_task_instances(session, chosen, now=models.utcnow())

    cleared = env.db.call(clear)
    assert sorted(c.as_dict()["task_id"] for c in cleared.tasks) == ["after", "fragile[1]"]
    assert cleared.runs == {run_id: "queued"}
    states = env.states(run_pk)
    assert [states[("fragile", i)] for i in range(3)] == [
        TaskState.SUCCESS,
        TaskState.NONE,
        TaskState.SUCCESS,
    ]
    with anyio.fail_after(120):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "failed"  # copy 1 fails again
    tis = env.instances(run_pk)
    assert [tis[("fragile", i)].try_number for i in range(3)] == [1, 2, 1]
    assert tis[("after", -1)].state == TaskState.UPSTREAM_FAILED


async def test_marking_one_copy_success_lets_the_task_below_run(env: Env) -> None:
    run_pk, state = await env.run_dag("one_fails")
    assert state == "failed"
    run_id = env.run_id(run_pk)
    env.cli(
        "tasks", "set-state", "one_fails", run_id, "fragile", "skipped", "--map-index", "7", code=1
    )
    out = json.loads(
        env.cli(
            "tasks",
            "set-state",
            "one_fails",
            run_id,
            "fragile",
            "success",
            "--map-index",
            "1",
            "--json",
        )
    )
    changed = {t["task_id"]: t["new_state"] for t in out["tasks"]}
    assert changed == {"fragile[1]": "success", "after": "none"}  # only copy 1 was marked
    with anyio.fail_after(120):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "success"
    states = env.states(run_pk)
    assert [states[("fragile", i)] for i in range(3)] == [TaskState.SUCCESS] * 3
    assert states[("after", -1)] == TaskState.SUCCESS


async def test_clearing_one_copy_with_downstream_clears_every_task_below(env: Env) -> None:
    """``map_index`` picks the copy of the matched task; the tasks below it (unmapped, so
    map_index -1) are cleared too, as ``set_task_state`` does."""
    run_pk, state = await env.run_dag("one_fails")
    assert state == "failed"
    run_id = env.run_id(run_pk)

    def clear(session: Any) -> actions.ActionResult:
        chosen = actions.select_task_instances(
            session,
            "one_fails",
            run_id=run_id,
            task_regex="^fragile$",
            downstream=True,
            map_index=1,
        )
        return actions.clear_task_instances(session, chosen, now=models.utcnow())

    cleared = env.db.call(clear)
    assert sorted(c.as_dict()["task_id"] for c in cleared.tasks) == ["after", "fragile[1]"]
    states = env.states(run_pk)
    assert [states[("fragile", i)] for i in range(3)] == [
        TaskState.SUCCESS,
        TaskState.NONE,
        TaskState.SUCCESS,
    ]
    assert states[("after", -1)] == TaskState.NONE
