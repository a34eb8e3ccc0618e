"""Results between tasks: TaskFlow wiring (``XComArg``), ``ti.xcom_push`` / ``ti.xcom_pull``
in the running task, and the results the task process reports (size limit, unstorable
values, ``multiple_outputs``)."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypedDict

import pytest

from engine import (
    DAG,
    BaseOperator,
    DagDefinitionError,
    EmptyOperator,
    PythonOperator,
    TaskGroup,
    XComArg,
    dag,
    get_current_context,
    task,
)
from engine.authoring.dag import take_registered_dags
from engine.authoring.operators import returns_a_mapping
from engine.authoring.xcom import XComNotFound, iter_references
from engine.execution.context import hydrate_context
from engine.execution.protocol import TaskSpec
from engine.execution.results import RuntimeTaskInstance, collect_results, result_size_error
from engine.execution.task_runner import run_task
from engine.execution.templates import render_template_fields
from engine.executor.task_specs import build_context, with_results
from engine.states import TaskState
from triggers.serde import deserialize_value, dumps, serialize_value

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

AT = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _clean_registry():
    take_registered_dags()
    yield
    take_registered_dags()


def stored(results: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Results as the executor sends them: ``{task_id: {key: tagged JSON}}``."""
    return {
        task_id: {key: serialize_value(value) for key, value in values.items()}
        for task_id, values in results.items()
    }


def context_for(op: BaseOperator, results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    raw = {"dag_id": "flow", "run_id": "r1", "try_number": 1, "xcoms": stored(results)}
    return hydrate_context(raw, op)


def ti_for(results: Mapping[str, Mapping[str, Any]], task_id: str = "me") -> RuntimeTaskInstance:
    with DAG("flow", auto_register=False):
        op = EmptyOperator(task_id=task_id)
    ti = context_for(op, results)["ti"]
    assert isinstance(ti, RuntimeTaskInstance)
    return ti


# --- wiring at definition time ------------------------------------------------------------------


@task
def extract() -> list[int]:
    return [1, 2, 3]


@task
def summarize(values: list[int], *, scale: int = 1) -> dict[str, Any]:
    return {"total": sum(values) * scale, "count": len(values)}


@task
def report(total: int, count: int, whole: Any = None) -> str:
    return f"{total}/{count}"


def nothing() -> None:
    return None


def test_passing_a_task_call_makes_it_upstream_and_passes_its_result() -> None:
    with DAG("flow", auto_register=False) as flow:
        data = extract()
        summary = summarize(data, scale=10)
    assert summary.upstream_task_ids == {"extract"}
    assert data.downstream_task_ids == {"summarize"}
    assert summary.op_args == (XComArg(data),)
    context = context_for(summary, {"extract": {"return_value": [1, 2, 3]}})
    assert summary.execute(context) == {"total": 60, "count": 3}
    assert flow.topological_task_ids() == ["extract", "summarize"]


def test_a_key_of_a_result_and_multiple_outputs() -> None:
    @task(multiple_outputs=True)
    def split() -> Any:
        return {"total": 6, "count": 3}

    with DAG("flow", auto_register=False):
        parts = split()
        final = report(parts["total"], parts["count"], whole=parts)
    assert parts.multiple_outputs is True
    assert final.upstream_task_ids == {"split"}
    assert final.op_args == (XComArg(parts, "total"), XComArg(parts, "count"))
    results = {"split": {"total": 6, "count": 3, "return_value": {"total": 6, "count": 3}}}
    assert final.execute(context_for(final, results)) == "6/3"


class Totals(TypedDict):
    total: int


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (dict, True),
        (dict[str, int], True),
        (Totals, True),
        ("dict[str, int]", True),
        (list[int], False),
        (None, False),
        ("NoSuchName", False),
    ],
)
def test_multiple_outputs_is_inferred_from_a_dict_return_annotation(annotation, expected) -> None:
    def function() -> None:
        return None

    function.__annotations__["return"] = annotation
    assert returns_a_mapping(function) is expected


def test_a_dict_annotated_task_gets_multiple_outputs_unless_told_otherwise() -> None:
    with DAG("flow", auto_register=False):
        inferred = summarize([1])
        told = task(multiple_outputs=False)(summarize.function)()
    assert (inferred.multiple_outputs, told.multiple_outputs) == (True, False)
    assert extract.function is not None and returns_a_mapping(extract.function) is False


