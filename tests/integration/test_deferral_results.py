"""Deferred tasks as in Airflow, on SQLite and PostgreSQL with the real scheduler and
executor: what a try pushed before it deferred is stored at once, seen by the resumed try
and kept in its results (and under an ``end_from_trigger`` event's); a task its trigger
ends ``failed`` gets its retries."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import anyio
import pytest

from engine.db.models import DagRun
from engine.executor.task_logs import read_task_log
from engine.states import TaskState
from tests.integration.harness import fast_executor_settings, parsed_database
from tests.integration.test_xcom import Env
from triggers.base import TaskFailedEvent, TaskSuccessEvent, TriggerEvent
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

DAG_FILE = """
from datetime import timedelta

from engine import DAG, BaseOperator
from triggers.temporal import TimeDeltaTrigger


class PushesThenWaits(BaseOperator):
    def execute(self, context):
        context["ti"].xcom_push("before", {"rows": 3})
        self.defer(trigger=TimeDeltaTrigger(timedelta(days=1)), method_name="done")

    def done(self, context, event):
        context["ti"].xcom_push("after", "resumed")
        return context["ti"].xcom_pull(task_ids=self.task_id, key="before")


with DAG("keeps"):
    PushesThenWaits(task_id="waits")

with DAG("ends"):
    PushesThenWaits(task_id="waits")

with DAG("retried"):
    PushesThenWaits(task_id="waits", retries=1, retry_delay=timedelta(0))
"""


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "deferring.py").write_text(textwrap.dedent(DAG_FILE))
    db, config, _, _ = parsed_database(migrated_db_url, tmp_path, dags)
    yield Env(db, fast_executor_settings(config), config.logging.task_log_folder)
    db.dispose()


def deferred(tis):
    return tis["waits"].state == TaskState.DEFERRED and tis


@pytest.mark.both_databases
async def test_a_push_before_a_deferral_is_kept_by_the_resumed_try(env: Env) -> None:
    run_pk = env.trigger("keeps")
    with anyio.fail_after(90):
        async with env.executor():
            tis = await env.until(run_pk, deferred)
            stored = {k: deserialize_value(v) for k, v in (tis["waits"].xcoms or {}).items()}
            assert stored == {"before": {"rows": 3}}  # stored when it deferred
            env.fire(tis["waits"].trigger_id, TriggerEvent({"fired": True}))
            assert await env.run_to_end(run_pk) == "success"
    assert env.results(run_pk, "waits") == {
        "before": {"rows": 3},
        "after": "resumed",
        "return_value": {"rows": 3},  # the resumed try pulled its own earlier push
    }


async def test_an_end_from_trigger_event_keeps_earlier_pushes(env: Env) -> None:
    run_pk = env.trigger("ends")
    with anyio.fail_after(90):
        async with env.executor():
            tis = await env.until(run_pk, deferred)
            env.fire(tis["waits"].trigger_id, TaskSuccessEvent(xcoms={"return_value": 7}))
            assert await env.run_to_end(run_pk) == "success"
    assert env.results(run_pk, "waits") == {"before": {"rows": 3}, "return_value": 7}


@pytest.mark.both_databases
async def test_a_task_failed_by_its_trigger_gets_its_retries(env: Env) -> None:
    run_pk = env.trigger("retried")
    with anyio.fail_after(90):
        async with env.executor():
            first = await env.until(run_pk, deferred)
            assert first["waits"].try_number == 1
            env.fire(first["waits"].trigger_id, TaskFailedEvent())
            second = await env.until(
                run_pk, lambda t: deferred(t) and t["waits"].try_number == 2 and t
            )
            env.fire(second["waits"].trigger_id, TaskFailedEvent())  # no retries left
            assert await env.run_to_end(run_pk) == "failed"
    ti = env.task_instances(run_pk)["waits"]
    assert (ti.state, ti.try_number) == (TaskState.FAILED, 2)
    run_id = env.db.call(lambda s: s.get(DagRun, run_pk).run_id)
    log = read_task_log(env.log_folder, "retried", run_id, "waits", 1)
    assert "its trigger failed: it ended the task as failed (TaskFailedEvent" in log
