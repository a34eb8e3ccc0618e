"""The protocol of the callback child process (``engine.execution.callback_runner``)."""

from __future__ import annotations

import sys
import textwrap
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from engine.execution.callback_runner import run_callback_spec
from engine.execution.protocol import CallbackSpec, TaskSpec
from engine.execution.task_runner import StepState, run_outcome_callbacks, run_task
from engine.executor.task_specs import build_context
from engine.states import TaskState
from triggers.serde import dumps

if TYPE_CHECKING:
    from pathlib import Path


def test_callback_specs_refuse_what_they_cannot_run() -> None:
    spec = CallbackSpec(kind="dag", callback="on_success_callback", spec="{}", reason="success")
    assert CallbackSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="malformed callback spec"):
        CallbackSpec.from_json('{"kind": "dag", "callback": "on_retry_callback", "spec": "{}"}')
    with pytest.raises(ValueError, match="malformed callback spec"):
        CallbackSpec.from_json("not json")


CALLBACK_DAG = """
from datetime import timedelta

from engine import DAG, task

CALLS = []


def record(name):
    def callback(context):
        CALLS.append((name, context["ti"].task_id, type(context.get("exception")).__name__,
                      context.get("reason")))
    return callback


@task(
    execution_timeout=timedelta(seconds=5),
    on_failure_callback=record("failure"),
    on_retry_callback=record("retry"),
    on_execute_callback=record("execute"),
)
def fails():
    raise ValueError("no")


with DAG("cbunit", on_success_callback=record("dag_success")):
    fails()
"""


@pytest.fixture
def callback_spec_for(tmp_path: Path):
    dag_file = tmp_path / "cb_unit_dag.py"
    dag_file.write_text(textwrap.dedent(CALLBACK_DAG))

    def make(**changes: Any) -> TaskSpec:
        context = build_context(
            dag_id="cbunit",
            run_id="r",
            task_id="fails",
            try_number=1,
            events=[],
            default_deferrable=False,
        )
        values: dict[str, Any] = {
            "ti_id": 1,
            "dag_id": "cbunit",
            "run_id": "r",
            "task_id": "fails",
            "fileloc": str(dag_file),
            "try_number": 1,
            "try_started_at": datetime.now(UTC).isoformat(),
            "context": dumps(context),
            "max_tries": 0,
        }
        values.update(changes)
        return TaskSpec(**values)

    return make


def _calls(spec: TaskSpec) -> list[tuple[str, str, str, str | None]]:
    modules = list(sys.modules.values())
    (module,) = [m for m in modules if getattr(m, "__file__", "") == spec.fileloc]
    return list(module.CALLS)


def test_a_failed_try_calls_retry_while_tries_remain_then_failure(callback_spec_for) -> None:
    spec = callback_spec_for(max_tries=1)
    step = StepState()
    result = run_task(spec, step=step)
    run_outcome_callbacks(spec, result, step)
    assert result.outcome == TaskState.FAILED
    assert _calls(spec) == [
        ("execute", "fails", "NoneType", None),
        ("retry", "fails", "ValueError", None),
    ]
    last = callback_spec_for(max_tries=1, try_number=2)
    step = StepState()
    run_outcome_callbacks(last, run_task(last, step=step), step)
    assert _calls(last)[-1] == ("failure", "fails", "ValueError", None)


def test_a_try_past_its_deadline_before_it_starts_still_calls_its_failure_callback(
    callback_spec_for,
) -> None:
    late = (datetime.now(UTC) - timedelta(seconds=10)).isoformat()
    spec = callback_spec_for(try_started_at=late)
    step = StepState()
    result = run_task(spec, step=step)
    run_outcome_callbacks(spec, result, step)
    assert result.timed_out and _calls(spec) == [
        ("failure", "fails", "TaskExecutionTimeout", None)
    ]  # the task never started: no on_execute_callback


def test_a_dag_callback_gets_the_run_context_and_the_reason(callback_spec_for) -> None:
    task_spec = callback_spec_for()
    spec = CallbackSpec(
        kind="dag", callback="on_success_callback", spec=task_spec.to_json(), reason="success"
    )
    assert run_callback_spec(spec) == []
    assert _calls(task_spec) == [("dag_success", "fails", "NoneType", "success")]


MAPPED_DAG = """
from engine import DAG, task

CALLS = []


def record(context):
    CALLS.append((type(context["task"]).__name__, context["ti"].map_index, context["reason"]))


@task
def each(x):
    return x


with DAG("cbmapped", on_failure_callback=record):
    each.expand(x=[])
"""


def test_a_dag_callback_around_a_mapped_task_that_is_no_copy_gets_it_as_it_is(
    tmp_path: Path,
) -> None:
    dag_file = tmp_path / "cb_mapped_dag.py"
    dag_file.write_text(textwrap.dedent(MAPPED_DAG))
    context = build_context(
        dag_id="cbmapped",
        run_id="r",
        task_id="each",
        try_number=1,
        events=[],
        default_deferrable=False,
    )  # map_index -1: the mapped task expanded to nothing (skipped) and ended the run
    task_spec = TaskSpec(
        ti_id=0,
        dag_id="cbmapped",
        run_id="r",
        task_id="each",
        fileloc=str(dag_file),
        try_number=1,
        try_started_at=datetime.now(UTC).isoformat(),
        context=dumps(context),
    )
    spec = CallbackSpec(
        kind="dag", callback="on_failure_callback", spec=task_spec.to_json(), reason="task_failure"
    )
    assert run_callback_spec(spec) == []
    assert _calls(task_spec) == [("MappedOperator", -1, "task_failure")]
