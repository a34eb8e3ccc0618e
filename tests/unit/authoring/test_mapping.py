"""Dynamic task mapping at definition time (``partial`` / ``expand`` / ``expand_kwargs``),
the slice of arguments each copy gets, how many copies the scheduler makes, and the errors
for what cannot be mapped."""

from __future__ import annotations

from typing import Any

import pytest

from engine import DAG, BashOperator, PythonOperator, task
from engine.advancing.rules import next_task_states, run_outcome, summary_state
from engine.authoring.baseoperator import MappedOperator
from engine.authoring.errors import DagDefinitionError
from engine.authoring.mapping import (
    MAX_MAP_LENGTH,
    UnmappableXComLengthPushed,
    UnmappableXComTypePushed,
    XComForMappingNotPushed,
    cross_product_order,
    describe_mapping,
    map_length,
)
from engine.authoring.params import NOTSET
from engine.execution.results import RuntimeTaskInstance, check_mappable_result


@task
def numbers() -> list[int]:
    return [1, 2, 3]


@task
def add(x: int, y: int) -> int:
    return x + y


@task
def total(values: list[int]) -> int:
    return sum(values)


def _context(task: Any, map_index: int, results: dict[str, Any] | None = None) -> dict[str, Any]:
    ti = RuntimeTaskInstance(
        dag_id="d",
        task_id=task.task_id,
        run_id="r",
        try_number=1,
        map_index=map_index,
        task=task,
        results=results,
    )
    return {"ti": ti, "map_index": map_index}


def test_expand_on_a_task_adds_one_mapped_task_upstream_of_its_reducer() -> None:
    with DAG("d") as dag:
        source = numbers()
        mapped = add.partial(y=10).expand(x=source)
        reduced = total(mapped)
    assert isinstance(mapped, MappedOperator)
    assert dag.task_ids == ["numbers", "add", "total"]
    assert mapped.upstream_task_ids == {"numbers"}
    assert reduced.upstream_task_ids == {"add"}
    assert mapped.mapping_json() == {
        "kind": "expand",
        "args": [{"name": "x", "task_id": "numbers", "key": "return_value"}],
    }
    assert mapped.operator_classpath == "engine.authoring.operators.PythonOperator"


def test_several_arguments_map_over_their_cross_product_last_fastest() -> None:
    with DAG("d"):
        mapped = add.expand(x=[1, 2], y=[10, 20, 30])
    kwargs = [mapped.mapped_kwargs(_context(mapped, i), i) for i in range(6)]
    assert [(k["x"], k["y"]) for k in kwargs] == cross_product_order([1, 2], [10, 20, 30])
    assert map_length(mapped.mapping_json(), lambda *_: NOTSET, task_id="add") == 6


def test_a_dict_maps_over_its_items_and_expand_kwargs_over_whole_argument_sets() -> None:
    with DAG("d"):
        by_item = add.partial(y=0).expand(x={"a": 1, "b": 2})
        by_kwargs = add.expand_kwargs([{"x": 1, "y": 2}, {"x": 3, "y": 4}])
    assert by_item.mapped_kwargs(_context(by_item, 1), 1) == {"x": ("b", 2)}
    assert by_kwargs.mapped_kwargs(_context(by_kwargs, 1), 1) == {"x": 3, "y": 4}
    assert by_kwargs.mapping_json() == {"kind": "expand_kwargs", "source": {"literal": 2}}


def test_an_upstream_result_is_sliced_per_copy() -> None:
    with DAG("d"):
        mapped = add.partial(y=1).expand(x=numbers())
    results = {"numbers": {"return_value": [5, 6, 7]}}
    operator = mapped.unmap(_context(mapped, 2, results))
    assert isinstance(operator, PythonOperator)
    assert operator.op_kwargs == {"y": 1, "x": 7}
    assert operator.task_id == "add" and operator.dag is mapped.dag


def test_a_classic_operator_maps_and_keeps_its_partial_arguments() -> None:
    with DAG("d", default_args={"retries": 3}):
        mapped = BashOperator.partial(task_id="echo", env={"A": "1"}).expand(
            bash_command=["echo a", "echo b"]
        )
    assert mapped.retries == 3  # default_args reach the mapped task
    copy = mapped.unmap({"map_index": 1})
    assert isinstance(copy, BashOperator)
    assert (copy.bash_command, copy.env, copy.retries) == ("echo b", {"A": "1"}, 3)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: add.partial(x=1).expand(x=[1]), "given to both partial() and expand()"),
        (lambda: add.expand(z=[1]), "has no parameter 'z'"),
        (lambda: add.expand(x=3), "must be a list, a dict or a task's result"),
        (lambda: add.expand(), "at least one argument"),
        (lambda: add.expand(x=numbers()["key"]), "only a task's return value"),
        (lambda: add.expand_kwargs([1, 2]), "items must be dicts"),
        (lambda: add.expand_kwargs("x"), "takes a list of dicts"),
        (
            lambda: BashOperator.partial(task_id="b").expand(retries=[1]),
            "cannot map over 'retries'",
        ),
        (lambda: BashOperator.partial(task_id="b").expand(nope=[1]), "no argument 'nope'"),
        (lambda: BashOperator.partial(task_id="b", bogus=1), "unknown argument(s) ['bogus']"),
        (lambda: BashOperator.partial(bash_command="x"), "needs task_id="),
    ],
)
def test_wrong_uses_are_refused_with_a_clear_message(build: Any, message: str) -> None:
    with DAG("d"), pytest.raises(DagDefinitionError, match=r"test_mapping\.py") as raised:
        build()
    assert message in str(raised.value)


