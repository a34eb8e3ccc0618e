"""Retry policies under the real executor and scheduler: the policy, asked in the task
process, retries one exception (at once, its own delay in place of the task's hour) and
fails another at once although retries are left; the task log says why."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import anyio
import pytest

from engine.db import models
from engine.states import DagRunState, TaskState
from tests.integration.harness import parsed_database
from tests.integration.test_retry_delay import Env, engine_parts

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.integration

DAGS = """
from datetime import timedelta

from engine import DAG, ExceptionRetryPolicy, RetryAction, RetryRule, task

POLICY = ExceptionRetryPolicy(
    rules=[
        RetryRule(
            exception=ConnectionError,
            action=RetryAction.RETRY,
            retry_delay=timedelta(0),
            reason="the network blinked",
        ),
        RetryRule(exception="builtins.ValueError", action=RetryAction.FAIL, reason="bad data"),
    ]
)


@task(retries=5, retry_delay=timedelta(hours=1), retry_policy=POLICY)
def fetch(try_number):
    if try_number == 1:
        raise ConnectionError("reset by peer")
    raise ValueError("the payload is not JSON")


@task(retries=1, retry_delay=timedelta(hours=1), retry_policy=POLICY)
def standard():
    raise KeyError("no rule for me")


with DAG("policy"):
    fetch()

with DAG("fallthrough"):
    standard()
"""


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path) -> Iterator[Env]:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "policy_dags.py").write_text(textwrap.dedent(DAGS))
    parsed = parsed_database(migrated_db_url, tmp_path, dags)
    yield Env(parsed.db, parsed.cipher, parsed.config)
    parsed.db.dispose()


async def test_a_policy_retries_one_exception_and_fails_another_at_once(env: Env) -> None:
    scheduler = env.scheduler(clock=models.utcnow)
    with anyio.fail_after(60):
        async with engine_parts(env, scheduler, parallelism=2):
            run_pk, run_id, tis = env.new_run("policy", now=models.utcnow())
            done = await env.until(tis["fetch"], TaskState.FAILED, TaskState.SUCCESS)
            await env.run_ended(run_pk)
    # try 1 (ConnectionError) retried at once, not after the task's hour; try 2 (ValueError)
    # failed the task with 4 retries left
    assert (done.state, done.try_number, done.next_retry_at) == (TaskState.FAILED, 2, None)
    assert env.run_state(run_pk) == DagRunState.FAILED
    first = env.read_log(env.config, "policy", run_id, "fetch", 1)
    second = env.read_log(env.config, "policy", run_id, "fetch", 2)
    assert "ConnectionError: reset by peer (retry policy: the network blinked); it will be " in (
        first
    )
    assert "(in 0s)" in first
    assert "task failed: ValueError: the payload is not JSON (retry policy: bad data)" in second


async def test_an_exception_no_rule_matches_gets_the_tasks_own_retry_delay(env: Env) -> None:
    scheduler = env.scheduler(clock=models.utcnow)
    with anyio.fail_after(60):
        async with engine_parts(env, scheduler, parallelism=1):
            _, run_id, tis = env.new_run("fallthrough", now=models.utcnow())
            waiting = await env.until(tis["standard"], TaskState.UP_FOR_RETRY)
    assert waiting.next_retry_at is not None and waiting.end_date is not None
    wait = (waiting.next_retry_at - waiting.end_date).total_seconds()
    assert 3599 <= wait <= 3601  # the task's retry_delay: the policy said DEFAULT
    log = env.read_log(env.config, "fallthrough", run_id, "standard", 1)
    assert "retry policy" not in log
