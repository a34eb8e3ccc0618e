"""``ExternalTaskMarker`` on SQLite and PostgreSQL: ``sluice tasks clear`` of a marker (here
selected as the downstream of its task) also clears the task it marks in the other DAG's run
at the same logical date, and the tasks below that one, following markers there up to the
first marker's ``recursion_depth``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import anyio
import pytest
from click.testing import CliRunner

from engine.cli.main import cli
from engine.states import TaskState
from tests.integration.inprocess_engine import InProcessEngine

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

OK, NONE = TaskState.SUCCESS, TaskState.NONE
AT = datetime(2026, 3, 2, 6, tzinfo=UTC)

DAGS = """
from engine import DAG, EmptyOperator, ExternalTaskMarker

for dag_id, depth in [("parent", 2), ("shallow_parent", 1)]:
    with DAG(dag_id):
        EmptyOperator(task_id="parent_task") >> ExternalTaskMarker(
            task_id="marker",
            external_dag_id="child",
            external_task_id="child_task1",
            recursion_depth=depth,
        )

with DAG("child"):
    before, child_task1 = EmptyOperator(task_id="before"), EmptyOperator(task_id="child_task1")
    before >> child_task1 >> ExternalTaskMarker(
        task_id="marker2", external_dag_id="grandchild", external_task_id="g1"
    )

with DAG("grandchild"):
    EmptyOperator(task_id="g0") >> EmptyOperator(task_id="g1") >> EmptyOperator(task_id="g2")
"""


@pytest.fixture
def engine(migrated_db_url: str, tmp_path: Path):
    engine = InProcessEngine(migrated_db_url, tmp_path, {"marker_dags.py": DAGS})
    yield engine
    engine.db.dispose()


def sluice(engine: InProcessEngine, *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli, list(args), obj={"config": engine.config})
    assert result.exit_code == code, result.output
    return result.output


@pytest.mark.both_databases
async def test_clearing_a_marker_clears_the_marked_task_and_below_recursively(
    engine: InProcessEngine,
) -> None:
    runs = {d: engine.trigger(d, logical_date=AT) for d in ("parent", "child", "grandchild")}
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(*runs.values()) == ["success"] * 3
            sluice(engine, "tasks", "clear", "parent", "-t", "^parent_task$", "-d", "-y")
            assert engine.states(runs["parent"]) == {"parent_task": NONE, "marker": NONE}
            assert engine.states(runs["child"]) == {
                "before": OK,  # upstream of the marked task: kept
                "child_task1": NONE,
                "marker2": NONE,
            }
            assert engine.states(runs["grandchild"]) == {"g0": OK, "g1": NONE, "g2": NONE}
            assert await engine.run_to_end(*runs.values()) == ["success"] * 3
    tries = {ti.task_id: ti.try_number for ti in engine.instances(runs["child"])}
    assert tries == {"before": 1, "child_task1": 2, "marker2": 2}


async def test_a_clear_deeper_than_recursion_depth_is_refused(engine: InProcessEngine) -> None:
    runs = [engine.trigger(d, logical_date=AT) for d in ("shallow_parent", "child", "grandchild")]
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(*runs) == ["success"] * 3
    out = sluice(engine, "tasks", "clear", "shallow_parent", "-t", "marker", "-y", code=1)
    assert "Maximum recursion depth 1 reached for ExternalTaskMarker 'marker2'" in out
    assert engine.states(runs[1]) == {"before": OK, "child_task1": OK, "marker2": OK}


async def test_a_marker_that_has_not_run_marks_nothing_yet(engine: InProcessEngine) -> None:
    child = engine.trigger("child", logical_date=AT)
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(child) == ["success"]
    parent = engine.trigger("parent", logical_date=AT)  # its marker never runs
    sluice(engine, "tasks", "clear", "parent", "-y")
    assert set(engine.states(parent).values()) == {NONE}
    assert set(engine.states(child).values()) == {OK}
