"""Named mapping (``map_index_template``) on SQLite and PostgreSQL, with the real scheduler
and executor in-process: each copy of a mapped task is named by its template, rendered once
it ran with its context (names the task put there too), stored with the copy and shown by
``sluice tasks list``, the REST task instances and the run and task pages. As in Airflow's
task runner, a failed copy is named too; a template that cannot render fails a copy that
succeeded, and leaves a failed copy its number (its log says why)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING
from urllib.parse import quote

import anyio
import pytest
from click.testing import CliRunner

from engine.api.rest.tasks import TaskInstanceItem
from engine.cli.main import cli
from engine.db import models
from engine.views import tasks as tasks_view
from tests.integration.api_support import api_harness
from tests.integration.inprocess_engine import InProcessEngine

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

DAGS = """
from engine import DAG, PythonOperator, get_current_context, task


@task(map_index_template="{{ city_label }}")
def visit(city):
    get_current_context()["city_label"] = city.upper()
    return city


def greet(name):
    return f"hello {name}"


with DAG("named"):
    visit.expand(city=["paris", "oslo"])
    PythonOperator.partial(
        task_id="classic", python_callable=greet, map_index_template="{{ task.op_args[0] }}"
    ).expand(op_args=[["ann"], ["bob"]])


@task(map_index_template="{{ 'batch-' ~ label }}")
def boom(n):
    get_current_context()["label"] = n
    raise ValueError("no")


@task(map_index_template="{{ no_such_name }}")
def unnamed(x):
    return x


@task(map_index_template="{{ no_such_name }}")
def unnamed_boom(x):
    raise ValueError("its own error")


with DAG("named_failure"):
    boom.expand(n=[7])
    unnamed.expand(x=[1])
    unnamed_boom.expand(x=[1])
"""


@pytest.fixture
def engine(migrated_db_url: str, tmp_path: Path):
    engine = InProcessEngine(migrated_db_url, tmp_path, {"named.py": DAGS})
    yield engine
    engine.db.dispose()


def _names(engine: InProcessEngine, run_pk: int) -> dict[str, str | None]:
    return {
        f"{ti.task_id}[{ti.map_index}]": ti.rendered_map_index
        for ti in engine.instances(run_pk)
        if ti.map_index >= 0
    }


@pytest.mark.both_databases
async def test_each_copy_is_named_by_its_template_rendered_after_it_ran(
    engine: InProcessEngine, migrated_db_url: str, tmp_path: Path
) -> None:
    run_pk = engine.trigger("named")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run_pk) == ["success"]
    assert _names(engine, run_pk) == {
        "visit[0]": "PARIS",  # a name the task put in its context as it ran
        "visit[1]": "OSLO",
        "classic[0]": "ann",  # the copy's own (unmapped) arguments
        "classic[1]": "bob",
    }
    run_id = engine.run(run_pk).run_id

    listed = CliRunner().invoke(
        cli, ["tasks", "list", "named", run_id, "--json"], obj={"config": engine.config}
    )
    assert listed.exit_code == 0, listed.output
    shown = {
        (t["task_id"], t["map_index"]): t["rendered_map_index"] for t in json.loads(listed.output)
    }
    assert shown[("visit", 1)] == "OSLO"
    assert shown[("classic", 0)] == "ann"
    unknown = CliRunner().invoke(
        cli, ["tasks", "list", "named", "nope"], obj={"config": engine.config}
    )
    assert unknown.exit_code == 1 and "no run 'nope' of DAG 'named'" in unknown.output
    table = CliRunner().invoke(
        cli, ["tasks", "list", "named", run_id], obj={"config": engine.config}
    )
    assert table.exit_code == 0, table.output
    assert any(line.split()[:3] == ["visit", "0", "PARIS"] for line in table.output.splitlines())

    page = engine.db.call(
        lambda s: tasks_view.list_task_instances(s, "named", run_id, now=models.utcnow())
    )
    assert page is not None
    items = [TaskInstanceItem.model_validate(item) for item in page["items"]]  # the REST model
    assert {(i.task_id, i.map_index, i.rendered_map_index) for i in items} >= {
        ("classic", 0, "ann"),
        ("visit", 0, "PARIS"),
    }

    api = api_harness(migrated_db_url, tmp_path)
    try:
        api.user("ada")
        client = api.client()
        api.login(client, "ada")
        run_page = client.get(f"/dags/named/runs/{quote(run_id, safe='')}")
        assert run_page.status_code == 200
        assert ">visit[PARIS]</a>" in run_page.text
        assert ">classic[bob]</a>" in run_page.text
        task_page = client.get(
            f"/dags/named/runs/{quote(run_id, safe='')}/tasks/visit", params={"map_index": 1}
        )
        assert "<h1>visit[OSLO]" in task_page.text
        assert ">[PARIS]</a>" in task_page.text  # the copies, by name
        detail = client.get(
            f"/api/v1/dags/named/runs/{quote(run_id, safe='')}/tasks/visit",
            params={"map_index": 0},
        ).json()
        assert detail["rendered_map_index"] == "PARIS"
        assert detail["rendered_map_indexes"] == ["PARIS", "OSLO"]
    finally:
        api.db.dispose()


async def test_a_failed_copy_is_named_and_a_broken_template_fails_a_success(
    engine: InProcessEngine,
) -> None:
    run_pk = engine.trigger("named_failure")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run_pk) == ["failed"]
    assert engine.states(run_pk) == {
        "boom[0]": "failed",
        "unnamed[0]": "failed",  # it returned, but its name could not render
        "unnamed_boom[0]": "failed",
    }
    assert _names(engine, run_pk) == {
        "boom[0]": "batch-7",  # named by what it put in its context before it failed
        "unnamed[0]": None,
        "unnamed_boom[0]": None,
    }
    assert "map_index_template '{{ no_such_name }}' did not render" in engine.log(
        run_pk, "unnamed", map_index=0
    )
    failed_log = engine.log(run_pk, "unnamed_boom", map_index=0)
    assert "ValueError: its own error" in failed_log  # its own error, not the template's
    assert "map_index_template of task 'unnamed_boom' did not render" in failed_log
