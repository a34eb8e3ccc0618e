"""Connections and variables inside running tasks, on SQLite and PostgreSQL: the real
scheduler and executor run tasks that read them (code, templates, the environment), set and
delete variables, meet a missing connection, and whose log masks what they read."""

from __future__ import annotations

import logging
import textwrap
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import anyio
import pytest
from sqlalchemy import select

from engine.db import models
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import connections as store
from engine.db.queries import runs
from engine.executor.task_logs import read_task_log
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from tests.integration.harness import fast_executor_settings, parsed_database, running_executor
from tests.waiting import eventually
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.executor.local import LocalExecutor
    from engine.executor.settings import ExecutorSettings

pytestmark = pytest.mark.integration

PASSWORD = "s3cr3t-pw@x"
TOKEN = "tok-123456789"

DAG_FILE = """
from engine import DAG, BashOperator, Connection, Variable, task
from engine.hooks.base import BaseHook


@task
def reads(**context):
    conn = Connection.get("warehouse")
    print("the password is", conn.password)
    print("the token is", Variable.get("api_token"))
    env_conn = BaseHook.get_connection("from_env")
    return {
        "host": conn.host,
        "port": conn.port,
        "login": conn.login,
        "schema": conn.schema,
        "extra": conn.extra_dejson,
        "uri_roundtrip": Connection.from_uri("x", conn.get_uri()).password == conn.password,
        "plain": Variable.get("plain"),
        "json": Variable.get("settings", deserialize_json=True),
        "default": Variable.get("missing", default="fallback"),
        "env_var": Variable.get("from_env_var"),
        "env_conn": [env_conn.conn_type, env_conn.host, env_conn.port],
        "context_var": context["var"].value.plain,
    }


@task
def writes():
    Variable.set("written", {"n": 1}, serialize_json=True, description="by a task")
    Variable.delete("plain")
    return Variable.get("written", deserialize_json=True)


@task
def missing():
    Connection.get("nowhere")


with DAG("conns"):
    templated = BashOperator(
        task_id="templated",
        bash_command="echo host={{ conn.warehouse.host }} field={{ var.json.settings.size }} "
        "value={{ var.value.plain }}",
    )
    [reads(), templated] >> writes()  # (writes deletes the variable the other two read)

with DAG("absent"):
    missing()


@task
def raises_uri():
    raise RuntimeError("cannot reach " + Connection.get("warehouse").get_uri())


with DAG("leaks"):
    raises_uri()
"""


class Env:
    def __init__(self, db: Database, cipher: KwargsCipher, settings: ExecutorSettings) -> None:
        self.db = db
        self.cipher = cipher
        self.settings = settings
        self.scheduler = Scheduler(db=db, cipher=cipher, settings=SchedulerSettings())

    def trigger(self, dag_id: str) -> int:
        pk = self.db.call(
            lambda s: runs.create_run(s, dag_id, run_type=runs.MANUAL, now=models.utcnow())
        )
        assert pk is not None
        return pk

    def task_instances(self, run_pk: int) -> dict[str, TaskInstance]:
        query = select(TaskInstance).where(TaskInstance.dag_run_id == run_pk)
        return {ti.task_id: ti for ti in self.db.call(lambda s: s.execute(query).scalars().all())}

    def result(self, run_pk: int, task_id: str) -> Any:
        xcoms = self.task_instances(run_pk)[task_id].xcoms or {}
        return deserialize_value(xcoms["return_value"])

    def log(self, run_pk: int, task_id: str) -> str:
        run = self.db.call(lambda s: s.get(DagRun, run_pk))
        folder = self.settings.task_log_folder
        return read_task_log(folder, run.dag_id, run.run_id, task_id)

    async def run_to_end(self, run_pk: int) -> str:
        async def ended() -> str | None:
            await self.scheduler.schedule_once()
            run = await self.db.run(lambda s: s.get(DagRun, run_pk))
            return run.state if run.state in ("success", "failed") else None

        result: str = await eventually(ended, within=60, step=0.05)
        return result

    @asynccontextmanager
    async def executor(self) -> AsyncIterator[LocalExecutor]:
        async with running_executor(self.db, self.cipher, self.settings) as executor:
            yield executor


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "conns.py").write_text(textwrap.dedent(DAG_FILE))
    db, config, cipher, _ = parsed_database(migrated_db_url, tmp_path, dags)
    fields = {
        "conn_type": "postgres",
        "host": "db.example.com",
        "port": 5432,
        "login": "etl",
        "password": PASSWORD,
        "schema": "sales",
        "extra": {"sslmode": "require", "api_key": "extra-key-987"},
    }
    db.call(lambda s: store.upsert_connection(s, cipher, "warehouse", fields))
    db.call(lambda s: store.set_variable(s, cipher, "plain", "hello"))
    db.call(lambda s: store.set_variable(s, cipher, "settings", '{"size": 3}'))
    db.call(lambda s: store.set_variable(s, cipher, "api_token", TOKEN))
    monkeypatch.setenv("SLUICE_CONN_FROM_ENV", "kafka://broker.local:9093")
    monkeypatch.setenv("SLUICE_VAR_FROM_ENV_VAR", "from the environment")
    settings = replace(fast_executor_settings(config), parallelism=2)
    yield Env(db, cipher, settings)
    db.dispose()


