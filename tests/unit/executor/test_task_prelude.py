"""The ``TaskPrelude`` line before a task process's spec: the process imports its DAG file
while the executor marks the try running, and the spec then runs that task without a
second import; a prelude that names another task (or a file that fails to import) changes
nothing the step reports. Real task processes (``python -m engine.execution.task_runner``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest

from engine.execution.protocol import TaskPrelude, TaskResult, TaskSpec
from engine.executor.task_specs import build_context
from engine.states import TaskState
from triggers.serde import deserialize_value, dumps

if TYPE_CHECKING:
    from pathlib import Path

DAG = """
import pathlib
from engine import DAG, task

with pathlib.Path(__file__).with_name("imports.txt").open("a") as counter:
    counter.write("imported\\n")
if pathlib.Path(__file__).with_name("broken").exists():
    raise RuntimeError("the DAG file is broken")

@task
def one():
    return "one ran"

@task
def two():
    return "two ran"

with DAG("pre", schedule=None):
    one()
    two()
"""


def _spec(dag_file: Path, task_id: str) -> TaskSpec:
    context = build_context(
        dag_id="pre", run_id="r", task_id=task_id, try_number=1, events=[], default_deferrable=False
    )
    return TaskSpec(
        ti_id=7,
        dag_id="pre",
        run_id="r",
        task_id=task_id,
        fileloc=str(dag_file),
        try_number=1,
        try_started_at=datetime.now(UTC).isoformat(),
        context=dumps(context),
        dags_folder=str(dag_file.parent),
    )


def _run(lines: list[str]) -> TaskResult:
    """The task process's result; its standard input stays open until it exits (a closed
    one means its executor is gone: it would exit at once)."""
    with subprocess.Popen(
        [sys.executable, "-P", "-m", "engine.execution.task_runner", "--ti-id", "7"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as process:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write("".join(line + "\n" for line in lines))
        process.stdin.flush()
        out = process.stdout.read()  # until it reported its result
        assert process.wait(timeout=60) == 0
        process.stdin.close()
    return TaskResult.from_json(out)


@pytest.fixture
def dag_file(tmp_path: Path) -> Path:
    path = tmp_path / "pre_dag.py"
    path.write_text(textwrap.dedent(DAG))
    return path


def _prelude(dag_file: Path, task_id: str) -> str:
    names = {"ti_id": 7, "dag_id": "pre", "fileloc": str(dag_file)}
    return TaskPrelude(task_id=task_id, dags_folder=str(dag_file.parent), **names).to_json()


def _imports(dag_file: Path) -> int:
    return dag_file.with_name("imports.txt").read_text().count("imported")


def test_the_prelude_s_task_runs_without_a_second_import(dag_file: Path) -> None:
    result = _run([_prelude(dag_file, "one"), _spec(dag_file, "one").to_json()])
    assert result.outcome == TaskState.SUCCESS
    assert deserialize_value(result.return_value) == "one ran"
    assert _imports(dag_file) == 1


def test_a_spec_for_another_task_loads_its_own(dag_file: Path) -> None:
    result = _run([_prelude(dag_file, "one"), _spec(dag_file, "two").to_json()])
    assert deserialize_value(result.return_value) == "two ran"
    assert _imports(dag_file) == 2


def test_a_spec_alone_still_runs(dag_file: Path) -> None:
    result = _run([_spec(dag_file, "two").to_json()])
    assert deserialize_value(result.return_value) == "two ran"
    assert _imports(dag_file) == 1


def test_a_file_that_fails_to_import_fails_the_step_as_without_a_prelude(dag_file: Path) -> None:
    dag_file.with_name("broken").touch()
    with_prelude = _run([_prelude(dag_file, "one"), _spec(dag_file, "one").to_json()])
    assert _imports(dag_file) == 1  # imported once: its error is reported, not a retry
    without = _run([_spec(dag_file, "one").to_json()])
    assert with_prelude.outcome == without.outcome == TaskState.FAILED
    assert with_prelude.error == without.error
    assert "the DAG file is broken" in (with_prelude.error or "")
