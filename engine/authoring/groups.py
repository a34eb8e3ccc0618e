"""Task groups (``TaskGroup``, ``@task_group``) and the dependency helpers ``chain`` and
``cross_downstream`` (Airflow's).

A task created inside ``with TaskGroup("load"):`` gets the id ``"load.<task_id>"`` (nested:
``"outer.inner.task"``; ``prefix_group_id=False`` drops this group's prefix). A group links
like a task: ``group >> x`` links the group's leaves (its tasks with no downstream task in
the group) to ``x``'s roots, ``x >> group`` links ``x``'s leaves to the group's roots (its
tasks with no upstream task in the group), at the time of the ``>>``, as in Airflow. A
group's ``default_args`` apply over the DAG's to the tasks inside it. Group ids and task ids
share one namespace per DAG.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from typing import TYPE_CHECKING, Any, overload

from engine.authoring.arguments import check_default_args, check_id
from engine.authoring.dag import DAG, current_dag, current_group, pop_group, push_group
from engine.authoring.dependencies import AbstractOperator, DependencyMixin
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.mapping import EXPAND, EXPAND_KWARGS
from engine.authoring.params import NOTSET
from engine.authoring.setup_teardown import group_leaves
from engine.authoring.xcom import iter_references

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from types import TracebackType

    from engine.authoring.baseoperator import BaseOperator


class TaskGroup(DependencyMixin):
    """A named group of tasks: prefixes their ids, links as a whole, shares default_args."""

    def __init__(
        self,
        group_id: str,
        *,
        tooltip: str = "",
        prefix_group_id: bool = True,
        parent_group: TaskGroup | None = None,
        dag: DAG | None = None,
        default_args: Mapping[str, Any] | None = None,
        group_display_name: str | None = None,
        ui_color: str = "CornflowerBlue",
        ui_fgcolor: str = "#000",
        add_suffix_on_collision: bool = False,
    ) -> None:
        location = caller_location()
        where = f"{location}: TaskGroup {group_id!r}"
        check_id("group_id", group_id, where=location)
        parent = self._parent(where, parent_group, dag)
        target = dag or (parent.dag if parent is not None else current_dag())
        if not isinstance(target, DAG):
            raise DagDefinitionError(
                f"{where}: a task group belongs to a DAG; create it inside `with DAG(...)` "
                "or pass dag="
            )
        self.parent_group = parent
        self.prefix_group_id = bool(prefix_group_id)
        self.tooltip = tooltip
        self.ui_color = ui_color
        self.ui_fgcolor = ui_fgcolor
        self._dag = target
        self.default_args: dict[str, Any] = {
            **(parent.default_args if parent is not None else {}),
            **check_default_args(where, default_args),
        }
        self.group_id = self._unique_id(where, group_id, add_suffix_on_collision)
        self.label = group_id
        self.group_display_name = group_display_name or group_id
        self.children: dict[str, BaseOperator | TaskGroup] = {}
        target.task_group_dict[self.group_id] = self
        if parent is not None:
            parent.children[self.group_id] = self

    @staticmethod
    def _parent(where: str, parent_group: object, dag: DAG | None) -> TaskGroup | None:
        if parent_group is not None:
            if not isinstance(parent_group, TaskGroup):
                raise DagDefinitionError(
                    f"{where}: parent_group must be a TaskGroup, got {parent_group!r}"
                )
            return parent_group
        inner = current_group()
        if isinstance(inner, TaskGroup) and (dag is None or inner.dag is dag):
            return inner
        return None

    def _unique_id(self, where: str, label: str, add_suffix: bool) -> str:
        taken = {*self._dag.task_group_dict, *self._dag.task_dict}
        full = self._id_in_parent(label)
        suffix = 0
        while full in taken:
            if not add_suffix:
                raise DagDefinitionError(
                    f"{where}: DAG {self._dag.dag_id!r} already has a task or task group "
                    f"{full!r}; ids must be unique within a DAG"
                )
            suffix += 1
            full = self._id_in_parent(f"{label}__{suffix}")
        return check_id("group_id", full, where=where)

    def _id_in_parent(self, label: str) -> str:
        return label if self.parent_group is None else self.parent_group.child_id(label)

    def __repr__(self) -> str:
        return f"<TaskGroup {self.group_id!r} children={list(self.children)}>"

    @property
    def dag(self) -> DAG:
        return self._dag

    def child_id(self, label: str) -> str:
        """The id of a task or group named ``label`` inside this group."""
        return f"{self.group_id}.{label}" if self.prefix_group_id else label

    def add(self, node: BaseOperator) -> None:
        """Record a task created in this group (``BaseOperator`` calls it)."""
        self.children[node.task_id] = node

    def __iter__(self) -> Iterator[BaseOperator]:
        """Every task in the group, nested groups included, in creation order."""
        for child in self.children.values():
            if isinstance(child, TaskGroup):
                yield from child
            else:
                yield child

    @property
    def roots(self) -> list[AbstractOperator]:
        tasks = list(self)
        ids = {task.task_id for task in tasks}
        return [task for task in tasks if task.upstream_task_ids.isdisjoint(ids)]

    @property
    def leaves(self) -> list[AbstractOperator]:
        """Its tasks without downstream task in the group; a teardown leaf gives way to the
        work before it (Airflow's, ``engine.authoring.setup_teardown.group_leaves``)."""
        return group_leaves(list(self))

    def __enter__(self) -> TaskGroup:
        push_group(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pop_group(self)


class TaskGroupFactory:
    """What ``@task_group`` returns: each call builds a ``TaskGroup`` around the function."""

    def __init__(self, function: Callable[..., Any], **group_kwargs: Any) -> None:
        if not callable(function):
            raise DagDefinitionError(f"{caller_location()}: @task_group decorates functions")
        functools.update_wrapper(self, function)
        self.function = function
        self.group_kwargs = group_kwargs

    def __repr__(self) -> str:
        return f"<@task_group {getattr(self.function, '__qualname__', self.function)!r}>"

    def override(self, **group_kwargs: Any) -> TaskGroupFactory:
        """A copy with other ``TaskGroup`` arguments (``group_id``, ``tooltip`` ...)."""
        return TaskGroupFactory(self.function, **{**self.group_kwargs, **group_kwargs})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The group, or what the function returned when that is not None (as in Airflow)."""
        group, result = self._build(TaskGroup, args, kwargs)
        return group if result is None else result

    def _build(
        self, kind: type[TaskGroup], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[TaskGroup, Any]:
        options = dict(self.group_kwargs)
        group_id = options.pop("group_id", None) or self.function.__name__
        options.setdefault("add_suffix_on_collision", True)
        with kind(group_id, **options) as group:
            if not group.tooltip and self.function.__doc__:
                group.tooltip = inspect.cleandoc(self.function.__doc__)
            result = self.function(*args, **kwargs)
        return group, result

    def partial(self, **fixed: Any) -> MappedGroupPartial:
        """The arguments every run of a mapped group shares; ``.expand(...)`` maps it."""
        return MappedGroupPartial(self, fixed)

    def expand(self, **mapped: Any) -> Any:
        """The group, run once per item of ``mapped`` (the cross product of several
        arguments): each of its tasks is mapped, copy ``i`` of each is the group's ``i``-th
        run (``engine.authoring.mapped_groups``). Returns what the function returned (a
        task's result is then the list of its copies' results), else the group."""
        return MappedGroupPartial(self, {}).expand(**mapped)

    def expand_kwargs(self, kwargs_list: Any) -> Any:
        """The group, run once per dict of arguments in ``kwargs_list`` (a list of dicts or a
        task's result that is one)."""
        return MappedGroupPartial(self, {}).expand_kwargs(kwargs_list)


class MappedTaskGroup(TaskGroup):
    """A task group run once per item of ``expand_input`` (``@task_group`` ``.expand`` or
    ``.expand_kwargs``: ``expand_kind``)."""

    expand_kind: str
    expand_input: Any


class MappedGroupPartial:
    """``@task_group`` function ``.partial(**fixed)``: waits for ``.expand(**mapped)``."""

    def __init__(self, factory: TaskGroupFactory, fixed: Mapping[str, Any]) -> None:
        self.factory = factory
        self.fixed = dict(fixed)
        self._params = inspect.signature(factory.function).parameters
        self._expanded = False

    def __repr__(self) -> str:
        return f"<{self.factory!r}.partial fixed={sorted(self.fixed)}>"

    def _check(self, where: str, mapped: Mapping[str, Any], *, kwargs_list: bool = False) -> None:
        """Expanded once; ``mapped``: the names mapped over (``expand``'s, or an
        ``expand_kwargs`` item's)."""
        if self._expanded:
            raise DagDefinitionError(f"{where}: this partial() was already expanded once")
        if not mapped and not kwargs_list:
            raise DagDefinitionError(f"{where}: give at least one argument to map over")
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in self._params.values())
        for name in [*self.fixed, *mapped]:
            if name not in self._params and not var_kw:
                raise DagDefinitionError(
                    f"{where}: function {self.factory.function.__name__!r} has no parameter "
                    f"{name!r}"
                )
        both = sorted(set(self.fixed) & set(mapped))
        if both:
            raise DagDefinitionError(
                f"{where}: {both} given to both partial() and the expansion; give each to one"
            )

    def expand(self, **mapped: Any) -> Any:
        from engine.authoring.partial import as_mappable

        where = f"{caller_location()}: @task_group {self.factory.function.__name__!r}: expand()"
        self._check(where, mapped)
        value = {arg: as_mappable(where, arg, item) for arg, item in mapped.items()}
        return self._map(where, EXPAND, value, dict.fromkeys(value, NOTSET))

    def expand_kwargs(self, kwargs_list: Any) -> Any:
        """The group, run once per dict of arguments in ``kwargs_list`` (a list of dicts or a
        task's result): every parameter not given to ``partial()`` is taken from the dict,
        or is its default when the dict has no such key."""
        from engine.authoring.partial import check_kwargs_list

        name = self.factory.function.__name__
        where = f"{caller_location()}: @task_group {name!r}: expand_kwargs()"
        self._check(where, {}, kwargs_list=True)
        params = self._params.values()
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            raise DagDefinitionError(
                f"{where}: expand_kwargs() on a task group function with * or ** arguments "
                "is not supported"
            )
        value = check_kwargs_list(where, kwargs_list)
        for item in value if isinstance(value, list) else ():
            self._check(where, item if isinstance(item, dict) else {}, kwargs_list=True)
        defaults = {p.name: p.default for p in params if p.name not in self.fixed}
        return self._map(where, EXPAND_KWARGS, value, defaults)

    def _map(self, where: str, kind: str, value: Any, defaults: Mapping[str, Any]) -> Any:
        from engine.authoring.mapped_groups import MappedArgument, map_group_tasks

        self._expanded = True
        arguments = {
            arg: MappedArgument(
                self.factory.group_kwargs.get("group_id") or self.factory.function.__name__,
                arg,
                kind,
                value,
                default=NOTSET if default is inspect.Parameter.empty else default,
            )
            for arg, default in defaults.items()
        }
        group, result = self.factory._build(MappedTaskGroup, (), {**self.fixed, **arguments})
        assert isinstance(group, MappedTaskGroup)
        group.expand_kind, group.expand_input = kind, value
        for argument in arguments.values():
            argument.group_id = group.group_id  # with its suffix, if any
        tasks = list(group)
        if not tasks:
            raise DagDefinitionError(f"{where}: the group has no task to map")
        wrapped = map_group_tasks(group.dag, tasks, kind, value, where=where)
        _replace_children(group, wrapped)
        sources = [source.operator for ref in iter_references(value) for source in ref.sources()]
        for root in group.roots:
            for source in sources:
                root.set_upstream(source)
        return group if result is None else result


def _replace_children(group: TaskGroup, wrapped: Mapping[str, BaseOperator]) -> None:
    for key, child in list(group.children.items()):
        if isinstance(child, TaskGroup):
            _replace_children(child, wrapped)
        elif key in wrapped:
            group.children[key] = wrapped[key]


@overload
def task_group(function: Callable[..., Any], /) -> TaskGroupFactory: ...


@overload
def task_group(
    group_id: str | None = None, /, **group_kwargs: Any
) -> Callable[[Callable[..., Any]], TaskGroupFactory]: ...


def task_group(
    group_id_or_function: str | Callable[..., Any] | None = None, /, **group_kwargs: Any
) -> TaskGroupFactory | Callable[[Callable[..., Any]], TaskGroupFactory]:
    """Turn a function into a task group factory: ``@task_group`` or ``@task_group(...)``.

    ``group_id`` defaults to the function name (a second call gets ``name__1``), the tooltip
    to its docstring.
    """
    if callable(group_id_or_function):
        return TaskGroupFactory(group_id_or_function, **group_kwargs)
    if group_id_or_function is not None:
        group_kwargs["group_id"] = group_id_or_function
    return functools.partial(TaskGroupFactory, **group_kwargs)


# --- chain and cross_downstream ------------------------------------------------------------------


def _sequence(where: str, value: object) -> list[DependencyMixin]:
    items = list(value) if isinstance(value, list | tuple) else [value]
    for item in items:
        if not isinstance(item, DependencyMixin):
            raise DagDefinitionError(
                f"{where}: chain() links tasks, task groups and lists of them, got {item!r}"
            )
    return items  # type: ignore[return-value]  # checked above


def chain(*elements: DependencyMixin | Sequence[DependencyMixin]) -> None:
    """Link each element to the next: ``chain(a, [b, c], d)`` is ``a >> [b, c] >> d``.

    Two adjacent lists are linked pairwise and must have the same length:
    ``chain(a, [b, c], [d, e])`` is ``a >> [b, c]``, ``b >> d``, ``c >> e``.
    """
    where = caller_location()
    for upstream, downstream in itertools.pairwise(elements):
        if isinstance(upstream, DependencyMixin):
            upstream.set_downstream(_sequence(where, downstream))
        elif isinstance(downstream, DependencyMixin):
            downstream.set_upstream(_sequence(where, upstream))
        else:
            ups, downs = _sequence(where, upstream), _sequence(where, downstream)
            if len(ups) != len(downs):
                raise DagDefinitionError(
                    f"{where}: chain() links two adjacent lists pairwise, so they need the same "
                    f"length; got {len(ups)} and {len(downs)}"
                )
            for up, down in zip(ups, downs, strict=True):
                up.set_downstream(down)


def cross_downstream(
    from_tasks: Sequence[DependencyMixin], to_tasks: DependencyMixin | Sequence[DependencyMixin]
) -> None:
    """Link every task of ``from_tasks`` to every task of ``to_tasks``."""
    where = caller_location()
    targets = _sequence(where, to_tasks)
    for upstream in _sequence(where, from_tasks):
        upstream.set_downstream(targets)