@pytest.mark.both_databases
async def test_tasks_read_and_write_connections_and_variables(env: Env) -> None:
    run_pk = env.trigger("conns")
    with anyio.fail_after(90):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "success"
    assert env.result(run_pk, "reads") == {
        "host": "db.example.com",
        "port": 5432,
        "login": "etl",
        "schema": "sales",
        "extra": {"sslmode": "require", "api_key": "extra-key-987"},
        "uri_roundtrip": True,
        "plain": "hello",
        "json": {"size": 3},
        "default": "fallback",
        "env_var": "from the environment",
        "env_conn": ["kafka", "broker.local", 9093],
        "context_var": "hello",
    }
    assert env.result(run_pk, "writes") == {"n": 1}
    assert env.db.call(lambda s: store.get_variable(s, env.cipher, "plain")) is None
    assert env.db.call(lambda s: store.get_variable(s, env.cipher, "written")) is not None
    templated = env.log(run_pk, "templated")
    assert "host=db.example.com field=3 value=hello" in templated


async def test_what_a_task_reads_is_masked_in_its_log(env: Env) -> None:
    run_pk = env.trigger("conns")
    with anyio.fail_after(90):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "success"
    log = env.log(run_pk, "reads")
    assert "the password is ***" in log
    assert "the token is ***" in log
    assert PASSWORD not in log and TOKEN not in log


async def test_a_missing_connection_fails_the_task_with_a_clear_error(env: Env) -> None:
    run_pk = env.trigger("absent")
    with anyio.fail_after(90):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "failed"
    log = env.log(run_pk, "missing")
    assert "AirflowNotFoundException: The conn_id `nowhere` isn't defined" in log
    assert "SLUICE_CONN_NOWHERE" in log


async def test_a_task_error_holding_a_secret_it_read_is_masked_outside_its_log(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """The task's error text leaves its log (the executor's WARNING, the database): the
    secrets the task read through its channel are masked there too, not only in its log."""
    caplog.set_level(logging.DEBUG)
    run_pk = env.trigger("leaks")
    with anyio.fail_after(90):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "failed"
    # get_uri() percent-encodes the password and carries the extra's sensitive api_key
    forms = {PASSWORD, quote(PASSWORD, safe=""), "extra-key-987"}
    assert "RuntimeError: cannot reach postgres://etl:***@db.example.com" in env.log(
        run_pk, "raises_uri"
    )
    failed = [r for r in caplog.records if getattr(r, "action", None) == "task_failed"]
    assert failed, "the executor logged no task_failed record"
    assert "cannot reach postgres://etl:***@db.example.com" in failed[0].getMessage()
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert not [form for form in forms if form in logged]
    stored = env.db.call(
        lambda s: [
            repr(row)
            for table in models.Base.metadata.sorted_tables
            for row in s.execute(select(table)).all()
        ]
    )
    assert not [form for form in forms if any(form in row for row in stored)]
