"""TaskFlow with ``sluice run`` as a subprocess: a ``@dag`` whose tasks pass results (and a
classic operator pulling them), then ``sluice tasks result`` printing what was stored."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from engine.db.models import DagRun
from tests.cli import invoke
from tests.e2e.helpers import running_engine, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from engine.db.database import Database

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

DAGS = """
from datetime import UTC, datetime

from engine import EmptyOperator, PythonOperator, dag, task


@dag(schedule=None)
def etl(multiplier: int = 2):
    @task
    def extract():
        return [{"id": 1, "amount": 10}, {"id": 2, "amount": 32}]

    @task(multiple_outputs=True)
    def transform(rows, multiplier):
        amounts = [row["amount"] * multiplier for row in rows]
        return {"total": sum(amounts), "count": len(amounts)}

    @task
    def load(total, count):
        return {"average": total / count, "at": datetime(2026, 1, 5, tzinfo=UTC)}

    def audit(ti):
        ti.xcom_push("checked", ["extract", "load"])
        return f"average {ti.xcom_pull(task_ids='load')['average']}"

    parts = transform(extract(), multiplier)
    loaded = load(parts["total"], parts["count"])
    audited = PythonOperator(task_id="audit", python_callable=audit)
    loaded >> audited >> EmptyOperator(task_id="done")


etl()
"""


@pytest.fixture(scope="module")
def engine(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("taskflow")
    with running_engine(root, {"etl.py": DAGS}, ["etl"], template=sqlite_template) as running:
        yield running


def _run_state(db: Database, run_id: str) -> str | None:
    run = db.call(lambda s: s.execute(select(DagRun).where(DagRun.run_id == run_id)).scalar())
    return None if run is None or run.state not in ("success", "failed") else run.state


def _trigger(env: dict[str, str], conf: str | None = None) -> str:
    args = ["dags", "trigger", "etl", "--json"] + ([] if conf is None else ["--conf", conf])
    done = invoke(*args, env=env)
    assert done.returncode == 0, done.stderr
    run_id: str = json.loads(done.stdout)["run_id"]
    return run_id


def _result(env: dict[str, str], run_id: str, task_id: str, *options: str) -> Any:
    done = invoke("tasks", "result", "etl", run_id, task_id, *options, env=env)
    return done


def test_results_flow_between_tasks_and_the_cli_prints_them(engine) -> None:
    db, env, log = engine["db"], engine["env"], engine["log"]
    run_id = _trigger(env)
    state = wait_for(lambda: _run_state(db, run_id), timeout=120, what="the etl run to end")
    assert state == "success", log.read_text()[-3000:]

    printed = _result(env, run_id, "transform")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == [
        'return_value: {"total": 84, "count": 2}',
        "count: 2",
        "total: 84",
    ]
    as_json = json.loads(_result(env, run_id, "load", "--json").stdout)
    assert as_json == {
        "dag_id": "etl",
        "run_id": run_id,
        "task_id": "load",
        "state": "success",
        "results": {"return_value": {"average": 42.0, "at": "2026-01-05T00:00:00+00:00"}},
    }
    assert _result(env, run_id, "audit", "--key", "return_value").stdout == "average 42.0\n"
    checked = _result(env, run_id, "audit", "--key", "checked", "--json").stdout
    assert json.loads(checked) == ["extract", "load"]


def test_the_run_conf_reaches_a_dag_param_passed_with_results(engine) -> None:
    db, env = engine["db"], engine["env"]
    run_id = _trigger(env, '{"multiplier": 3}')
    assert wait_for(lambda: _run_state(db, run_id), timeout=120, what="the run") == "success"
    printed = _result(env, run_id, "transform", "--key", "total")
    assert printed.stdout == "126\n"


def test_tasks_result_says_what_is_missing(engine) -> None:
    db, env = engine["db"], engine["env"]
    run_id = _trigger(env)
    assert wait_for(lambda: _run_state(db, run_id), timeout=120, what="the run") == "success"
    no_task = _result(env, run_id, "nope")
    assert no_task.returncode == 1 and "no task 'nope' in run" in no_task.stderr
    no_key = _result(env, run_id, "transform", "--key", "avg")
    assert no_key.returncode == 1
    assert "task 'transform' has no result 'avg'; it has count, return_value, total" in (
        no_key.stderr
    )
    no_run = _result(env, "manual__nope", "load")
    assert no_run.returncode == 1
    assert "no run 'manual__nope' of DAG 'etl'" in no_run.stderr
    nothing = _result(env, run_id, "done")
    assert nothing.stdout == "(none: the task returned None and pushed nothing)\n"
    assert json.loads(_result(env, run_id, "done", "--json").stdout)["results"] == {}
    no_value = _result(env, run_id, "done", "--key", "return_value")
    assert no_value.returncode == 1
    assert "no result 'return_value': the task returned None and pushed nothing" in (
        no_value.stderr
    )