def test_a_partial_expands_once() -> None:
    with DAG("d"):
        fixed = add.partial(y=1)
        fixed.expand(x=[1])
        with pytest.raises(DagDefinitionError, match="already expanded"):
            fixed.expand(x=[2])


def test_map_length_checks_what_it_maps_over() -> None:
    mapping = {"kind": "expand", "args": [{"name": "x", "task_id": "up", "key": "return_value"}]}
    assert map_length(mapping, lambda *_: [1, 2], task_id="m") == 2
    assert map_length(mapping, lambda *_: {}, task_id="m") == 0
    with pytest.raises(UnmappableXComTypePushed, match="returned int"):
        map_length(mapping, lambda *_: 5, task_id="m")
    with pytest.raises(XComForMappingNotPushed, match="stored no result"):
        map_length(mapping, lambda *_: NOTSET, task_id="m")
    with pytest.raises(UnmappableXComLengthPushed, match="more than the limit"):
        map_length(mapping, lambda *_: list(range(MAX_MAP_LENGTH + 1)), task_id="m")


def test_a_task_whose_result_is_mapped_over_must_return_a_list_or_dict() -> None:
    with DAG("d"):
        source = numbers()
        add.partial(y=1).expand(x=source)
        other = numbers()
    check_mappable_result(source, [1])
    check_mappable_result(other, 5)  # nothing maps over it
    with pytest.raises(UnmappableXComTypePushed, match="'numbers' returned int"):
        check_mappable_result(source, 5)
    with pytest.raises(XComForMappingNotPushed):
        check_mappable_result(source, None)


def test_xcom_pull_reads_every_copy_or_one_by_map_index() -> None:
    with DAG("d"):
        reducer = total([])
    ti = RuntimeTaskInstance(
        dag_id="d",
        task_id=reducer.task_id,
        run_id="r",
        try_number=1,
        map_index=-1,
        task=reducer,
        mapped_results={"m": {1: {"return_value": 20}, 0: {"return_value": 10}}},
    )
    assert ti.xcom_pull(task_ids="m") == [10, 20]
    assert ti.xcom_pull(task_ids="m", map_indexes=1) == 20
    assert ti.xcom_pull(task_ids="m", map_indexes=[1, 0]) == [20, 10]
    assert ti.xcom_pull(task_ids="m", map_indexes=5, default="-") == "-"


def test_trigger_rules_count_every_copy_of_a_mapped_upstream() -> None:
    downstream = {"m": ["after", "any"], "after": [], "any": []}
    rules = {"any": "one_success"}
    states = {"m": summary_state(["success", "running"]), "after": "none", "any": "none"}
    changes = next_task_states(downstream, states, rules, {"m": ["success", "running"]})
    assert changes == {"any": "scheduled"}
    copies = ["success", "failed", "success"]
    states["m"] = summary_state(copies)
    changes = next_task_states(downstream, states, rules, {"m": copies})
    assert changes == {"after": "upstream_failed", "any": "scheduled"}
    assert run_outcome({**states, **changes, "any": "success"}, downstream) == "failed"
    assert summary_state(["skipped", "skipped"]) == "skipped"


def test_map_and_zip_transform_what_a_task_maps_over() -> None:
    with DAG("d"):
        source, other = numbers(), numbers()
        mapped = add.partial(y=0).expand(x=source.map(lambda v: v * 2))
        zipped = add.expand_kwargs(source.zip(other).map(lambda p: {"x": p[0], "y": p[1]}))
        longest = add.partial(y=0).expand(x=source.zip(other, fillvalue=0))
    assert zipped.upstream_task_ids == {"numbers", "numbers__1"}
    results = {"numbers": {"return_value": [1, 2, 3]}, "numbers__1": {"return_value": [7]}}
    assert mapped.mapped_kwargs(_context(mapped, 2, results), 2) == {"x": 6}
    assert zipped.mapped_kwargs(_context(zipped, 0, results), 0) == {"x": 1, "y": 7}
    values = {"numbers": [1, 2, 3], "numbers__1": [7]}

    def value_of(task_id: str, key: str) -> Any:
        return values[task_id]

    assert map_length(mapped.mapping_json(), value_of, task_id="add") == 3
    assert map_length(zipped.mapping_json(), value_of, task_id="add") == 1
    assert map_length(longest.mapping_json(), value_of, task_id="add") == 3
    assert longest.mapped_kwargs(_context(longest, 2, results), 2) == {"x": (3, 0)}


def test_a_mapping_is_described_for_people() -> None:
    with DAG("d"):
        crossed = add.expand(x=numbers(), y=[1, 2, 3])
        by_kwargs = add.expand_kwargs(numbers().zip(numbers()))
    assert describe_mapping(crossed.mapping_json()) == "x <- numbers, y [3]"
    assert describe_mapping(by_kwargs.mapping_json()) == "kwargs <- zip(numbers__1, numbers__2)"
