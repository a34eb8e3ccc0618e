"""The child side of the executor: context, protocol, and running a task in-process."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from engine.authoring.deferral import Deferral
from engine.db.queries.assets import EventRow
from engine.execution.deadline import remaining_s, timeout_message
from engine.execution.protocol import TaskResult, TaskSpec
from engine.execution.task_runner import run_task
from engine.executor.task_specs import build_context
from engine.states import TaskState
from triggers.serde import deserialize_value, dumps, loads, loads_kwargs, serialize_value

if TYPE_CHECKING:
    from pathlib import Path

T0 = datetime(2030, 1, 1, tzinfo=UTC)

DAG = """
import asyncio
import pathlib
import time
from datetime import timedelta

from engine import DAG, BaseOperator, task
from triggers.temporal import TimeDeltaTrigger


class Waits(BaseOperator):
    def execute(self, context):
        self.defer(
            trigger=TimeDeltaTrigger(timedelta(minutes=5)),
            method_name="done",
            kwargs={"seen": context["dag_id"]},
            timeout=timedelta(seconds=30),
        )

    def done(self, context, event, seen):
        return {"event": event, "seen": seen}


@task
def echo(triggering_asset_events, default_deferrable):
    print("printed by the task")
    return {"events": triggering_asset_events, "deferrable": default_deferrable}


@task
def fails():
    raise KeyError("missing")


@task
def opaque():
    return object()


@task(execution_timeout=timedelta(seconds=0.2))
def slow():
    time.sleep(30)


@task
async def async_echo(dag_id):
    await asyncio.sleep(0)
    pathlib.Path(__file__).with_name("async_ran.txt").write_text(dag_id)
    return {"ran": dag_id}


@task
async def async_fails():
    await asyncio.sleep(0)
    raise KeyError("async missing")


@task(execution_timeout=timedelta(seconds=0.2))
async def async_slow():
    await asyncio.sleep(30)


class AsyncExecute(BaseOperator):
    async def execute(self, context):
        await asyncio.sleep(0)
        return context["task_id"]


class AsyncResume(BaseOperator):
    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(timedelta(minutes=5)), method_name="done")

    async def done(self, context, event):
        await asyncio.sleep(0)
        if event == "bad":
            raise ValueError("bad event")
        return {"event": event}


with DAG("unit"):
    Waits(task_id="waits", execution_timeout=timedelta(minutes=1))
    echo()
    fails()
    opaque()
    slow()
    async_echo()
    async_fails()
    async_slow()
    AsyncExecute(task_id="async_execute")
    AsyncResume(task_id="async_resume")
