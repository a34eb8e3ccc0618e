"""``partial``: the arguments every copy of a mapped task shares, waiting for ``expand`` /
``expand_kwargs`` (Airflow's ``OperatorPartial``).

``Op.partial(task_id=..., **fixed)`` checks ``fixed`` against the operator's arguments now
(a typo is a ``DagDefinitionError`` at parse time); ``@task`` functions' ``f.partial(**fixed)``
checks them against the function's parameters. ``expand`` / ``expand_kwargs`` check what is
mapped over and add the task: the class that builds it (``MappedOperator``,
``engine.authoring.baseoperator``) is given by whoever creates the partial, so this module
does not build on the operator classes it serves.
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from engine.authoring.dag import current_dag
from engine.authoring.default_args import accepted_arguments, with_default_args
from engine.authoring.dependencies import AbstractOperator
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.mapping import EXPAND, EXPAND_KWARGS
from engine.authoring.xcom import XCOM_RETURN_KEY, XComArg, as_references

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

M_co = TypeVar("M_co", covariant=True)
M = TypeVar("M")


class MappedBuilder(Protocol[M_co]):
    """What builds the mapped task (``MappedOperator``): its base arguments, and ``build``."""

    @property
    def BASE_ARGUMENTS(self) -> frozenset[str]: ...

    def build(
        self,
        operator_class: type[AbstractOperator],
        kwargs: Mapping[str, Any],
        kind: str,
        value: Any,
        expand_into: str | None,
    ) -> M_co: ...


def _where(owner: str) -> str:
    """``file:line: DAG 'd': owner`` for an error at definition time."""
    dag = current_dag()
    return f"{caller_location()}: {'' if dag is None else f'DAG {dag.dag_id!r}: '}{owner}"


def as_mappable(where: str, name: str, value: Any) -> Any:
    """An expanded argument: a literal list/tuple/dict, or a task's return value."""
    if isinstance(value, AbstractOperator):
        value = XComArg(value)
    if isinstance(value, XComArg):
        if value.key != XCOM_RETURN_KEY:
            raise DagDefinitionError(
                f"{where}: cannot map over the result {value.key!r} of task "
                f"{value.operator.task_id!r}; only a task's return value can be expanded"
            )
        return value
    if isinstance(value, list | tuple):
        return as_references(list(value))
    if isinstance(value, dict):
        return as_references(dict(value))
    raise DagDefinitionError(
        f"{where}: expand() argument {name!r} must be a list, a dict or a task's result to map "
        f"over, got {type(value).__name__}; pass fixed values to partial()"
    )


def check_kwargs_list(where: str, value: Any) -> Any:
    if isinstance(value, AbstractOperator):
        value = XComArg(value)
    if isinstance(value, XComArg):
        return as_mappable(where, "expand_kwargs", value)
    if not isinstance(value, list | tuple):
        raise DagDefinitionError(
            f"{where}: expand_kwargs() takes a list of dicts or a task's result, got "
            f"{type(value).__name__}"
        )
    for item in value:
        if not isinstance(item, dict | XComArg) or (
            isinstance(item, dict) and not all(isinstance(k, str) for k in item)
        ):
            raise DagDefinitionError(
                f"{where}: expand_kwargs() items must be dicts of keyword arguments, got {item!r}"
            )
    return as_references(list(value))


def _check_name(where: str, name: str, *, of: OperatorPartial[Any]) -> None:
    if name in of.mapped.BASE_ARGUMENTS:
        raise DagDefinitionError(
            f"{where}: cannot map over {name!r}: it is the same for every copy of a task (the "
            "scheduler reads it before a copy runs); set it in partial()"
        )
    owner = of.operator_class
    if name not in accepted_arguments(owner):
        raise DagDefinitionError(f"{where}: {owner.__name__} has no argument {name!r} to map over")
    if name in of.kwargs:
        raise DagDefinitionError(
            f"{where}: {name!r} is given to both partial() and expand(); give it to one"
        )


class _ExpandedOnce:
    """A partial expands into one task, once; ``check`` refuses a name it cannot map over."""

    _expanded = False

    def _claim(self, where: str) -> None:
        if self._expanded:
            raise DagDefinitionError(f"{where}: this partial() was already expanded once")
        self._expanded = True

    def _expanded_values(
        self, where: str, mapped: Mapping[str, Any], check: Callable[[str], None]
    ) -> dict[str, Any]:
        """What ``expand(**mapped)`` maps over, each argument checked."""
        self._claim(where)
        if not mapped:
            raise DagDefinitionError(f"{where}: give at least one argument to map over")
        for name in mapped:
            check(name)
        return {name: as_mappable(where, name, v) for name, v in mapped.items()}

    def _expanded_list(self, where: str, kwargs_list: Any, check: Callable[[str], None]) -> Any:
        """What ``expand_kwargs(kwargs_list)`` maps over, the names of literal items checked."""
        self._claim(where)
        value = check_kwargs_list(where, kwargs_list)
        if isinstance(value, list):
            for item in value:
                for name in item if isinstance(item, dict) else ():
                    check(name)
        return value


