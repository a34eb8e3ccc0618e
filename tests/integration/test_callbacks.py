"""Task and DAG callbacks on SQLite and PostgreSQL, with the real scheduler and executor:
each callback fires once with the right context (a marker file per call), a raising
callback changes no state, the failure callback of a try killed at its timeout (or crashed)
runs in a fresh process, and DAG success / failure callbacks run when the run ends.
"""

from __future__ import annotations

import json
import textwrap
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import callbacks, connections, runs
from engine.executor.callbacks import dag_callback_log
from engine.executor.local import LocalExecutor
from engine.executor.task_logs import read_task_log
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import TaskState
from tests.integration.harness import fast_executor_settings, parsed_database, running_executor
from tests.waiting import eventually

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from engine.db.database import Database
    from engine.executor.settings import ExecutorSettings

pytestmark = pytest.mark.integration

DAG_FILE = """
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

from engine import DAG, PythonOperator, task
from engine.authoring import Connection, Variable
from engine.exceptions import AirflowSkipException

MARKS = Path({marks!r})


def mark(name):
    def callback(context):
        exception = context.get("exception")
        ti = context.get("ti")
        task = context.get("task")
        print(f"callback {{name}} ran")
        line = {{
            "task": None if task is None else task.task_id,
            "args": getattr(task, "op_kwargs", None),
            "try": None if ti is None else ti.try_number,
            "map_index": None if ti is None else ti.map_index,
            "run_id": context["run_id"],
            "dag": context["dag"].dag_id,
            "exception": None if exception is None else type(exception).__name__,
            "message": None if exception is None else str(exception),
            "reason": context.get("reason"),
            "pid": os.getpid(),
        }}
        with open(MARKS / f"{{name}}.jsonl", "a") as out:
            out.write(json.dumps(line) + "\\n")

    callback.__name__ = name
    return callback


def reads_secrets(name):
    def callback(context):
        conn = Connection.get("slack")
        print(f"the password is {{conn.password}}")
        line = {{"variable": Variable.get("channel"), "login": conn.login, "pid": os.getpid()}}
        with open(MARKS / f"{{name}}.jsonl", "a") as out:
            out.write(json.dumps(line) + "\\n")

    callback.__name__ = name
    return callback


def boom(context):
    raise RuntimeError("callback boom")


def ok():
    return 1


def fails():
    raise ValueError("task boom")


def skips():
    raise AirflowSkipException("nothing to do")


def hangs():
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # ignores its timeout: killed
    time.sleep(120)


def crashes():
    os.kill(os.getpid(), signal.SIGKILL)


@task
def fails_for(x):
    if x == 2:
        raise ValueError(f"copy boom {{x}}")
    return x


@task
def double(x):
    return x * 2


@task(execution_timeout=timedelta(seconds=10), on_failure_callback=mark("copy_timeout"))
def hangs_for(x):
    hangs()


with DAG(
    "good",
    on_success_callback=mark("dag_success"),
    on_failure_callback=mark("dag_failure"),
    default_args={{"on_success_callback": mark("default_success")}},
):
    PythonOperator(
        task_id="ok",
        python_callable=ok,
        on_execute_callback=mark("execute"),
        on_success_callback=[boom, mark("success")],
    )
    PythonOperator(task_id="skips", python_callable=skips, on_skipped_callback=mark("skipped"))
    PythonOperator(task_id="plain", python_callable=ok)

with DAG(
    "bad",
    on_success_callback=mark("dag_success"),
    on_failure_callback=[boom, mark("dag_failure")],
):
    PythonOperator(
        task_id="fails",
        python_callable=fails,
        retries=1,
        retry_delay=0,
        on_retry_callback=mark("retry"),
        on_failure_callback=[mark("failure"), boom],
        on_success_callback=mark("never"),
    ) >> PythonOperator(task_id="after", python_callable=ok)  # upstream_failed

with DAG(
    "slow_run", dagrun_timeout=timedelta(seconds=1), on_failure_callback=mark("dag_timeout")
):
    PythonOperator(task_id="sleeps", python_callable=time.sleep, op_args=[120])

with DAG("killed"):
    PythonOperator(
        task_id="hangs",
        python_callable=hangs,
        # long enough for the task to start on a loaded machine: it is killed, not stopped
        execution_timeout=timedelta(seconds=10),
        on_failure_callback=mark("timeout_failure"),
    )
    PythonOperator(
        task_id="crashes",
        python_callable=crashes,
        retries=1,
        retry_delay=timedelta(days=1),
        on_retry_callback=mark("crash_retry"),
    )

with DAG("orphaned"):
    PythonOperator(
        task_id="sleeps",
        python_callable=time.sleep,
        op_args=[120],
        on_failure_callback=mark("orphan_failure"),
        on_retry_callback=mark("orphan_never"),
    ) >> PythonOperator(task_id="after", python_callable=ok)  # upstream_failed
    PythonOperator(
        task_id="sleeps_again",
        python_callable=time.sleep,
        op_args=[120],
        retries=1,
        retry_delay=timedelta(days=1),
        on_retry_callback=mark("orphan_retry"),
        on_failure_callback=mark("orphan_never"),
    )

with DAG("mapped_leaf", on_failure_callback=mark("mapped_dag_failure")):
    fails_for.expand(x=[1, 2])  # the failed copy (map_index 1) ends the run

with DAG("mapped_killed"):
    hangs_for.expand(x=double.expand(x=[5]))  # a copy over another mapped task's results

with DAG("secrets", on_failure_callback=reads_secrets("secrets_dag")):
    PythonOperator(
        task_id="crashes",
        python_callable=crashes,
        on_failure_callback=reads_secrets("secrets_task"),
    )
"""


