"""``ti.xcom_pull`` beyond the task's run, as in Airflow 3, on SQLite and PostgreSQL with
the real scheduler and executor: another DAG's run (``dag_id`` + ``run_id``), another DAG
with this run's id (``run_id`` defaults to the task's), and the latest earlier run
(``include_prior_dates``)."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from engine.db.models import DagRun
from engine.db.queries import runs
from tests.integration.harness import fast_executor_settings, parsed_database
from tests.integration.test_xcom import Env

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

DAG_FILE = """
from engine import DAG, task


@task
def produce(dag_run):
    return {"made_by": dag_run.run_id}


with DAG("producer"):
    produce()


@task
def consume(ti, dag_run):
    return {
        "other": ti.xcom_pull(task_ids="produce", dag_id="producer", run_id=dag_run.conf["p"]),
        "same_id": ti.xcom_pull(task_ids="produce", dag_id="producer", default="none"),
        "prior": ti.xcom_pull(task_ids="consume", include_prior_dates=True),
        "mine": ti.xcom_pull(task_ids="consume", key="missing", run_id=dag_run.conf["p"]),
    }


with DAG("consumer"):
    consume()
"""


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "across.py").write_text(textwrap.dedent(DAG_FILE))
    db, config, _, _ = parsed_database(migrated_db_url, tmp_path, dags)
    yield Env(db, fast_executor_settings(config), config.logging.task_log_folder)
    db.dispose()


def start(env: Env, dag_id: str, at: datetime, conf: dict[str, Any] | None = None) -> int:
    pk = env.db.call(
        lambda s: runs.create_run(
            s, dag_id, run_type=runs.MANUAL, now=at, conf=conf, logical_date=at
        )
    )
    assert pk is not None
    return pk


def run_id_of(env: Env, pk: int) -> str:
    return str(env.db.call(lambda s: s.get(DagRun, pk).run_id))


@pytest.mark.both_databases
async def test_xcom_pull_reads_other_dags_and_runs(env: Env) -> None:
    at = datetime(2026, 3, 1, tzinfo=UTC)
    producer = start(env, "producer", at)
    producer_run = run_id_of(env, producer)
    with anyio.fail_after(90):
        async with env.executor():
            assert await env.run_to_end(producer) == "success"
            first = start(env, "consumer", at + timedelta(hours=1), {"p": producer_run})
            assert await env.run_to_end(first) == "success"
            second = start(env, "consumer", at + timedelta(hours=2), {"p": producer_run})
            assert await env.run_to_end(second) == "success"
    first_result = env.results(first, "consume")["return_value"]
    assert first_result == {
        "other": {"made_by": producer_run},
        "same_id": "none",  # the producer has no run with the consumer's run id
        "prior": None,  # no earlier consumer run stored a result
        "mine": None,
    }
    assert env.results(second, "consume")["return_value"]["prior"] == first_result