"""


def test_context_groups_triggering_events_by_asset_in_id_order() -> None:
    events = [
        EventRow(5, "b", serialize_value({"at": T0}), T0, "w1"),
        EventRow(2, "a", {"n": 1}, T0, None),
        EventRow(3, "a", {"__sluice_type__": "nope", "v": 1}, T0, "w2"),
    ]
    context = build_context(
        dag_id="d", run_id="r", task_id="t", try_number=2, events=events, default_deferrable=False
    )
    triggering = context["triggering_asset_events"]
    assert [e["id"] for e in triggering["a"]] == [2, 3]
    assert triggering["b"][0]["payload"] == {"at": T0}  # tagged values come back typed
    assert triggering["a"][1]["payload"] == {"__sluice_type__": "nope", "v": 1}  # kept as stored
    assert triggering["b"][0]["source_watcher"] == "w1"
    assert (context["try_number"], context["default_deferrable"]) == (2, False)
    assert loads(dumps(context)) == context  # it travels to the child as tagged JSON


def test_timeout_message_and_remaining_time() -> None:
    assert timeout_message(60, 61.25, 2) == (
        "execution_timeout (60s) exceeded after 61.2s across 2 deferrals"
    )
    assert timeout_message(0.5, 0.5, 1).startswith("execution_timeout (0.5s)")
    assert timeout_message(0.5, 0.5, 1).endswith("across 1 deferral")
    assert remaining_s(T0, None, T0) == float("inf")
    assert remaining_s(T0, timedelta(seconds=10), T0 + timedelta(seconds=4)) == 6


def test_protocol_round_trips_and_rejects_garbage() -> None:
    deferral = Deferral("m.Trigger", '{"password":"s3cret"}', "done", '{"i":1}', None)
    result = TaskResult(TaskState.DEFERRED, 1.0, execution_timeout_s=5.0, deferral=deferral)
    assert TaskResult.from_json(result.to_json()) == result
    assert "s3cret" not in repr(deferral)
    with pytest.raises(ValueError, match="deferral goes with outcome"):
        TaskResult.from_json(TaskResult(TaskState.SUCCESS, 1.0, deferral=deferral).to_json())
    with pytest.raises(ValueError, match="malformed task spec"):
        TaskSpec.from_json(b'{"ti_id": 1}')
    with pytest.raises(ValueError, match="malformed task result"):
        TaskResult.from_json("not json")


@pytest.fixture
def spec_for(tmp_path: Path):
    dag_file = tmp_path / "unit_dag.py"
    dag_file.write_text(textwrap.dedent(DAG))

    def make(task_id: str, **changes: Any) -> TaskSpec:
        context = build_context(
            dag_id="unit",
            run_id="r",
            task_id=task_id,
            try_number=1,
            events=[EventRow(1, "a", {"k": "v"}, T0, "w")],
            default_deferrable=True,
        )
        values: dict[str, Any] = {
            "ti_id": 1,
            "dag_id": "unit",
            "run_id": "r",
            "task_id": task_id,
            "fileloc": str(dag_file),
            "try_number": 1,
            "try_started_at": datetime.now(UTC).isoformat(),
            "context": dumps(context),
        }
        values.update(changes)
        return TaskSpec(**values)

    return make


def test_success_returns_the_value_and_output_goes_to_stderr(spec_for, capsys) -> None:
    result = run_task(spec_for("echo"))
    assert result.outcome == TaskState.SUCCESS and result.has_return_value
    value = deserialize_value(result.return_value)
    assert value["deferrable"] is True
    assert value["events"]["a"][0]["payload"] == {"k": "v"}
    assert "printed by the task" in capsys.readouterr().out


def test_a_failure_reports_the_error_and_prints_the_traceback(spec_for, capsys) -> None:
    result = run_task(spec_for("fails"))
    assert (result.outcome, result.error, result.timed_out) == (
        TaskState.FAILED,
        "KeyError: 'missing'",
        False,
    )
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_an_unserializable_return_value_fails_the_try(spec_for) -> None:
    result = run_task(spec_for("opaque"))
    assert result.outcome == TaskState.FAILED and not result.has_return_value
    assert result.error is not None
    assert result.error.startswith("TypeError: task 'opaque': its return value of type object")


def test_a_deferral_carries_the_trigger_kwargs_and_defer_kwargs(spec_for) -> None:
    result = run_task(spec_for("waits"))
    assert result.outcome == TaskState.DEFERRED and result.deferral is not None
    deferral = result.deferral
    assert (deferral.classpath, deferral.method_name) == (
        "triggers.temporal.DateTimeTrigger",
        "done",
    )
    assert isinstance(loads_kwargs(deferral.trigger_kwargs)["moment"], datetime)
    assert loads(deferral.kwargs) == {"seen": "unit"}
    assert (deferral.timeout_s, result.execution_timeout_s) == (30.0, 60.0)


def test_a_resumed_task_gets_the_event_and_its_kwargs(spec_for) -> None:
    spec = spec_for("waits", next_method="done", next_kwargs=dumps({"seen": "x", "event": 7}))
    result = run_task(spec)
    assert deserialize_value(result.return_value) == {"event": 7, "seen": "x"}


def test_a_failed_trigger_fails_the_resumed_task(spec_for) -> None:
    kwargs = dumps({"error": "boom upstream", "traceback": None})
    result = run_task(spec_for("waits", next_method="__fail__", next_kwargs=kwargs))
    assert result.outcome == TaskState.FAILED and result.error is not None
    assert "boom upstream" in result.error


def test_execution_timeout_interrupts_the_task(spec_for) -> None:
    result = run_task(spec_for("slow", deferral_count=0))
    assert result.outcome == TaskState.FAILED and result.timed_out
    assert result.error is not None
    assert result.error.startswith("execution_timeout (0.2s) exceeded after 0.")


def test_a_try_past_its_deadline_fails_without_running(spec_for, capsys) -> None:
    started = datetime.now(UTC) - timedelta(minutes=2)
    spec = spec_for(
        "waits",
        try_started_at=started.isoformat(),
        next_method="done",
        next_kwargs=dumps({"seen": "x", "event": 1}),
        deferral_count=2,
    )
    result = run_task(spec)
    assert result.outcome == TaskState.FAILED and result.timed_out
    assert result.error is not None
    assert "execution_timeout (60s) exceeded after 120." in result.error
    assert result.error.endswith("across 2 deferrals")


def test_an_async_task_runs_to_completion_and_its_value_is_the_result(spec_for, tmp_path) -> None:
    result = run_task(spec_for("async_echo"))
    assert result.outcome == TaskState.SUCCESS and result.has_return_value
    assert deserialize_value(result.return_value) == {"ran": "unit"}
    assert (tmp_path / "async_ran.txt").read_text() == "unit"  # the body really ran


def test_an_async_task_that_raises_fails_the_try(spec_for, capsys) -> None:
    result = run_task(spec_for("async_fails"))
    assert (result.outcome, result.error) == (TaskState.FAILED, "KeyError: 'async missing'")
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_an_async_task_past_its_execution_timeout_is_interrupted(spec_for) -> None:
    result = run_task(spec_for("async_slow", deferral_count=0))
    assert result.outcome == TaskState.FAILED and result.timed_out
    assert result.error is not None
    assert result.error.startswith("execution_timeout (0.2s) exceeded after 0.")


def test_an_async_execute_method_is_run(spec_for) -> None:
    result = run_task(spec_for("async_execute"))
    assert result.outcome == TaskState.SUCCESS
    assert deserialize_value(result.return_value) == "async_execute"


def test_an_async_next_method_is_run_on_resumption(spec_for) -> None:
    result = run_task(spec_for("async_resume", next_method="done", next_kwargs=dumps({"event": 7})))
    assert result.outcome == TaskState.SUCCESS
    assert deserialize_value(result.return_value) == {"event": 7}
    bad = run_task(
        spec_for("async_resume", next_method="done", next_kwargs=dumps({"event": "bad"}))
    )
    assert (bad.outcome, bad.error) == (TaskState.FAILED, "ValueError: bad event")


def test_a_missing_task_fails_with_a_clear_error(spec_for) -> None:
    result = run_task(spec_for("nope"))
    assert (
        result.outcome == TaskState.FAILED and result.error is not None and "nope" in result.error
    )


def test_start_trigger_args_are_described_for_the_scheduler() -> None:
    from engine.authoring.baseoperator import BaseOperator
    from engine.authoring.errors import DagDefinitionError
    from engine.dag_processing.parsing import (
        FileParseResult,
        ParsedDag,
        ParsedTask,
        describe_start_trigger,
    )
    from triggers.base import StartTriggerArgs

    class Starts(BaseOperator):
        start_from_trigger = True
        start_trigger_args = StartTriggerArgs(
            trigger_cls="triggers.temporal.DateTimeTrigger",
            trigger_kwargs={"moment": T0},
            next_method="done",
            next_kwargs={"n": 1},
            timeout=timedelta(minutes=2),
        )

    text = describe_start_trigger(Starts(task_id="s"))
    assert text is not None
    document = loads(text)
    assert isinstance(document, dict)
    assert loads_kwargs(document["kwargs"]) == {"moment": T0}
    assert (document["next_method"], loads(document["next_kwargs"])) == ("done", {"n": 1})
    assert (document["classpath"], document["timeout_s"]) == (
        "triggers.temporal.DateTimeTrigger",
        120.0,
    )
    assert describe_start_trigger(BaseOperator(task_id="plain")) is None
    # Stored parse results (without the field) and new ones both load.
    result = FileParseResult(
        "f.py", dags=(ParsedDag("d", tasks=(ParsedTask("s", "m.Op", start_trigger=text),)),)
    )
    assert FileParseResult.from_json(result.to_json()) == result

    class Broken(BaseOperator):
        start_from_trigger = True
        start_trigger_args = StartTriggerArgs(
            trigger_cls="triggers.temporal.DateTimeTrigger", trigger_kwargs={"x": object()}
        )

    with pytest.raises(DagDefinitionError, match="task 'b'"):
        describe_start_trigger(Broken(task_id="b"))