class Env:
    def __init__(self, db: Database, settings: ExecutorSettings, marks: Path) -> None:
        self.db = db
        self.settings = settings
        self.marks = marks
        self.cipher = KwargsCipher(Fernet.generate_key().decode())
        self.scheduler = Scheduler(db=db, cipher=self.cipher, settings=SchedulerSettings())

    def trigger(self, dag_id: str) -> tuple[int, str]:
        def create(session: Any) -> tuple[int, str]:
            pk = runs.create_run(session, dag_id, run_type=runs.MANUAL, now=models.utcnow())
            assert pk is not None
            return pk, runs.run_id_of(session, pk)

        return self.db.call(create)

    def task_instances(self, run_pk: int) -> dict[str, TaskInstance]:
        rows = self.db.call(
            lambda s: (
                s.execute(select(TaskInstance).where(TaskInstance.dag_run_id == run_pk))
                .scalars()
                .all()
            )
        )
        return {ti.task_id: ti for ti in rows}

    def marked(self, name: str) -> list[dict[str, Any]]:
        path = self.marks / f"{name}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def pending(self) -> list[callbacks.Request]:
        return self.db.call(callbacks.pending_callback_requests)

    async def run_to_end(self, run_pk: int) -> str:
        async def ended() -> str | None:
            await self.scheduler.schedule_once()
            run = await self.db.run(lambda s: s.get(DagRun, run_pk))
            return run.state if run.state in ("success", "failed") else None

        result: str = await eventually(ended, within=60, step=0.05)
        return result

    async def callbacks_done(self, *names: str) -> None:
        """Until every named marker exists and no callback request is left."""

        async def done() -> bool:
            return all(self.marked(name) for name in names) and not await self.db.run(
                callbacks.pending_callback_requests
            )

        await eventually(done, within=90, step=0.05)

    @asynccontextmanager
    async def executor(self, **overrides: Any) -> AsyncIterator[LocalExecutor]:
        async with running_executor(
            self.db, self.cipher, replace(self.settings, **overrides)
        ) as executor:
            yield executor


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    (dags / "callbacks.py").write_text(textwrap.dedent(DAG_FILE.format(marks=str(marks))))
    db, config, _, _ = parsed_database(migrated_db_url, tmp_path, dags)
    yield Env(db, fast_executor_settings(config), marks)
    db.dispose()


async def test_success_skip_and_execute_callbacks_fire_once_and_a_raising_one_changes_nothing(
    env: Env,
) -> None:
    run_pk, run_id = env.trigger("good")
    with anyio.fail_after(240):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "success"
            await env.callbacks_done("dag_success")
    tis = env.task_instances(run_pk)
    assert {t: ti.state for t, ti in tis.items()} == {
        "ok": TaskState.SUCCESS,  # its first success callback raised: still a success
        "skips": TaskState.SKIPPED,
        "plain": TaskState.SUCCESS,
    }
    (execute,) = env.marked("execute")
    (success,) = env.marked("success")
    assert execute["task"] == success["task"] == "ok" and success["try"] == 1
    assert success["run_id"] == run_id and success["pid"] == tis["ok"].pid  # in its process
    (skipped,) = env.marked("skipped")
    assert skipped["task"] == "skips"
    (default,) = env.marked("default_success")  # from default_args, on the task without one
    assert default["task"] == "plain"
    (dag_success,) = env.marked("dag_success")
    assert (dag_success["dag"], dag_success["reason"], dag_success["run_id"]) == (
        "good",
        "success",
        run_id,
    )
    assert env.marked("dag_failure") == []
    log = read_task_log(env.settings.task_log_folder, "good", run_id, "ok", 1)
    assert "RuntimeError: callback boom" in log  # the raising callback's error: in the log