class OperatorPartial(_ExpandedOnce, Generic[M]):
    """``Op.partial(task_id=..., **fixed)``: waits for ``expand`` / ``expand_kwargs``;
    ``mapped`` builds the task they add."""

    def __init__(
        self,
        operator_class: type[AbstractOperator],
        kwargs: dict[str, Any],
        *,
        mapped: MappedBuilder[M],
    ) -> None:
        where = _where(f"{operator_class.__name__}.partial()")
        task_id = kwargs.get("task_id")
        if not isinstance(task_id, str):
            raise DagDefinitionError(f"{where}: partial() needs task_id=")
        accepted = accepted_arguments(operator_class) | {"task_id", "dag", "task_group"}
        unknown = sorted(set(kwargs) - accepted - {"default_args"})
        if unknown:
            raise DagDefinitionError(
                f"{where}: task {task_id!r}: {operator_class.__name__} got unknown argument(s) "
                f"{unknown}"
            )
        self.operator_class = operator_class
        self.kwargs = with_default_args(operator_class, dict(kwargs))
        self.mapped = mapped

    def __repr__(self) -> str:
        return f"<{self.operator_class.__name__}.partial task_id={self.kwargs.get('task_id')!r}>"

    def expand(self, **mapped: Any) -> M:
        """One task that runs once per item (the cross product of several arguments)."""
        where = _where(f"task {self.kwargs['task_id']!r}: expand()")
        value = self._expanded_values(where, mapped, partial(_check_name, where, of=self))
        return self.mapped.build(self.operator_class, self.kwargs, EXPAND, value, None)

    def expand_kwargs(self, kwargs_list: Any) -> M:
        """One task that runs once per dict of keyword arguments in ``kwargs_list``."""
        where = _where(f"task {self.kwargs['task_id']!r}: expand_kwargs()")
        value = self._expanded_list(where, kwargs_list, partial(_check_name, where, of=self))
        return self.mapped.build(self.operator_class, self.kwargs, EXPAND_KWARGS, value, None)


class TaskFlowPartial(_ExpandedOnce, Generic[M]):
    """``@task`` function ``.partial(**fixed)``: its function's fixed arguments."""

    def __init__(
        self,
        *,
        function: Callable[..., Any],
        operator_class: type[AbstractOperator],
        operator_kwargs: dict[str, Any],
        fixed: dict[str, Any],
        mapped: MappedBuilder[M],
    ) -> None:
        self.function = function
        self.operator_class = operator_class
        self.operator_kwargs = operator_kwargs
        self.fixed = fixed
        self.mapped = mapped
        self._params = inspect.signature(function).parameters
        where = _where(f"@task {function.__name__!r}: partial()")
        for name in fixed:
            self._check_param(where, name, fixed={})

    def _check_param(self, where: str, name: str, *, fixed: Mapping[str, Any]) -> None:
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in self._params.values())
        param = self._params.get(name)
        if param is None and not var_kw:
            raise DagDefinitionError(
                f"{where}: function {self.function.__name__!r} has no parameter {name!r}"
            )
        if param is not None and param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise DagDefinitionError(f"{where}: {name!r} is positional-only; it cannot be mapped")
        if name in fixed:
            raise DagDefinitionError(
                f"{where}: {name!r} is given to both partial() and expand(); give it to one"
            )

    def expand(self, **mapped: Any) -> M:
        where = _where(f"@task {self.function.__name__!r}: expand()")
        check = partial(self._check_param, where, fixed=self.fixed)
        return self._build(EXPAND, self._expanded_values(where, mapped, check))

    def expand_kwargs(self, kwargs_list: Any) -> M:
        where = _where(f"@task {self.function.__name__!r}: expand_kwargs()")
        check = partial(self._check_param, where, fixed=self.fixed)
        return self._build(EXPAND_KWARGS, self._expanded_list(where, kwargs_list, check))

    def _build(self, kind: str, value: Any) -> M:
        kwargs = {
            **self.operator_kwargs,
            "python_callable": self.function,
            "op_kwargs": as_references(dict(self.fixed)),
        }
        kwargs = with_default_args(self.operator_class, kwargs)
        return self.mapped.build(self.operator_class, kwargs, kind, value, "op_kwargs")
