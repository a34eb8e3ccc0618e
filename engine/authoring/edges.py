"""What an edge carries, and ``chain_linear``: Airflow's ``EdgeModifier`` / ``Label``.

A ``Label`` between two nodes of ``>>`` names the edges it sits on (shown by ``sluice dags
show`` and the REST API's DAG details)::

    check >> Label("valid") >> load
    check >> Label("invalid") >> [alert, quarantine]
    [extract_a, extract_b] >> Label("raw rows") >> transform

Each edge from a leaf of the left side to a root of the right side is linked and gets the
label (stored with the DAG's task rows: ``dag_task.edge_labels``). A label names edges only:
it is no task and runs nothing.

``chain_linear(a, [b, c], [d, e])`` links every task of each element to every task of the
next one (``a >> [b, c]``, ``b >> [d, e]``, ``c >> [d, e]``), where ``chain`` would link two
adjacent lists pairwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.authoring.dependencies import AbstractOperator, DependencyMixin, link
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location

if TYPE_CHECKING:
    from collections.abc import Sequence


class EdgeModifier(DependencyMixin):
    """Sits between the two sides of ``>>`` and changes the edges it links (Airflow's).

    It collects the leaves of what comes before it and the roots of what comes after it,
    and links each pair as it learns it (``a >> modifier >> b``, ``b << modifier << a`` and
    lists on either side alike), attaching ``{"label": label}`` to the edge when it has a
    label.
    """

    def __init__(self, label: str | None = None) -> None:
        if label is not None and not isinstance(label, str):
            raise DagDefinitionError(f"{caller_location()}: a label must be a str, got {label!r}")
        self.label = label
        self._upstream: list[AbstractOperator] = []
        self._downstream: list[AbstractOperator] = []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label!r}>"

    @property
    def roots(self) -> list[AbstractOperator]:
        return list(self._downstream)

    @property
    def leaves(self) -> list[AbstractOperator]:
        return list(self._upstream)

    def follow(self, upstream: DependencyMixin) -> None:
        if isinstance(upstream, EdgeModifier):
            raise DagDefinitionError(f"{caller_location()}: two labels cannot follow each other")
        new = [leaf for leaf in upstream.leaves if leaf not in self._upstream]
        self._upstream.extend(new)
        self._link(new, self._downstream)

    def lead(self, downstream: DependencyMixin) -> None:
        if isinstance(downstream, EdgeModifier):
            raise DagDefinitionError(f"{caller_location()}: two labels cannot follow each other")
        new = [root for root in downstream.roots if root not in self._downstream]
        self._downstream.extend(new)
        self._link(self._upstream, new)

    def _link(self, ups: Sequence[AbstractOperator], downs: Sequence[AbstractOperator]) -> None:
        for up in ups:
            for down in downs:
                link(up, down)
                dag = up.dag or down.dag
                if self.label is not None and dag is not None:
                    dag.set_edge_info(up.task_id, down.task_id, {"label": self.label})


class Label(EdgeModifier):
    """An edge's label: ``a >> Label("yes") >> b``."""

    def __init__(self, label: str) -> None:
        super().__init__(label)


def chain_linear(*elements: DependencyMixin | Sequence[DependencyMixin]) -> None:
    """Link every task of each element to every task of the next (Airflow's).

    ``chain_linear(t1, [t2, t3], [t4, t5], t6)`` is ``t1 >> [t2, t3]``, then each of ``t2``
    and ``t3`` ``>> [t4, t5]``, then each of those ``>> t6``. Labels are not accepted here;
    fewer than two elements set no dependency and are an error (did you forget a ``*``?).
    """
    where = caller_location()
    previous: list[DependencyMixin] = []
    linked = False
    for element in elements:
        current: list[DependencyMixin] = (
            list(element) if isinstance(element, list | tuple | set) else [element]  # type: ignore[list-item]  # checked below
        )
        for node in current:
            if isinstance(node, EdgeModifier):
                raise DagDefinitionError(f"{where}: chain_linear() does not take labels")
            if not isinstance(node, DependencyMixin):
                raise DagDefinitionError(
                    f"{where}: chain_linear() links tasks and task groups, got {node!r}"
                )
        for upstream in previous:
            upstream.set_downstream(current)
            linked = True
        previous = current
    if not linked:
        raise DagDefinitionError(
            f"{where}: chain_linear() set no dependency: give it at least two elements "
            "(did you forget to unpack a list with *?)"
        )