async def test_retry_then_failure_callbacks_get_the_exception_and_the_dag_failure_callback_runs(
    env: Env,
) -> None:
    run_pk, run_id = env.trigger("bad")
    with anyio.fail_after(240):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "failed"
            await env.callbacks_done("dag_failure")
    tis = env.task_instances(run_pk)
    ti = tis["fails"]
    assert (ti.state, ti.try_number) == (TaskState.FAILED, 2)
    assert tis["after"].state == TaskState.UPSTREAM_FAILED
    (retry,) = env.marked("retry")
    (failure,) = env.marked("failure")
    assert (retry["try"], retry["exception"], retry["message"]) == (1, "ValueError", "task boom")
    assert (failure["try"], failure["exception"]) == (2, "ValueError")
    assert env.marked("never") == [] and env.marked("dag_success") == []
    # after a raising callback in the same list; the context of the task that failed itself
    (dag_failure,) = env.marked("dag_failure")
    assert (dag_failure["reason"], dag_failure["task"], dag_failure["run_id"]) == (
        "task_failure",
        "fails",
        run_id,
    )


async def test_callbacks_of_a_killed_or_crashed_try_run_in_a_fresh_process(env: Env) -> None:
    run_pk, run_id = env.trigger("killed")
    with anyio.fail_after(240):
        async with env.executor():

            async def settled() -> bool:
                await env.scheduler.schedule_once()
                tis = await env.db.run(
                    lambda s: {
                        ti.task_id: ti.state
                        for ti in s.execute(
                            select(TaskInstance).where(TaskInstance.dag_run_id == run_pk)
                        ).scalars()
                    }
                )
                return tis == {"hangs": TaskState.FAILED, "crashes": TaskState.UP_FOR_RETRY}

            await eventually(settled, within=90, step=0.05)
            await env.callbacks_done("timeout_failure", "crash_retry")
    tis = env.task_instances(run_pk)
    (timeout,) = env.marked("timeout_failure")
    assert (timeout["task"], timeout["try"], timeout["exception"]) == (
        "hangs",
        1,
        "AirflowTaskTimeout",
    )
    assert "execution_timeout (10s) exceeded" in timeout["message"]
    assert "did not stop when interrupted and its process was killed" in timeout["message"]
    assert timeout["pid"] != tis["hangs"].pid  # not the killed task process: a fresh one
    (crash,) = env.marked("crash_retry")
    assert (crash["task"], crash["exception"]) == ("crashes", "AirflowException")
    assert "signal SIGKILL" in crash["message"] and crash["pid"] != tis["crashes"].pid
    log = read_task_log(env.settings.task_log_folder, "killed", run_id, "hangs", 1)
    assert "running on_failure_callback in a fresh process" in log


@pytest.mark.both_databases
async def test_the_running_tries_of_a_dead_executor_fail_or_retry_and_run_their_callbacks(
    env: Env,
) -> None:
    run_pk, run_id = env.trigger("orphaned")
    sleepers = {"sleeps", "sleeps_again"}
    with anyio.fail_after(240):
        dying = LocalExecutor(db=env.db, cipher=env.cipher, settings=env.settings)
        async with anyio.create_task_group() as tg:
            await tg.start(dying.run)

            async def running() -> bool:
                await env.scheduler.schedule_once()
                tis = await env.db.run(lambda s: _states(s, run_pk))
                return all(tis[t] == TaskState.RUNNING for t in sleepers)

            await eventually(running, within=90, step=0.05)
            tg.cancel_scope.cancel()  # a hard stop: its children die, no outcome is written
        assert {t: env.task_instances(run_pk)[t].state for t in sleepers} == dict.fromkeys(
            sleepers, TaskState.RUNNING
        )
        recovering = Scheduler(
            db=env.db,
            cipher=env.cipher,
            settings=SchedulerSettings(heartbeat_s=0.05, task_heartbeat_timeout_s=10.5),
        )
        async with env.executor():

            async def settled() -> bool:
                await recovering.schedule_once()
                return await env.db.run(lambda s: _states(s, run_pk)) == {
                    "sleeps": TaskState.FAILED,
                    "after": TaskState.UPSTREAM_FAILED,
                    "sleeps_again": TaskState.UP_FOR_RETRY,  # in a day
                }

            await eventually(settled, within=90, step=0.05)
            await env.callbacks_done("orphan_failure", "orphan_retry")
    tis = env.task_instances(run_pk)
    assert (tis["sleeps"].try_number, tis["sleeps_again"].try_number) == (1, 1)
    (failure,) = env.marked("orphan_failure")
    (retry,) = env.marked("orphan_retry")
    assert env.marked("orphan_never") == []
    for line, task_id in ((failure, "sleeps"), (retry, "sleeps_again")):
        assert (line["task"], line["try"], line["run_id"]) == (task_id, 1, run_id)
        assert "stopped heartbeating at" in line["message"]
        assert line["pid"] != tis[task_id].pid  # a fresh process
    folder = env.settings.task_log_folder
    log = read_task_log(folder, "orphaned", run_id, "sleeps", 1)
    assert "try 1: task failed: its executor (job" in log
    assert "running on_failure_callback in a fresh process" in log
    retried = read_task_log(folder, "orphaned", run_id, "sleeps_again", 1)
    assert "stopped heartbeating at" in retried and "it will be retried at" in retried


