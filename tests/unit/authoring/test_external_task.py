"""ExternalTaskSensor: its arguments, the logical dates it matches, its deferral (both modes)
and outcomes; ExternalTaskTrigger's decision (``judge``) and its poll loop with a fake
metadata reader."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from engine import DAG, DagDefinitionError, ExternalTaskSensor, TaskDeferred
from engine.authoring.context import DEFAULT_DEFERRABLE_KEY
from engine.authoring.external_task_trigger import (
    ExternalQuery,
    ExternalStates,
    ExternalTaskTrigger,
    StateRules,
    judge,
)
from engine.exceptions import AirflowSkipException
from engine.execution.context import hydrate_context
from engine.sensors import (
    DuplicateStateError,
    ExternalDagFailedError,
    ExternalTaskFailedError,
    ExternalTaskNotFoundError,
)
from triggers.serde import dumps_kwargs, loads_kwargs

D1 = datetime(2026, 3, 1, tzinfo=UTC)
D2 = datetime(2026, 3, 2, tzinfo=UTC)


def context_for(op: Any, *, deferrable: bool = False) -> dict[str, Any]:
    raw = {
        "dag_id": "down",
        "run_id": "r1",
        "task_id": op.task_id,
        "run": {"run_id": "r1", "logical_date": D2},
        DEFAULT_DEFERRABLE_KEY: deferrable,
    }
    return hydrate_context(raw, op)


def deferral_of(op: Any, **kwargs: Any) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as info:
        op.execute(context_for(op, **kwargs))
    return info.value


# --- the sensor ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["poke", "reschedule"])
def test_the_sensor_always_waits_in_the_triggerer(mode: str) -> None:
    with DAG("down"):
        sensor = ExternalTaskSensor(
            task_id="wait",
            external_dag_id="up",
            external_task_id="load",
            failed_states=["failed"],
            mode=mode,
            poke_interval=30,
            timeout=600,
        )
    deferred = deferral_of(sensor)
    assert deferred.classpath == "engine.authoring.external_task_trigger.ExternalTaskTrigger"
    assert deferred.method_name == "execute_complete"
    assert deferred.timeout == timedelta(seconds=600)
    assert deferred.trigger_kwargs == {
        "external_dag_id": "up",
        "logical_dates": [D2],
        "external_task_ids": ["load"],
        "external_task_group_id": None,
        "allowed_states": ["success"],
        "failed_states": ["failed"],
        "skipped_states": [],
        "poke_interval": 30.0,
        "check_existence": False,
    }
    rebuilt = ExternalTaskTrigger(**loads_kwargs(dumps_kwargs(deferred.trigger_kwargs, owner="t")))
    assert rebuilt.serialize() == (deferred.classpath, deferred.trigger_kwargs)


def test_deferrable_uses_poll_interval() -> None:
    with DAG("down"):
        sensor = ExternalTaskSensor(task_id="w", external_dag_id="up", poll_interval=5)
    assert deferral_of(sensor, deferrable=True).trigger_kwargs["poke_interval"] == 5.0
    assert deferral_of(sensor, deferrable=False).trigger_kwargs["poke_interval"] == 60.0


def test_execution_delta_and_execution_date_fn_choose_the_logical_dates() -> None:
    with DAG("down"):
        delta = ExternalTaskSensor(
            task_id="d", external_dag_id="up", execution_delta=timedelta(days=1)
        )
        fn = ExternalTaskSensor(
            task_id="f",
            external_dag_id="up",
            execution_date_fn=lambda logical_date, run_id: [logical_date, D1] if run_id else [],
        )
    assert delta.logical_dates(context_for(delta)) == [D1]
    assert fn.logical_dates(context_for(fn)) == [D2, D1]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"external_task_id": "a", "external_task_ids": ["b"]}, DagDefinitionError, "not both"),
        (
            {"external_task_id": "a", "external_task_group_id": "g"},
            DagDefinitionError,
            "not both",
        ),
        (
            {"execution_delta": timedelta(1), "execution_date_fn": lambda d: d},
            DagDefinitionError,
            "not both",
        ),
        (
            {"allowed_states": ["success"], "failed_states": ["success"]},
            DuplicateStateError,
            "more than one",
        ),
        ({"allowed_states": ["skipped"]}, DagDefinitionError, "not DAG run states"),
        (
            {"external_task_id": "a", "failed_states": ["exploded"]},
            DagDefinitionError,
            "not task states",
        ),
        ({"external_task_ids": ["a", "a"]}, DagDefinitionError, "duplicates"),
    ],
)
def test_arguments_are_checked(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match), DAG("down"):
        ExternalTaskSensor(task_id="w", external_dag_id="up", **kwargs)


@pytest.mark.parametrize(
    ("event", "soft_fail", "outcome"),
    [
        ({"status": "success", "message": "ok"}, False, None),
        ({"status": "skipped", "message": "skipped there"}, False, AirflowSkipException),
        ({"status": "failed", "message": "task 'load' failed"}, False, ExternalTaskFailedError),
        ({"status": "failed", "message": "task 'load' failed"}, True, AirflowSkipException),
        ({"status": "not_found", "message": "no DAG"}, False, ExternalTaskNotFoundError),
    ],
)
def test_what_the_trigger_event_becomes(
    event: dict[str, str], soft_fail: bool, outcome: type | None
) -> None:
    with DAG("down"):
        sensor = ExternalTaskSensor(
            task_id="w", external_dag_id="up", external_task_id="load", soft_fail=soft_fail
        )
    if outcome is None:
        assert sensor.resume_execution("execute_complete", {"event": event}, {}) is None
        return
    with pytest.raises(outcome, match=event["message"]):
        sensor.resume_execution("execute_complete", {"event": event}, {})


def test_a_failed_external_run_is_an_external_dag_failure() -> None:
    with DAG("down"):
        sensor = ExternalTaskSensor(task_id="w", external_dag_id="up", failed_states=["failed"])
    event = {"status": "failed", "message": "DAG 'up' at logical date x is 'failed'"}
    with pytest.raises(ExternalDagFailedError):
        sensor.resume_execution("execute_complete", {"event": event}, {})


# --- the decision ------------------------------------------------------------------------------

RULES = StateRules(
    allowed=frozenset({"success"}), failed=frozenset({"failed"}), skipped=frozenset()
)
TASKS = ExternalQuery("up", (D1, D2), task_ids=("a", "b"))


def states(**by_date: dict[str, str]) -> ExternalStates:
    dates = {"d1": D1, "d2": D2}
    task_states = {dates[k]: v for k, v in by_date.items()}
    return ExternalStates(
        dag_exists=True,
        known_task_ids=frozenset({"a", "b", "g.x", "g.y"}),
        run_states=dict.fromkeys(task_states, "running"),
        task_states=task_states,
    )


def test_judge_waits_until_every_task_succeeded_at_every_date() -> None:
    assert judge(TASKS, states(), RULES) is None
    assert judge(TASKS, states(d1={"a": "success", "b": "success"}), RULES) is None
    done = states(d1={"a": "success", "b": "success"}, d2={"a": "success", "b": "success"})
    verdict = judge(TASKS, done, RULES)
    assert verdict is not None and verdict.status == "success"


def test_judge_fails_naming_the_task_and_the_logical_date() -> None:
    found = states(d1={"a": "success", "b": "success"}, d2={"a": "running", "b": "failed"})
    verdict = judge(TASKS, found, RULES)
    assert verdict is not None and verdict.status == "failed"
    assert "task 'b' of DAG 'up'" in verdict.message
    assert D2.isoformat() in verdict.message and "'failed'" in verdict.message


def test_judge_failed_before_skipped_and_skips() -> None:
    rules = StateRules(
        allowed=frozenset({"success"}), failed=frozenset({"failed"}), skipped=frozenset({"skipped"})
    )
    both = states(d1={"a": "skipped", "b": "failed"})
    assert judge(TASKS, both, rules).status == "failed"  # type: ignore[union-attr]
    skipped = states(d1={"a": "skipped", "b": "success"})
    assert judge(TASKS, skipped, rules).status == "skipped"  # type: ignore[union-attr]


def test_judge_a_task_group_and_a_whole_run() -> None:
    group = ExternalQuery("up", (D1,), task_group_id="g")
    members = frozenset({"g.x", "g.y"})  # what the query finds inside the group

    def at_d1(found: dict[str, str]) -> ExternalStates:
        return ExternalStates(True, members, {D1: "running"}, {D1: found})

    assert judge(group, at_d1({"g.x": "success"}), RULES) is None  # g.y has not run
    verdict = judge(group, at_d1({"g.x": "success", "g.y": "success"}), RULES)
    assert verdict is not None and verdict.status == "success"
    whole = ExternalQuery("up", (D1,))
    finished = ExternalStates(True, frozenset(), {D1: "failed"}, {})
    assert judge(whole, finished, RULES).status == "failed"  # type: ignore[union-attr]
    assert judge(whole, ExternalStates(True, frozenset(), {}, {}), RULES) is None  # no run yet


def test_judge_check_existence() -> None:
    rules = StateRules(frozenset({"success"}), frozenset(), frozenset(), check_existence=True)
    missing_dag = ExternalStates(False, frozenset(), {}, {})
    assert judge(TASKS, missing_dag, rules).status == "not_found"  # type: ignore[union-attr]
    missing_task = ExternalStates(True, frozenset({"a"}), {}, {})
    verdict = judge(TASKS, missing_task, rules)
    assert verdict is not None and verdict.status == "not_found" and "'b'" in verdict.message
    assert (
        judge(TASKS, missing_task, StateRules(frozenset({"success"}), frozenset(), frozenset()))
        is None
    )


# --- the trigger's loop ----------------------------------------------------------------------


class FakeReader:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.queries: list[ExternalQuery] = []

    async def external_states(self, query: ExternalQuery) -> ExternalStates:
        self.queries.append(query)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def test_the_trigger_polls_through_read_errors_until_decided() -> None:
    trigger = ExternalTaskTrigger(
        external_dag_id="up",
        logical_dates=[D1],
        external_task_ids=["a"],
        failed_states=["failed"],
        poke_interval=0.001,
    )
    reader = FakeReader(
        [
            ExternalStates(True, frozenset({"a"}), {D1: "running"}, {D1: {"a": "running"}}),
            OSError("database restarting"),
            ExternalStates(True, frozenset({"a"}), {D1: "failed"}, {D1: {"a": "failed"}}),
        ]
    )
    trigger.attach_metadata(reader)
    with anyio.fail_after(5):
        events = [event async for event in trigger.run()]
    assert len(events) == 1 and events[0].payload["status"] == "failed"
    assert len(reader.queries) == 3 and reader.queries[0].task_ids == ("a",)


async def test_the_trigger_refuses_to_run_without_the_triggerers_reader() -> None:
    trigger = ExternalTaskTrigger(external_dag_id="up", logical_dates=[D1])
    with pytest.raises(RuntimeError, match="runs only in the sluice triggerer"):
        async for _ in trigger.run():
            pass
