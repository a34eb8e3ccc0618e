"""The Celery executor end to end: ``sluice run`` with ``[executor] kind = "celery"`` and
real ``sluice celery worker`` subprocesses, on Redis and on RabbitMQ."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import select

from engine.db.models import Job
from engine.db.queries.runs import find_task_instance
from tests.e2e.celery_world import CeleryWorld, make_world
from tests.e2e.helpers import run_cli

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SMALL_DAG = """
from engine import DAG, Asset, task

done = Asset("celery_done")


@task
def first():
    print("first ran here")
    return {"n": 41}


@task(outlets=[done])
def second(value):
    return value["n"] + 1


with DAG("small", schedule=None):
    second(first())
"""


@pytest.fixture
def world(
    tmp_path: Path, sqlite_template: Path, broker_url: str, queue_prefix: str
) -> Iterator[Callable[..., CeleryWorld]]:
    worlds: list[CeleryWorld] = []

    def make(files: dict[str, str], **settings: str) -> CeleryWorld:
        built = make_world(
            tmp_path,
            files,
            template=sqlite_template,
            broker_url=broker_url,
            queue_prefix=queue_prefix,
            **settings,
        )
        worlds.append(built)
        return built

    yield make
    for built in worlds:
        built.close()


def test_a_dag_runs_on_a_worker_with_results_outlets_and_logs(
    world: Callable[..., CeleryWorld],
) -> None:
    w = world({"small.py": SMALL_DAG})
    w.start_engine(("small",))
    _, worker_log = w.start_worker("one")
    run_id = w.trigger("small")
    w.wait_run("small", run_id, timeout=90)

    # the result of `first` reached `second`, whose return value is stored
    result = run_cli("tasks", "result", "small", run_id, "second", "--json", env=w.env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["results"]["return_value"] == 42
    # its outlet's asset event was written with its success
    events = run_cli("assets", "events", "celery_done", "--json", env=w.env)
    assert len(json.loads(events.stdout)) == 1, events.stdout
    # the task's log is the try's log file, as under the local executor
    logs = run_cli("tasks", "logs", "small", run_id, "first", env=w.env)
    assert "first ran here" in logs.stdout, logs.stdout
    # the tries ran in the worker, none in `sluice run`
    worker_text = worker_log.read_text()
    assert "Task small.first" in worker_text and "Task small.second" in worker_text
    assert "Task small.first" not in w.log.read_text()
    ti = w.db.call(lambda s: find_task_instance(s, "small", run_id, "second"))
    assert ti is not None and ti.try_number == 1
    # the worker is an executor job with its concurrency as capacity
    capacities = w.db.call(
        lambda s: list(s.execute(select(Job.capacity).where(Job.job_type == "executor")).scalars())
    )
    assert 2 in capacities