def test_references_inside_lists_and_dicts_and_classic_operators() -> None:
    def combine(pair, named, rest):
        return {"pair": pair, "named": named, "rest": rest}

    with DAG("flow", auto_register=False):
        a, b = extract(), extract()
        classic = PythonOperator(task_id="classic", python_callable=lambda: 5)
        op = PythonOperator(
            task_id="combine",
            python_callable=combine,
            op_args=[[a, b]],
            op_kwargs={"named": {"x": classic.output}, "rest": (a["n"], {1, 2})},
        )
    assert op.upstream_task_ids == {"extract", "extract__1", "classic"}
    assert len(list(iter_references((op.op_args, op.op_kwargs)))) == 4
    results = {"extract": {"return_value": 1, "n": 7}, "extract__1": {"return_value": 2}}
    results["classic"] = {"return_value": 5}
    assert op.execute(context_for(op, results)) == {
        "pair": [1, 2],
        "named": {"x": 5},
        "rest": (7, {1, 2}),
    }


class SumIt(BaseOperator):
    """A custom operator taking a result in a template field (Airflow's mapping example)."""

    template_fields = ("values",)

    def __init__(self, values: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.values = values

    def execute(self, context: Any) -> int:
        return sum(self.values)


def test_a_result_in_a_custom_operators_template_field_makes_its_task_upstream() -> None:
    with DAG("flow", auto_register=False):
        numbers = PythonOperator(task_id="numbers", python_callable=lambda: [1, 2])
        plain = SumIt(task_id="plain", values=[3, 4])
        summed = SumIt(task_id="summed", values=numbers.output)
    assert summed.upstream_task_ids == {"numbers"} and plain.upstream_task_ids == set()
    context = context_for(summed, {"numbers": {"return_value": [1, 2]}})
    render_template_fields(summed, context)
    assert summed.execute(context) == 3


def test_an_xcom_arg_links_like_its_task() -> None:
    with DAG("flow", auto_register=False):
        first = EmptyOperator(task_id="first")
        second = EmptyOperator(task_id="second")
        third = EmptyOperator(task_id="third")
        XComArg(first) >> second
        [XComArg(second)] >> XComArg(third)
    assert first.downstream_task_ids == {"second"}
    assert third.upstream_task_ids == {"second"}


def test_a_missing_result_is_none_for_return_value_and_an_error_for_another_key() -> None:
    with DAG("flow", auto_register=False):
        upstream = EmptyOperator(task_id="up")
        plain = report(XComArg(upstream), XComArg(upstream, "count"))
        split = task(multiple_outputs=True, task_id="split")(nothing)()
        uses_split = report(split["a"], 1)
    assert XComArg(upstream).resolve(context_for(plain, {})) is None
    with pytest.raises(XComNotFound, match=r"result 'count' of task 'up' \(DAG 'flow'\)"):
        plain.execute(context_for(plain, {}))
    assert uses_split.execute(context_for(uses_split, {})) == "None/1"  # as Airflow


def test_misuses_of_results_at_definition_time_are_clear() -> None:
    with DAG("flow", auto_register=False):
        data = extract()
        with pytest.raises(TypeError, match="not iterable while the DAG is defined"):
            list(XComArg(data))
        with pytest.raises(TypeError, match="looked up by key"):
            data[0]  # type: ignore[index]
        with TaskGroup("g") as group:
            EmptyOperator(task_id="inner")
        with pytest.raises(DagDefinitionError, match="only a task \\(its result\\)"):
            summarize(group)
    with pytest.raises(TypeError, match="refers to a task"):
        XComArg("extract")  # type: ignore[arg-type]
    with pytest.raises(DagDefinitionError, match="multiple_outputs must be bool"):
        PythonOperator(task_id="x", python_callable=print, multiple_outputs="yes")  # type: ignore[arg-type]


def test_xcom_arg_equality_repr_and_template_text() -> None:
    with DAG("flow", auto_register=False):
        data = extract()
    assert XComArg(data) == data.output and XComArg(data, "k") == data["k"]
    assert len({XComArg(data), data.output, data["k"]}) == 2
    assert repr(data["k"]) == "XComArg(<Task(PythonOperator): extract>, 'k')"
    assert str(data.output) == (
        "{{ task_instance.xcom_pull(task_ids='extract', dag_id='flow', key='return_value') }}"
    )


def test_a_dag_param_and_a_result_in_one_call() -> None:
    @dag(schedule=None, auto_register=False)
    def with_params(scale: int = 3) -> None:
        summarize(extract(), scale=scale)

    built = with_params()
    op = built.get_task("summarize")
    assert op.upstream_task_ids == {"extract"}
    context = context_for(op, {"extract": {"return_value": [2]}})
    assert op.execute(context) == {"total": 6, "count": 1}


# --- ti.xcom_pull / ti.xcom_push ----------------------------------------------------------------


def test_xcom_pull_follows_airflow_3() -> None:
    ti = ti_for({"a": {"return_value": {"n": 1}, "k": AT}, "b": {"return_value": [1]}})
    assert ti.xcom_pull(task_ids="a") == {"n": 1}
    assert ti.xcom_pull("a", key="k") == AT  # tagged values come back typed
    assert ti.xcom_pull(task_ids=["a", "b", "c"]) == [{"n": 1}, [1], None]
    assert ti.xcom_pull(task_ids=["a", "c"], default="-") == [{"n": 1}, "-"]
    assert ti.xcom_pull(task_ids="c", default=0) == 0
    assert ti.xcom_pull(task_ids="a", dag_id="flow", map_indexes=-1) == {"n": 1}
    assert ti.xcom_pull(task_ids="a", map_indexes=[-1, 0]) == [{"n": 1}, None]
    assert ti.xcom_pull(task_ids="a", map_indexes=0) is None  # no mapped tasks yet
    assert ti.xcom_pull() is None  # task_ids=None: this task, which pushed nothing yet
    pulled = ti.xcom_pull(task_ids="a")
    pulled["n"] = 2
    assert ti.xcom_pull(task_ids="a") == {"n": 1}  # each pull is a fresh copy


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"task_ids": "a", "dag_id": "other"}, RuntimeError, "from DAG 'other' run 'r1' needs"),
        ({"task_ids": "a", "run_id": "r0"}, RuntimeError, "from DAG 'flow' run 'r0' needs"),
        ({"task_ids": "a", "include_prior_dates": True}, RuntimeError, "engine's task process"),
        ({"task_ids": "a", "key": None}, TypeError, "key must be a str"),
        ({"task_ids": [1]}, TypeError, "task ids are str"),
        ({"task_ids": {"a": 1}}, TypeError, "task_ids must be one value or a list"),
    ],
)
def test_xcom_pull_refuses_what_it_cannot_answer(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        ti_for({"a": {"return_value": 1}}).xcom_pull(**kwargs)


def test_xcom_push_keeps_storable_values_for_the_success_and_for_own_pulls() -> None:
    ti = ti_for({})
    ti.xcom_push("when", AT)
    ti.xcom_push("rows", [1, 2])
    assert ti.pushed == {"when": serialize_value(AT), "rows": [1, 2]}
    assert ti.xcom_pull(key="when") == AT and ti.xcom_pull("me", key="rows") == [1, 2]
    assert "pushed=['rows', 'when']" in repr(ti)
    with pytest.raises(TypeError, match="task 'me': its result 'obj' of type object cannot be"):
        ti.xcom_push("obj", object())
    with pytest.raises(TypeError, match="non-empty str"):
        ti.xcom_push("", 1)
    assert set(ti.pushed) == {"when", "rows"}


def test_a_malformed_results_context_is_refused() -> None:
    with DAG("flow", auto_register=False):
        op = EmptyOperator(task_id="me")
    with pytest.raises(TypeError, match="must map task ids"):
        hydrate_context({"xcoms": {"a": 1}}, op)


# --- the results the task process reports ----------------------------------------------------


def test_collect_results_pushed_then_outputs_then_return_value() -> None:
    with DAG("flow", auto_register=False):
        op = task(multiple_outputs=True, task_id="split")(nothing)()
        quiet = PythonOperator(task_id="quiet", python_callable=print, do_xcom_push=False)
    context = context_for(op, {})
    context["ti"].xcom_push("total", "pushed")
    context["ti"].xcom_push("extra", 1)
    results = collect_results(context, op, {"total": 6, "at": AT}, max_bytes=None)
    assert {k: deserialize_value(v) for k, v in results.items()} == {
        "extra": 1,
        "total": 6,
        "at": AT,
        "return_value": {"total": 6, "at": AT},
    }
    assert collect_results(context_for(op, {}), op, None, max_bytes=None) == {}
    assert collect_results(context_for(quiet, {}), quiet, {"big": 1}, max_bytes=1) == {}
    with pytest.raises(TypeError, match=r"multiple_outputs=True: .* got list"):
        collect_results(context, op, [1], max_bytes=None)
    with pytest.raises(TypeError, match=r"with keys \[1\]"):
        collect_results(context, op, {1: "a"}, max_bytes=None)


def test_the_size_limit_counts_the_stored_json_of_each_result() -> None:
    with DAG("flow", auto_register=False):
        op = EmptyOperator(task_id="big")
    value = "x" * 100
    size = len(json.dumps(value))  # 102: the quotes count
    assert collect_results(context_for(op, {}), op, value, max_bytes=size)
    with pytest.raises(ValueError, match="max_xcom_size_bytes = 101") as info:
        collect_results(context_for(op, {}), op, value, max_bytes=size - 1)
    assert str(info.value) == result_size_error("big", "return_value", 102, 101)
    assert "task 'big': its return value is 102 bytes of JSON" in str(info.value)


DAG_FILE = """
from engine import DAG, PythonOperator, task


@task
def opaque():
    return object()


@task
def big():
    return "x" * 5000


@task(multiple_outputs=True)
def parts():
    return {"a": 1, "b": [2]}


@task(multiple_outputs=True)
def not_a_dict():
    return [1]


@task
def uses(a, b, whole):
    return {"a": a, "b": b, "whole": whole}


def pushes(ti):
    ti.xcom_push("note", "hello")
    return ti.xcom_pull(task_ids="parts", key="b")


def deep_inside():
    from engine import get_current_context

    context = get_current_context()
    return [context["ti"].task_id, context["run_id"]]


@task
def current():
    return deep_inside()


with DAG("unit_results"):
    current()
    opaque()
    big()
    p = parts()
    not_a_dict()
    uses(p["a"], p["b"], p)
    PythonOperator(task_id="pushes", python_callable=pushes)
"""


@pytest.fixture
def run_in_process(tmp_path: Path):
    dag_file = tmp_path / "results_dag.py"
    dag_file.write_text(textwrap.dedent(DAG_FILE))

    def run(task_id: str, results: Mapping[str, Mapping[str, Any]] | None = None, **kw: Any):
        context = build_context(
            dag_id="unit_results",
            run_id="r",
            task_id=task_id,
            try_number=1,
            events=[],
            default_deferrable=False,
        )
        spec = TaskSpec(
            ti_id=1,
            dag_id="unit_results",
            run_id="r",
            task_id=task_id,
            fileloc=str(dag_file),
            try_number=1,
            try_started_at=datetime.now(UTC).isoformat(),
            context=dumps(context),
        )
        spec = with_results(spec, stored(results or {}), max_bytes=kw.get("max_bytes", 1000))
        return run_task(TaskSpec.from_json(spec.to_json()))

    return run


def test_an_unstorable_return_value_fails_the_try_naming_task_and_type(run_in_process) -> None:
    result = run_in_process("opaque")
    assert result.outcome == TaskState.FAILED and not result.xcoms
    assert result.error is not None
    assert result.error.startswith("TypeError: task 'opaque': its return value of type object")
    assert "not serializable" in result.error


def test_a_result_over_the_limit_fails_the_try(run_in_process) -> None:
    result = run_in_process("big")
    assert result.outcome == TaskState.FAILED and result.error is not None
    assert "task 'big': its return value is 5,002 bytes of JSON" in result.error
    assert run_in_process("big", max_bytes=None).outcome == TaskState.SUCCESS


def test_multiple_outputs_and_pushes_are_reported_with_the_success(run_in_process) -> None:
    result = run_in_process("parts")
    assert result.outcome == TaskState.SUCCESS and result.has_return_value
    assert result.xcoms == {"a": 1, "b": [2], "return_value": {"a": 1, "b": [2]}}
    assert result.return_value == {"a": 1, "b": [2]}
    bad = run_in_process("not_a_dict")
    assert (
        bad.outcome == TaskState.FAILED
        and bad.error is not None
        and "must return a dict" in bad.error
    )
    pushed = run_in_process("pushes", {"parts": result.xcoms})
    assert pushed.outcome == TaskState.SUCCESS
    assert pushed.xcoms == {"note": "hello", "return_value": [2]}


def test_a_taskflow_task_gets_its_upstream_results(run_in_process) -> None:
    upstream = {"parts": {"a": 1, "b": [2], "return_value": {"a": 1, "b": [2]}}}
    result = run_in_process("uses", upstream)
    assert result.outcome == TaskState.SUCCESS
    assert deserialize_value(result.return_value) == {"a": 1, "b": [2], "whole": {"a": 1, "b": [2]}}
    missing = run_in_process("uses", {})  # upstream stored nothing: its keys are missing
    assert missing.outcome == TaskState.SUCCESS  # multiple_outputs upstream: None, as in Airflow
    assert deserialize_value(missing.return_value) == {"a": None, "b": None, "whole": None}


def test_with_results_travels_in_the_spec() -> None:
    spec = TaskSpec(1, "d", "r", "t", "f.py", 1, AT.isoformat(), "{}")
    assert with_results(spec, {}, max_bytes=10).xcoms is None
    carried = with_results(spec, stored({"a": {"return_value": AT}}), max_bytes=10)
    again = TaskSpec.from_json(carried.to_json())
    assert again.max_xcom_size_bytes == 10 and again.xcoms is not None
    assert deserialize_value(json.loads(again.xcoms)["a"]["return_value"]) == AT


def test_get_current_context_gives_the_running_tasks_context(run_in_process) -> None:
    result = run_in_process("current")
    assert result.outcome == TaskState.SUCCESS and result.xcoms == {
        "return_value": ["current", "r"]
    }
    with pytest.raises(RuntimeError, match="outside a running task"):
        get_current_context()


class FakeReader:
    """The executor's answers to ``pull_results`` requests, recorded."""

    def __init__(self, answers: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        self.answers = answers
        self.asked: list[dict[str, Any]] = []

    def pull_results(self, **fields: Any) -> dict[str, Any] | None:
        self.asked.append(fields)
        return self.answers.get((fields["dag_id"], fields["run_id"], fields["task_id"]))


def test_xcom_pull_from_another_dag_or_run_asks_the_executor(monkeypatch) -> None:
    from engine.execution import remote_results

    reader = FakeReader(
        {
            ("other", "r1", "a"): {"run_id": "r1", "mapped": False, "stored": [stored_one(5)]},
            ("flow", "r0", "a"): {"run_id": "r0", "mapped": False, "stored": [stored_one(AT)]},
            ("flow", "r0", "m"): {
                "run_id": "r0",
                "mapped": True,
                "stored": [stored_one(1), {}, stored_one(3)],
            },
        }
    )
    monkeypatch.setattr(remote_results, "_reader", reader)
    ti = ti_for({"a": {"return_value": "here"}})
    assert ti.xcom_pull(task_ids="a", dag_id="other") == 5  # run_id defaults to this run's
    assert ti.xcom_pull(task_ids="a", run_id="r0") == AT
    assert ti.xcom_pull(task_ids="m", run_id="r0") == [1, 3]  # every copy that stored it
    assert ti.xcom_pull(task_ids=["a", "gone"], run_id="r0", default="-") == [AT, "-"]
    assert ti.xcom_pull(task_ids="a", key="nope", run_id="r0", default=0) == 0
    assert ti.xcom_pull(task_ids="a", include_prior_dates=True) is None
    assert reader.asked[-1] == {
        "dag_id": "flow",
        "run_id": "r1",
        "task_id": "a",
        "map_index": None,
        "include_prior_dates": True,
        "key": "return_value",
    }
    assert ti.xcom_pull(task_ids="a") == "here"  # this run's: no request
    assert len(reader.asked) == 7


def stored_one(value: Any) -> dict[str, Any]:
    return {"return_value": serialize_value(value)}
