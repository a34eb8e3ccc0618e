"""Task groups, ``@task_group``, ``chain`` and ``cross_downstream``: ids and edges."""

from __future__ import annotations

from typing import Any

import pytest

from engine import DAG, BaseOperator, DagDefinitionError, TaskGroup, chain, cross_downstream, task
from engine import task_group as task_group_decorator
from engine.authoring.dag import take_registered_dags


class Noop(BaseOperator):
    def execute(self, context: dict[str, Any]) -> None:
        return None


@pytest.fixture(autouse=True)
def _clean_registry():
    take_registered_dags()
    yield
    take_registered_dags()


def edges(dag: DAG) -> set[tuple[str, str]]:
    return {(t.task_id, down) for t in dag.tasks for down in t.downstream_task_ids}


def test_group_ids_are_prefixed_and_nested() -> None:
    with DAG("g", auto_register=False) as dag:
        with TaskGroup("outer") as outer:
            first = Noop(task_id="first")
            with TaskGroup("inner") as inner:
                deep = Noop(task_id="deep")
            with TaskGroup("flat", prefix_group_id=False):
                flat = Noop(task_id="flat_task")
        after = Noop(task_id="after")
    assert (first.task_id, deep.task_id, flat.task_id) == (
        "outer.first",
        "outer.inner.deep",
        "flat_task",
    )
    assert (first.label, inner.group_id, after.task_id) == ("first", "outer.inner", "after")
    assert deep.task_group is inner and after.task_group is None
    assert set(dag.task_group_dict) == {"outer", "outer.inner", "outer.flat"}
    assert [t.task_id for t in outer] == ["outer.first", "outer.inner.deep", "flat_task"]


def test_group_dependencies_link_leaves_and_roots() -> None:
    with DAG("deps", auto_register=False) as dag:
        start, end = Noop(task_id="start"), Noop(task_id="end")
        with TaskGroup("work") as work:
            a, b, c = Noop(task_id="a"), Noop(task_id="b"), Noop(task_id="c")
            a >> [b, c]
        with TaskGroup("check") as check:
            Noop(task_id="x")
            Noop(task_id="y")
        start >> work >> check >> end
    assert (work.roots, work.leaves) == ([a], [b, c])
    assert edges(dag) == {
        ("start", "work.a"),
        ("work.a", "work.b"),
        ("work.a", "work.c"),
        ("work.b", "check.x"),
        ("work.b", "check.y"),
        ("work.c", "check.x"),
        ("work.c", "check.y"),
        ("check.x", "end"),
        ("check.y", "end"),
    }
    assert dag.topological_task_ids()[0] == "start"


def test_lists_with_groups_and_reverse_operators() -> None:
    with DAG("rev", auto_register=False) as dag:
        start, end = Noop(task_id="start"), Noop(task_id="end")
        with TaskGroup("g") as group:
            Noop(task_id="t")
        [start] >> group
        end << group
    assert edges(dag) == {("start", "g.t"), ("g.t", "end")}


def test_group_default_args_apply_over_the_dags() -> None:
    with DAG("da", default_args={"retries": 1, "owner": "dag"}, auto_register=False):
        with TaskGroup("g", default_args={"retries": 4}):
            inside = Noop(task_id="inside")
            with TaskGroup("nested", default_args={"owner": "nested"}):
                nested = Noop(task_id="nested")
        outside = Noop(task_id="outside")
    assert (inside.retries, inside.owner) == (4, "dag")
    assert (nested.retries, nested.owner) == (4, "nested")
    assert (outside.retries, outside.owner) == (1, "dag")


def test_task_group_decorator_suffixes_and_forwards_the_return_value() -> None:
    @task
    def step() -> None:
        return None

    @task_group_decorator
    def section() -> None:
        """Section tooltip."""
        step() >> step()

    @task_group_decorator(group_id="ret")
    def returning() -> Any:
        return step()

    with DAG("tgd", auto_register=False) as dag:
        first = section()
        second = section()
        last = returning()
        first >> second >> last
    assert isinstance(first, TaskGroup) and first.tooltip == "Section tooltip."
    assert (first.group_id, second.group_id) == ("section", "section__1")
    assert dag.task_ids == [
        "section.step",
        "section.step__1",
        "section__1.step",
        "section__1.step__1",
        "ret.step",
    ]
    assert isinstance(last, BaseOperator) and last.task_id == "ret.step"
    assert ("section.step__1", "section__1.step") in edges(dag)
    assert ("section__1.step__1", "ret.step") in edges(dag)


def test_group_errors() -> None:
    with pytest.raises(DagDefinitionError, match="belongs to a DAG"):
        TaskGroup("alone")
    with DAG("dup", auto_register=False):
        TaskGroup("g")
        with pytest.raises(DagDefinitionError, match="already has a task or task group 'g'"):
            TaskGroup("g")
        Noop(task_id="t")
        with pytest.raises(DagDefinitionError, match="already has a task or task group 't'"):
            TaskGroup("t")
        with pytest.raises(DagDefinitionError, match="already has a task group 'g'"):
            Noop(task_id="g")
        with pytest.raises(DagDefinitionError, match="group_id"):
            TaskGroup("bad id")


def test_chain() -> None:
    with DAG("chain", auto_register=False) as dag:
        a, b, c, d, e, f = (Noop(task_id=n) for n in "abcdef")
        chain(a, [b, c], [d, e], f)
    assert edges(dag) == {
        ("a", "b"),
        ("a", "c"),
        ("b", "d"),
        ("c", "e"),
        ("d", "f"),
        ("e", "f"),
    }


def test_chain_with_groups_and_its_errors() -> None:
    with DAG("chain_groups", auto_register=False) as dag:
        a, z = Noop(task_id="a"), Noop(task_id="z")
        with TaskGroup("g") as group:
            Noop(task_id="x") >> Noop(task_id="y")
        chain(a, group, z)
        with pytest.raises(DagDefinitionError, match="same length; got 2 and 1"):
            chain([a, z], [Noop(task_id="q")])
        with pytest.raises(DagDefinitionError, match="links tasks"):
            chain(a, "b")  # type: ignore[arg-type]
    assert {("a", "g.x"), ("g.x", "g.y"), ("g.y", "z")} <= edges(dag)


def test_cross_downstream() -> None:
    with DAG("cross", auto_register=False) as dag:
        a, b, c, d = (Noop(task_id=n) for n in "abcd")
        cross_downstream([a, b], [c, d])
    assert edges(dag) == {("a", "c"), ("a", "d"), ("b", "c"), ("b", "d")}


def test_a_group_is_not_a_task_argument() -> None:
    @task
    def consumer(value: object) -> None:
        return None

    with DAG("arg", auto_register=False), TaskGroup("g") as group:
        with pytest.raises(DagDefinitionError, match=r"only a task \(its result\)"):
            consumer(group)


def test_groups_and_tasks_given_explicitly_without_with_blocks() -> None:
    dag = DAG("explicit", auto_register=False)
    group = TaskGroup("g", dag=dag, default_args={"retries": 2})
    inner = TaskGroup("inner", parent_group=group)
    placed = Noop(task_id="t", task_group=inner)
    assert (placed.task_id, placed.dag, placed.retries) == ("g.inner.t", dag, 2)
    assert list(group) == [placed]
    with pytest.raises(DagDefinitionError, match="task_group must be a TaskGroup"):
        Noop(task_id="u", task_group="g")  # type: ignore[arg-type]
