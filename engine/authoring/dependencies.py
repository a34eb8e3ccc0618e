"""What ``>>`` links: ``DependencyMixin`` (tasks, task groups, task results) and the task node.

``a >> b`` links the leaves of ``a`` to the roots of ``b``: a task is its own root and leaf,
a task group's are its tasks without upstream / downstream task inside the group, a task's
result (``XComArg``) is its task. Linking two tasks records the edge on both and attaches
both to the DAG of either.

``AbstractOperator`` is what every task is (``BaseOperator`` and its mapped form): the node
``>>`` links and a task result refers to. The modules that build on tasks (results, default
arguments) name it instead of ``BaseOperator``, which builds on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.authoring.dag import DAG


class DependencyMixin:
    """Something ``>>`` links: a task, or a task group (through its roots and leaves)."""

    @property
    def roots(self) -> list[AbstractOperator]:
        """The tasks an upstream node links to."""
        raise NotImplementedError

    @property
    def leaves(self) -> list[AbstractOperator]:
        """The tasks that link to a downstream node."""
        raise NotImplementedError

    def set_downstream(self, other: DependencyMixin | Sequence[DependencyMixin]) -> None:
        for node in _nodes(other):
            node.follow(self)

    def set_upstream(self, other: DependencyMixin | Sequence[DependencyMixin]) -> None:
        for node in _nodes(other):
            self.follow(node)

    def follow(self, upstream: DependencyMixin) -> None:
        """Come after ``upstream``: its leaves link to this node's roots (an edge modifier,
        ``engine.authoring.edges.Label``, overrides both ``follow`` and ``lead``)."""
        upstream.lead(self)

    def lead(self, downstream: DependencyMixin) -> None:
        """Come before ``downstream``: link this node's leaves to its roots."""
        targets = downstream.roots
        for leaf in self.leaves:
            for root in targets:
                link(leaf, root)

    def __rshift__(self, other: Any) -> Any:
        self.set_downstream(other)
        return other

    def __lshift__(self, other: Any) -> Any:
        self.set_upstream(other)
        return other

    def __rrshift__(self, other: Any) -> Any:
        self.set_upstream(other)  # [a, b] >> self
        return self

    def __rlshift__(self, other: Any) -> Any:
        self.set_downstream(other)  # [a, b] << self
        return self


class AbstractOperator(DependencyMixin):
    """A task as ``>>`` and task results see it: its id, its DAG and its edges."""

    task_id: str
    dag: DAG | None
    upstream_task_ids: set[str]
    downstream_task_ids: set[str]

    @property
    def roots(self) -> list[AbstractOperator]:
        return [self]

    @property
    def leaves(self) -> list[AbstractOperator]:
        return [self]

    def _attach(self, dag: DAG) -> None:
        """Join ``dag`` (``BaseOperator``)."""
        raise NotImplementedError


def _nodes(value: object) -> list[DependencyMixin]:
    items: list[object] = list(value) if isinstance(value, list | tuple | set) else [value]
    for item in items:
        if not isinstance(item, DependencyMixin):
            raise DagDefinitionError(
                f"{caller_location()}: dependencies link tasks and task groups, got {item!r}; "
                "use operators, task groups or the result of calling a @task function"
            )
    return items  # type: ignore[return-value]  # checked above


def link(upstream: AbstractOperator, downstream: AbstractOperator) -> None:
    """The edge ``upstream >> downstream`` between two tasks, both attached to a DAG."""
    if upstream is downstream:
        raise DagDefinitionError(f"task {upstream.task_id!r} cannot depend on itself")
    dag = upstream.dag or downstream.dag
    if dag is None:
        raise DagDefinitionError(
            f"cannot link {upstream.task_id!r} >> {downstream.task_id!r}: neither belongs to a "
            "DAG; create them inside `with DAG(...)` or pass dag="
        )
    upstream._attach(dag)
    downstream._attach(dag)
    upstream.downstream_task_ids.add(downstream.task_id)
    downstream.upstream_task_ids.add(upstream.task_id)