def _states(session: Any, run_pk: int) -> dict[str, str]:
    rows = session.execute(select(TaskInstance).where(TaskInstance.dag_run_id == run_pk))
    return {ti.task_id: ti.state for ti in rows.scalars()}


async def test_a_run_past_its_dagrun_timeout_calls_the_dag_failure_callback(env: Env) -> None:
    run_pk, run_id = env.trigger("slow_run")
    with anyio.fail_after(240):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "failed"
            await env.callbacks_done("dag_timeout")
    (timed_out,) = env.marked("dag_timeout")
    assert (timed_out["dag"], timed_out["reason"], timed_out["run_id"]) == (
        "slow_run",
        "timed_out",
        run_id,
    )


async def test_a_dag_callback_built_around_a_failed_copy_of_a_mapped_task_runs(env: Env) -> None:
    run_pk, run_id = env.trigger("mapped_leaf")
    with anyio.fail_after(240):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "failed"
            await env.callbacks_done("mapped_dag_failure")
    (failure,) = env.marked("mapped_dag_failure")
    assert (failure["reason"], failure["task"], failure["run_id"]) == (
        "task_failure",
        "fails_for",
        run_id,
    )
    assert (failure["map_index"], failure["args"]) == (1, {"x": 2})  # the copy that failed


async def test_a_mapped_copy_killed_at_its_timeout_runs_its_failure_callback_into_its_log(
    env: Env,
) -> None:
    run_pk, run_id = env.trigger("mapped_killed")
    with anyio.fail_after(240):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "failed"
            await env.callbacks_done("copy_timeout")
    (timeout,) = env.marked("copy_timeout")
    assert (timeout["task"], timeout["map_index"], timeout["exception"]) == (
        "hangs_for",
        0,
        "AirflowTaskTimeout",
    )
    assert timeout["args"] == {"x": 10}  # unmapped over the results of double's copies
    folder = env.settings.task_log_folder
    log = read_task_log(folder, "mapped_killed", run_id, "hangs_for", 1, map_index=0)
    assert "running on_failure_callback in a fresh process" in log
    assert "callback copy_timeout ran" in log
    assert not (folder / "mapped_killed" / run_id / "hangs_for" / "attempt=1.log").exists()


async def test_callbacks_in_a_fresh_process_read_connections_and_variables_masked(
    env: Env,
) -> None:
    password = "hunter2-callback-secret"

    def define(session: Any) -> None:
        fields = {"conn_type": "http", "login": "bot", "password": password}
        connections.upsert_connection(session, env.cipher, "slack", fields)
        connections.set_variable(
            session, cipher=env.cipher, key="channel", value="#alerts", description=None
        )

    env.db.call(define)
    run_pk, run_id = env.trigger("secrets")
    with anyio.fail_after(240):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "failed"
            await env.callbacks_done("secrets_task", "secrets_dag")
    crashed_pid = env.task_instances(run_pk)["crashes"].pid
    for name in ("secrets_task", "secrets_dag"):
        (line,) = env.marked(name)
        assert (line["variable"], line["login"]) == ("#alerts", "bot")
        assert line["pid"] != crashed_pid
    folder = env.settings.task_log_folder
    task_log = read_task_log(folder, "secrets", run_id, "crashes", 1)
    dag_log = dag_callback_log(folder, "secrets", run_id).read_text()
    for log in (task_log, dag_log):
        assert "the password is ***" in log
        assert password not in log
