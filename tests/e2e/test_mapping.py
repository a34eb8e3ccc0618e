"""The example DAG of dynamic task mapping under ``sluice run`` (a subprocess): a task
mapped over an upstream list and a BashOperator mapped over a literal list run, the sum
below them gets the copies' results, and the CLI prints one copy's result and log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from engine.db.models import DagRun
from tests.cli import invoke
from tests.e2e.helpers import running_engine, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

EXAMPLE = Path(__file__).parents[2] / "dags" / "example_mapping.py"


@pytest.fixture(scope="module")
def engine(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("mapping")
    files = {"example_mapping.py": EXAMPLE.read_text()}
    with running_engine(root, files, ["example_mapping"], template=sqlite_template) as running:
        yield running


def test_the_example_mapping_dag_runs_and_the_cli_shows_each_copy(engine) -> None:
    db, env, log = engine["db"], engine["env"], engine["log"]
    done = invoke("dags", "trigger", "example_mapping", "--json", env=env)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]

    def ended() -> str | None:
        run = db.call(lambda s: s.execute(select(DagRun).where(DagRun.run_id == run_id)).scalar())
        return None if run is None or run.state not in ("success", "failed") else run.state

    state = wait_for(ended, timeout=120, what="the example_mapping run to end")
    assert state == "success", log.read_text()[-3000:]

    def result(task_id: str, *options: str) -> str:
        printed = invoke("tasks", "result", "example_mapping", run_id, task_id, *options, env=env)
        assert printed.returncode == 0, printed.stderr
        return printed.stdout

    names = ["orders.csv", "customers.csv", "returns.csv"]
    assert result("total", "--key", "return_value") == f"{sum(len(n) * 10 for n in names)}\n"
    assert result("count_lines", "--map-index", "1", "--key", "return_value") == "130\n"
    assert result("shout", "--map-index", "1", "--key", "return_value") == "world\n"
    logs = invoke(
        "tasks", "logs", "example_mapping", run_id, "count_lines", "--map-index", "2", env=env
    )
    assert logs.returncode == 0 and "copy 2 counts returns.csv" in logs.stdout
    listed = json.loads(invoke("runs", "list", "example_mapping", "--json", env=env).stdout)
    assert {f"count_lines[{i}]" for i in range(3)} <= set(listed[0]["tasks"])
