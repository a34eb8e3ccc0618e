"""Mapped task groups: ``@task_group`` functions run once per item (``grp.expand(x=[...])``,
``grp.partial(y=1).expand(x=...)``, ``grp.expand_kwargs([{"x": 1}, ...])``), as Airflow's
``MappedTaskGroup``.

Theory of operation. ``expand`` calls the group's function once, at definition time, with
each expanded argument replaced by a ``MappedArgument`` (this copy's item, known at run
time). Every task the function creates in the group becomes a mapped task over the group's
input: its operator is wrapped in a ``GroupMappedOperator`` (a ``MappedOperator`` whose
copies are the wrapped operator itself), so the scheduler expands each of the group's tasks
into the same number of copies, from the same ``mapping`` (``engine.authoring.mapping``).
Copy ``i`` of every task in the group is the group's ``i``-th run:

- a ``MappedArgument`` in its arguments (``op_args``, ``op_kwargs`` and its template fields)
  is item ``i`` of the expanded input (the cross product of several, the last fastest);
- the result of another task of the same group, passed as an argument, is that task's copy
  ``i`` (not the list of every copy);
- outside the group, a task's result is the list of its copies' results, by ``map_index``
  (what a downstream "reduce" task receives).

- inside the group, ``ti.xcom_pull(task_ids=...)`` of another task of the group (without
  ``map_indexes``) reads that task's copy ``i`` too (``group_task_ids_of``), as Airflow's
  upstream map indexes do.

The scheduler decides each copy on its own (Airflow's per-``map_index`` dependencies): copy
``i`` of a group task waits only for copy ``i`` of the group tasks directly upstream of it
(and for every instance of the tasks outside the group), so a failed copy fails the same
index below it and no other. The stored mapping names the group's tasks (``mapping_json``'s
``group``), from which ``engine.advancing.rules`` pairs the copies. Tasks mapped on their
own (``.expand``) inside a mapped task group are not supported.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.baseoperator import BaseOperator, MappedOperator
from engine.authoring.errors import DagDefinitionError
from engine.authoring.mapping import EXPAND_KWARGS, pick, sequence_of, unravel
from engine.authoring.params import NOTSET
from engine.authoring.xcom import XCOM_RETURN_KEY, XComArg, resolve_references

if TYPE_CHECKING:
    from collections.abc import Iterable

    from engine.authoring.dag import DAG

__all__ = ("GroupMappedOperator", "MappedArgument", "group_task_ids_of", "map_group_tasks")

#: the attributes of a copy whose ``MappedArgument``\\ s and same-group results are bound
CALL_ARGUMENTS: Final = ("op_args", "op_kwargs")
#: where a copy's operator keeps the ids of its mapped task group's tasks
_GROUP_TASK_IDS: Final = "_mapped_group_task_ids"


def group_task_ids_of(task: object) -> frozenset[str]:
    """The tasks of the mapped task group the running copy ``task`` belongs to (empty: not
    a copy of a mapped group's task)."""
    found = getattr(task, _GROUP_TASK_IDS, None)
    return found if isinstance(found, frozenset) else frozenset()


class MappedArgument:
    """Argument ``name`` of a mapped task group: at run time, its value in the copy's item
    (``map_index``) of what the group maps over (``kind``: ``expand``, whose ``value`` maps
    names to what each maps over, or ``expand_kwargs``, whose ``value`` is a list of dicts
    of arguments; a dict without ``name`` gives ``default``). Passed to the tasks the
    group's function creates."""

    def __init__(
        self, group_id: str, name: str, kind: str, value: Any, *, default: Any = NOTSET
    ) -> None:
        self.group_id = group_id
        self.name = name
        self.kind = kind
        self.value = value
        self.default = default

    def __repr__(self) -> str:
        return f"MappedArgument({self.group_id!r}, {self.name!r})"

    def __iter__(self) -> Any:
        raise TypeError(
            f"argument {self.name!r} of mapped task group {self.group_id!r} is one item per "
            "copy, known when the copy runs; pass it to a task instead of iterating over it"
        )

    def pick(self, items: Mapping[str, Any]) -> Any:
        """This argument's value among a copy's ``items`` (``input_items``)."""
        if self.name in items:
            return items[self.name]
        if self.default is NOTSET:
            raise TypeError(
                f"mapped task group {self.group_id!r}: the item of this copy has no argument "
                f"{self.name!r} and the function gives it no default"
            )
        return self.default


def input_items(
    kind: str, value: Any, context: Mapping[str, Any], map_index: int, group_id: str
) -> dict[str, Any]:
    """The arguments of copy ``map_index``: each expanded argument's item (a cross
    product's slice), or the ``map_index``-th dict of an ``expand_kwargs`` list."""
    if kind == EXPAND_KWARGS:
        item = resolve_references(
            pick(sequence_of(value, context, group_id), map_index, group_id), context
        )
        if not isinstance(item, Mapping) or not all(isinstance(k, str) for k in item):
            raise TypeError(
                f"mapped task group {group_id!r}: expand_kwargs() items must be dicts of "
                f"arguments, item {map_index} is {type(item).__name__}"
            )
        return dict(item)
    values = {n: sequence_of(v, context, group_id) for n, v in value.items()}
    indexes = unravel(map_index, [len(v) for v in values.values()], group_id)
    return {
        name: resolve_references(pick(seq, i, group_id), context)
        for (name, seq), i in zip(values.items(), indexes, strict=True)
    }


def _bind(value: Any, bind_leaf: Any) -> Any:
    """``value`` with ``bind_leaf`` applied inside plain lists, tuples, sets and dicts."""
    kind = type(value)
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        return kind(_bind(item, bind_leaf) for item in value)
    if kind is dict:
        return {key: _bind(item, bind_leaf) for key, item in value.items()}
    return bind_leaf(value)


class GroupMappedOperator(MappedOperator):
    """A task of a mapped task group: one copy per item of the group's input, each the
    wrapped ``operator`` with this copy's arguments bound (module docstring). Built by
    ``map_group_tasks``; it takes the operator's place in the DAG and the group."""

    operator: BaseOperator
    group_task_ids: frozenset[str]

    def __repr__(self) -> str:
        return f"<MappedGroupTask({type(self.operator).__name__}): {self.task_id}>"

    def mapping_json(self) -> dict[str, Any]:
        """The group's mapping, and ``group``: the group's tasks (their copies pair up)."""
        return {**super().mapping_json(), "group": sorted(self.group_task_ids)}

    def unmap(self, context: Mapping[str, Any]) -> BaseOperator:
        map_index = int(context.get("map_index", -1))
        if map_index < 0:
            raise RuntimeError(f"mapped task {self.task_id!r} runs only as a copy (map_index)")
        items = input_items(self.expand_kind, self.expand_value, context, map_index, self.task_id)
        ti = context["ti"]

        def leaf(value: Any) -> Any:
            if isinstance(value, MappedArgument):
                return value.pick(items)
            if type(value) is XComArg and value.operator.task_id in self.group_task_ids:
                found = ti.xcom_pull(
                    task_ids=value.operator.task_id,
                    key=value.key,
                    map_indexes=map_index,
                    default=NOTSET,
                )
                return None if found is NOTSET and value.key == XCOM_RETURN_KEY else found
            return value

        operator = copy.copy(self.operator)
        names = dict.fromkeys((*CALL_ARGUMENTS, *getattr(operator, "template_fields", ())))
        for name in names:
            if name in vars(operator):
                setattr(operator, name, _bind(getattr(operator, name), leaf))
        operator.dag = self.dag
        setattr(operator, _GROUP_TASK_IDS, self.group_task_ids)
        return operator


def _refuse_attach(dag: DAG) -> None:
    """A wrapped operator stays out of the DAG: its ``GroupMappedOperator`` is the task."""


def map_group_tasks(
    dag: DAG, tasks: Iterable[BaseOperator], kind: str, value: Any, *, where: str
) -> dict[str, GroupMappedOperator]:
    """Make each of a mapped group's ``tasks`` a ``GroupMappedOperator`` mapping over
    ``value`` as ``kind`` says (``expand`` / ``expand_kwargs``) in ``dag`` (the wrapped
    operator shares its edges); task id -> it."""
    tasks = list(tasks)
    ids = frozenset(task.task_id for task in tasks)
    wrapped: dict[str, GroupMappedOperator] = {}
    for task in tasks:
        if isinstance(task, MappedOperator):
            raise DagDefinitionError(
                f"{where}: task {task.task_id!r} is mapped inside a mapped task group; "
                "mapping a task inside a mapped task group is not supported"
            )
        wrapper = GroupMappedOperator.__new__(GroupMappedOperator)
        vars(wrapper).update(vars(task))  # the same edges (shared sets), arguments, group
        wrapper.operator = task
        wrapper.group_task_ids = ids
        wrapper.operator_class = type(task)
        wrapper.partial_kwargs = {}
        wrapper.expand_kind = kind
        wrapper.expand_value = value
        wrapper.expand_into = None
        task._attach = _refuse_attach  # type: ignore[method-assign]
        dag.task_dict[task.task_id] = wrapper
        wrapped[task.task_id] = wrapper
    return wrapped
