"""``BaseAsyncOperator`` under the real executor: ``aexecute`` runs on an event loop in the
task process (three awaits gathered at once), its result is the task's, its exception fails
the try; ``context["ti"]`` is a ``TaskInstance``."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import anyio
import pytest

from engine.states import TaskState
from tests.integration.harness import fast_executor_settings, parsed_database
from tests.integration.test_xcom import Env

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

DAG_FILE = """
import asyncio

from engine import DAG, BaseAsyncOperator, TaskInstance


class Gather(BaseAsyncOperator):
    async def aexecute(self, context):
        async def one(n):
            await asyncio.sleep(0.01 * (4 - n))  # they finish in reverse order
            return n * n

        squares = await asyncio.gather(*(one(n) for n in (1, 2, 3)))
        ti = context["ti"]
        return {
            "squares": squares,
            "ti_is_task_instance": isinstance(ti, TaskInstance),
            "is_async": self.is_async,
        }


class Broken(BaseAsyncOperator):
    async def aexecute(self, context):
        await asyncio.sleep(0)
        raise LookupError("nothing there")


with DAG("async_ops"):
    Gather(task_id="gather") >> Broken(task_id="broken")
"""


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "async_ops.py").write_text(textwrap.dedent(DAG_FILE))
    db, config, _, _ = parsed_database(migrated_db_url, tmp_path, dags)
    yield Env(db, fast_executor_settings(config), config.logging.task_log_folder)
    db.dispose()


async def test_an_async_operator_runs_aexecute_on_an_event_loop(env: Env) -> None:
    run_pk = env.trigger("async_ops")
    with anyio.fail_after(60):
        async with env.executor():
            assert await env.run_to_end(run_pk) == "failed"
    tis = env.task_instances(run_pk)
    assert tis["gather"].state == TaskState.SUCCESS
    assert env.results(run_pk, "gather")["return_value"] == {
        "squares": [1, 4, 9],
        "ti_is_task_instance": True,
        "is_async": True,
    }
    assert tis["broken"].state == TaskState.FAILED


def test_aexecute_must_be_an_async_def() -> None:
    from engine import BaseAsyncOperator, DagDefinitionError

    with pytest.raises(DagDefinitionError, match="aexecute must be an async def"):

        class Wrong(BaseAsyncOperator):
            def aexecute(self, context):  # type: ignore[override]
                return 1
