"""Dynamic task mapping: ``.partial(...).expand(...)`` and ``.expand_kwargs(...)``.

Theory of operation. ``Op.partial(task_id=..., **fixed)`` (or ``@task`` ``f.partial(**fixed)``)
holds the arguments every copy shares; ``.expand(name=values, ...)`` adds one task to the DAG,
a ``MappedOperator``, whose copies (task instances with ``map_index`` 0..N-1) the scheduler
creates when the task's upstream tasks are done. Each expanded argument is a literal list or
dict, or the result of an upstream task (an ``XComArg``: a list or dict at run time); several
expanded arguments map over their cross product, the last one varying fastest (as Airflow:
``add.expand(x=[1, 2], y=[10, 20])`` runs ``(1, 10), (1, 20), (2, 10), (2, 20)``). A dict
maps over its ``(key, value)`` items. ``.expand_kwargs(list_of_dicts)`` maps over a list
whose items are whole sets of keyword arguments (a literal list or an upstream result).
An upstream result may be transformed item by item (``result.map(fn)``) or zipped with
others (``a.zip(b, fillvalue=...)``, ``engine.authoring.xcom``).

What the scheduler needs without importing the DAG file is ``MappedOperator.mapping_json()``
(stored in ``dag_task.mapping``): each expanded argument's literal length, or the upstream
task and key whose result it maps over. ``map_length`` turns that and the upstream results
into the number of copies; an empty input gives none (the task is skipped), a result that is
neither a list nor a dict is an error (``UnmappableXComTypePushed``), and so is a length over
``MAX_MAP_LENGTH`` (Airflow's ``[core] max_map_length``).

In the task runner, ``MappedOperator.unmap(context)`` builds the operator of one copy: the
partial arguments plus this ``map_index``'s slice of the expanded ones, references resolved.
A task whose result a mapped task maps over must return a list or a dict: the task runner
fails it otherwise (``check_mappable_result``), as Airflow does.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.dag import (
    BaseOperator,
    _with_default_args,
    accepted_arguments,
    current_dag,
    set_partial_factory,
)
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.params import NOTSET
from engine.authoring.runtime_context import XCOM_RETURN_KEY
from engine.authoring.xcom import (
    MapXComArg,
    XComArg,
    ZipXComArg,
    as_references,
    iter_references,
    resolve_references,
)
from engine.exceptions import AirflowException

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.authoring.context import Context

__all__ = (
    "MAX_MAP_LENGTH",
    "MappedOperator",
    "OperatorPartial",
    "TaskFlowPartial",
    "UnmappableXComLengthPushed",
    "UnmappableXComTypePushed",
    "XComForMappingNotPushed",
    "check_mappable_result",
    "describe_mapping",
    "map_length",
    "mapped_source_ids",
)

#: Airflow's ``[core] max_map_length``: the most copies one mapped task may have.
MAX_MAP_LENGTH: Final = 1024
EXPAND: Final = "expand"
EXPAND_KWARGS: Final = "expand_kwargs"
#: Arguments of ``BaseOperator`` itself: the scheduler reads them before a copy runs, so
#: they are the same for every copy (set them in ``partial``).
_BASE_ARGUMENTS: Final = frozenset(inspect.signature(BaseOperator.__init__).parameters) - {
    "self",
    "unsupported",
}


class UnmappableXComTypePushed(AirflowException):
    """A task whose result a mapped task maps over returned something not a list or dict."""

    def __init__(self, task_id: str, value: object, *, for_task: str | None = None) -> None:
        who = f" (mapped task {for_task!r} maps over it)" if for_task else ""
        super().__init__(
            f"task {task_id!r} returned {type(value).__name__}, which cannot be mapped over"
            f"{who}: a task whose result is expanded must return a list or a dict"
        )


class XComForMappingNotPushed(AirflowException):
    """A task whose result a mapped task maps over stored no result."""

    def __init__(self, task_id: str, *, for_task: str | None = None) -> None:
        who = f"mapped task {for_task!r}" if for_task else "a mapped task"
        super().__init__(
            f"task {task_id!r} stored no result, but {who} maps over it: return a list or a "
            "dict (and keep do_xcom_push=True)"
        )


class UnmappableXComLengthPushed(AirflowException):
    """A mapped task would get more copies than ``MAX_MAP_LENGTH``."""

    def __init__(self, task_id: str, length: int) -> None:
        super().__init__(
            f"mapped task {task_id!r} would expand into {length} copies, more than the limit "
            f"of {MAX_MAP_LENGTH} (Airflow's [core] max_map_length)"
        )


# --- definition time ------------------------------------------------------------------------


def _where(owner: str) -> str:
    """``file:line: DAG 'd': owner`` for an error at definition time."""
    dag = current_dag()
    return f"{caller_location()}: {'' if dag is None else f'DAG {dag.dag_id!r}: '}{owner}"


def _as_mappable(where: str, name: str, value: Any) -> Any:
    """An expanded argument: a literal list/tuple/dict, or a task's return value."""
    if isinstance(value, BaseOperator):
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


def _check_kwargs_list(where: str, value: Any) -> Any:
    if isinstance(value, BaseOperator):
        value = XComArg(value)
    if isinstance(value, XComArg):
        return _as_mappable(where, "expand_kwargs", value)
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


class MappedOperator(BaseOperator):
    """A task that runs as N copies, one per item of what it maps over (``map_index``).

    Built by ``partial(...).expand(...)``; the scheduler-facing arguments (``retries``,
    ``trigger_rule``, ``outlets`` ...) are the partial ones, shared by every copy.
    ``operator_class`` is the class each copy is; ``expand_into`` is ``"op_kwargs"`` for a
    ``@task`` (its function's arguments are mapped), None for a classic operator.
    """

    def __init__(
        self,
        *,
        operator_class: type[BaseOperator],
        partial_kwargs: Mapping[str, Any],
        expand_kind: str,
        expand_value: Any,
        expand_into: str | None = None,
        **base_kwargs: Any,
    ) -> None:
        super().__init__(**base_kwargs)  # partial() applied the default_args already
        self.operator_class = operator_class
        self.partial_kwargs = dict(partial_kwargs)
        self.expand_kind = expand_kind
        self.expand_value = expand_value
        self.expand_into = expand_into
        for reference in iter_references((self.partial_kwargs, expand_value)):
            self.set_upstream(reference)

    def __repr__(self) -> str:
        return f"<Mapped({self.operator_class.__name__}): {self.task_id}>"

    @property
    def operator_classpath(self) -> str:
        cls = self.operator_class
        return f"{cls.__module__}.{cls.__qualname__}"

    @property
    def output(self) -> XComArg:
        """The results of every copy (a list, by ``map_index``), for a downstream task."""
        return XComArg(self)

    def __getitem__(self, key: str) -> XComArg:
        return XComArg(self)[key]

    def map(self, function: Callable[[Any], Any]) -> MapXComArg:
        """The copies' results, ``function`` applied to each."""
        return self.output.map(function)

    def zip(self, *others: XComArg | BaseOperator, fillvalue: Any = NOTSET) -> ZipXComArg:
        """The copies' results side by side with ``others``'."""
        return self.output.zip(*others, fillvalue=fillvalue)

    def iter_mapped_sources(self) -> list[XComArg]:
        """The upstream results this task maps over (not those inside literal lists)."""
        if isinstance(self.expand_value, XComArg):
            return self.expand_value.sources()
        if self.expand_kind == EXPAND:
            args = [v for v in self.expand_value.values() if isinstance(v, XComArg)]
            return [source for arg in args for source in arg.sources()]
        return []

    def mapping_json(self) -> dict[str, Any]:
        """What the scheduler needs to count the copies (``dag_task.mapping``)."""
        if self.expand_kind == EXPAND_KWARGS:
            return {"kind": EXPAND_KWARGS, "source": _source_json(self.expand_value)}
        args = [{"name": name, **_source_json(v)} for name, v in self.expand_value.items()]
        return {"kind": EXPAND, "args": args}

    # --- run time -----------------------------------------------------------------------------

    def mapped_kwargs(self, context: Mapping[str, Any], map_index: int) -> dict[str, Any]:
        """This copy's expanded arguments, references resolved."""
        if self.expand_kind == EXPAND_KWARGS:
            items = _sequence(self.expand_value, context, self.task_id)
            item = resolve_references(_pick(items, map_index, self.task_id), context)
            if not isinstance(item, Mapping) or not all(isinstance(k, str) for k in item):
                raise TypeError(
                    f"mapped task {self.task_id!r}: expand_kwargs() items must be dicts of "
                    f"keyword arguments, item {map_index} is {type(item).__name__}"
                )
            return dict(item)
        values = {n: _sequence(v, context, self.task_id) for n, v in self.expand_value.items()}
        indexes = _unravel(map_index, [len(v) for v in values.values()], self.task_id)
        return {
            name: resolve_references(seq[i], context)
            for (name, seq), i in zip(values.items(), indexes, strict=True)
        }

    def unmap(self, context: Mapping[str, Any]) -> BaseOperator:
        """The operator of the copy ``context["map_index"]`` runs."""
        map_index = int(context.get("map_index", -1))
        if map_index < 0:
            raise RuntimeError(f"mapped task {self.task_id!r} runs only as a copy (map_index)")
        mapped = self.mapped_kwargs(context, map_index)
        kwargs = resolve_references(dict(self.partial_kwargs), context)
        if self.expand_into is not None:
            kwargs[self.expand_into] = {**kwargs.get(self.expand_into, {}), **mapped}
        else:
            kwargs.update(mapped)
        operator = self.operator_class(task_id=self.task_id, **kwargs)
        operator.dag = self.dag
        operator.task_group = self.task_group
        operator.upstream_task_ids = set(self.upstream_task_ids)
        operator.downstream_task_ids = set(self.downstream_task_ids)
        return operator

    def execute(self, context: Context) -> Any:
        return self.unmap(context).execute(context)


def _source_json(value: Any) -> dict[str, Any]:
    """How the scheduler counts one expanded argument's items."""
    if isinstance(value, ZipXComArg):
        parts = [_source_json(arg) for arg in value.args]
        return {"zip": parts, "longest": value.fillvalue is not NOTSET}
    if isinstance(value, MapXComArg):
        return _source_json(value.arg)  # map() keeps the length
    if isinstance(value, XComArg):
        return {"task_id": value.operator.task_id, "key": value.key}
    return {"literal": len(value)}


def _sequence(value: Any, context: Mapping[str, Any], task_id: str) -> list[Any]:
    """What one expanded argument maps over, as a list (a dict's ``(key, value)`` items)."""
    if isinstance(value, XComArg):
        resolved = value.resolve(context)
        if not isinstance(resolved, list | tuple | dict):
            raise UnmappableXComTypePushed(value.operator.task_id, resolved, for_task=task_id)
        value = resolved
    if isinstance(value, Mapping):
        return list(value.items())
    return list(value)


def _pick(items: Sequence[Any], index: int, task_id: str) -> Any:
    if index >= len(items):
        raise IndexError(
            f"mapped task {task_id!r}: map_index {index} is past the {len(items)} items it "
            "maps over (did the upstream result change since the copies were created?)"
        )
    return items[index]


def _unravel(index: int, lengths: Sequence[int], task_id: str) -> list[int]:
    """The index into each expanded argument of copy ``index`` (last argument fastest)."""
    total = 1
    for length in lengths:
        total *= length
    _pick(range(total), index, task_id)
    out: list[int] = []
    for length in reversed(lengths):
        index, position = divmod(index, length)
        out.append(position)
    return out[::-1]


def cross_product_order(*values: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The order copies map over several arguments (documentation and tests)."""
    return list(itertools.product(*values))


# --- partial ---------------------------------------------------------------------------------


class OperatorPartial:
    """``Op.partial(task_id=..., **fixed)``: waits for ``expand`` / ``expand_kwargs``."""

    def __init__(self, operator_class: type[BaseOperator], kwargs: dict[str, Any]) -> None:
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
        self.kwargs = _with_default_args(operator_class, dict(kwargs))
        self._expanded = False

    def __repr__(self) -> str:
        return f"<{self.operator_class.__name__}.partial task_id={self.kwargs.get('task_id')!r}>"

    def _claim(self, where: str) -> None:
        if self._expanded:
            raise DagDefinitionError(f"{where}: this partial() was already expanded once")
        self._expanded = True

    def expand(self, **mapped: Any) -> MappedOperator:
        """One task that runs once per item (the cross product of several arguments)."""
        where = _where(f"task {self.kwargs['task_id']!r}: expand()")
        self._claim(where)
        if not mapped:
            raise DagDefinitionError(f"{where}: give at least one argument to map over")
        accepted = accepted_arguments(self.operator_class)
        for name in mapped:
            _check_name(where, name, self.kwargs, accepted, self.operator_class.__name__)
        value = {name: _as_mappable(where, name, v) for name, v in mapped.items()}
        return _build(self.operator_class, self.kwargs, EXPAND, value, None)

    def expand_kwargs(self, kwargs_list: Any) -> MappedOperator:
        """One task that runs once per dict of keyword arguments in ``kwargs_list``."""
        where = _where(f"task {self.kwargs['task_id']!r}: expand_kwargs()")
        self._claim(where)
        value = _check_kwargs_list(where, kwargs_list)
        if isinstance(value, list):
            accepted = accepted_arguments(self.operator_class)
            for item in value:
                for name in item if isinstance(item, dict) else ():
                    _check_name(where, name, self.kwargs, accepted, self.operator_class.__name__)
        return _build(self.operator_class, self.kwargs, EXPAND_KWARGS, value, None)


def _check_name(
    where: str, name: str, partial: Mapping[str, Any], accepted: frozenset[str], owner: str
) -> None:
    if name in _BASE_ARGUMENTS:
        raise DagDefinitionError(
            f"{where}: cannot map over {name!r}: it is the same for every copy of a task (the "
            "scheduler reads it before a copy runs); set it in partial()"
        )
    if name not in accepted:
        raise DagDefinitionError(f"{where}: {owner} has no argument {name!r} to map over")
    if name in partial:
        raise DagDefinitionError(
            f"{where}: {name!r} is given to both partial() and expand(); give it to one"
        )


def _split(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(BaseOperator's own arguments, everything each copy is built with)."""
    base = {k: v for k, v in kwargs.items() if k in _BASE_ARGUMENTS}
    rest = {k: v for k, v in kwargs.items() if k not in {"task_id", "dag", "task_group"}}
    return base, rest


def _build(
    cls: type[BaseOperator],
    kwargs: Mapping[str, Any],
    kind: str,
    value: Any,
    expand_into: str | None,
) -> MappedOperator:
    if getattr(cls, "start_from_trigger", False):
        raise DagDefinitionError(
            f"{caller_location()}: task {kwargs.get('task_id')!r}: {cls.__name__} starts from "
            "a trigger; mapping such operators is not supported yet"
        )
    base, rest = _split(kwargs)
    return MappedOperator(
        operator_class=cls,
        partial_kwargs=rest,
        expand_kind=kind,
        expand_value=value,
        expand_into=expand_into,
        **base,
    )


set_partial_factory(OperatorPartial)


class TaskFlowPartial:
    """``@task`` function ``.partial(**fixed)``: its function's fixed arguments."""

    def __init__(
        self,
        *,
        function: Callable[..., Any],
        operator_class: type[BaseOperator],
        operator_kwargs: dict[str, Any],
        fixed: dict[str, Any],
    ) -> None:
        self.function = function
        self.operator_class = operator_class
        self.operator_kwargs = operator_kwargs
        self.fixed = fixed
        self._expanded = False
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

    def _claim(self, where: str) -> None:
        if self._expanded:
            raise DagDefinitionError(f"{where}: this partial() was already expanded once")
        self._expanded = True

    def expand(self, **mapped: Any) -> MappedOperator:
        where = _where(f"@task {self.function.__name__!r}: expand()")
        self._claim(where)
        if not mapped:
            raise DagDefinitionError(f"{where}: give at least one argument to map over")
        for name in mapped:
            self._check_param(where, name, fixed=self.fixed)
        value = {name: _as_mappable(where, name, v) for name, v in mapped.items()}
        return self._build(EXPAND, value)

    def expand_kwargs(self, kwargs_list: Any) -> MappedOperator:
        where = _where(f"@task {self.function.__name__!r}: expand_kwargs()")
        self._claim(where)
        value = _check_kwargs_list(where, kwargs_list)
        if isinstance(value, list):
            for item in value:
                for name in item if isinstance(item, dict) else ():
                    self._check_param(where, name, fixed=self.fixed)
        return self._build(EXPAND_KWARGS, value)

    def _build(self, kind: str, value: Any) -> MappedOperator:
        kwargs = {
            **self.operator_kwargs,
            "python_callable": self.function,
            "op_kwargs": as_references(dict(self.fixed)),
        }
        kwargs = _with_default_args(self.operator_class, kwargs)
        return _build(self.operator_class, kwargs, kind, value, "op_kwargs")


# --- scheduler side: how many copies ------------------------------------------------------------


def _length_of(source: Mapping[str, Any], value_of: Callable[[str, str], Any], task_id: str) -> int:
    if "literal" in source:
        return int(source["literal"])
    if "zip" in source:
        lengths = [_length_of(part, value_of, task_id) for part in source["zip"]]
        return (max if source.get("longest") else min)(lengths, default=0)
    upstream = str(source["task_id"])
    value = value_of(upstream, str(source.get("key", XCOM_RETURN_KEY)))
    if value is NOTSET or value is None:
        raise XComForMappingNotPushed(upstream, for_task=task_id)
    if not isinstance(value, list | tuple | dict):
        raise UnmappableXComTypePushed(upstream, value, for_task=task_id)
    return len(value)


def mapped_source_ids(mapping: Mapping[str, Any]) -> set[str]:
    """The upstream tasks whose results a mapped task's ``mapping_json()`` maps over."""

    def of(source: Mapping[str, Any]) -> set[str]:
        if "zip" in source:
            return {task_id for part in source["zip"] for task_id in of(part)}
        return {str(source["task_id"])} if "task_id" in source else set()

    if mapping.get("kind") == EXPAND_KWARGS:
        return of(mapping["source"])
    return {task_id for arg in mapping.get("args", []) for task_id in of(arg)}


def describe_mapping(mapping: Mapping[str, Any]) -> str:
    """What a mapped task maps over, for people: ``x <- extract, y [3]`` (an upstream
    result, a literal of 3 items), ``kwargs <- rows`` (``expand_kwargs``)."""

    def of(source: Mapping[str, Any]) -> str:
        if "zip" in source:
            return f"zip({', '.join(of(part) for part in source['zip'])})"
        if "task_id" in source:
            return str(source["task_id"])
        return f"[{source.get('literal', 0)}]"

    if mapping.get("kind") == EXPAND_KWARGS:
        return f"kwargs <- {of(mapping['source'])}"
    parts = []
    for arg in mapping.get("args", []):
        text = of(arg)
        parts.append(
            f"{arg['name']} {text}" if text.startswith("[") else f"{arg['name']} <- {text}"
        )
    return ", ".join(parts)


def map_length(
    mapping: Mapping[str, Any], value_of: Callable[[str, str], Any], *, task_id: str
) -> int:
    """How many copies a mapped task gets, from its ``mapping_json()`` and ``value_of(task_id,
    key)`` (the upstream result, ``NOTSET`` when none was stored). Raises the
    ``AirflowException`` subclasses above for what cannot be mapped over."""
    if mapping.get("kind") == EXPAND_KWARGS:
        length = _length_of(mapping["source"], value_of, task_id)
    else:
        length = 1
        for arg in mapping.get("args", []):
            length *= _length_of(arg, value_of, task_id)
    if length > MAX_MAP_LENGTH:
        raise UnmappableXComLengthPushed(task_id, length)
    return length


def check_mappable_result(task: BaseOperator, value: Any) -> None:
    """Raise when a mapped task maps over ``task``'s return value and ``value`` cannot be
    mapped over (the task runner calls it before storing the result, as Airflow does)."""
    dag = task.dag
    if dag is None or isinstance(task, MappedOperator):
        return
    for child_id in task.downstream_task_ids:
        child = dag.task_dict.get(child_id)
        if not isinstance(child, MappedOperator):
            continue
        if not any(s.operator.task_id == task.task_id for s in child.iter_mapped_sources()):
            continue
        if value is None or not getattr(task, "do_xcom_push", True):
            raise XComForMappingNotPushed(task.task_id, for_task=child.task_id)
        if not isinstance(value, list | tuple | dict):
            raise UnmappableXComTypePushed(task.task_id, value, for_task=child.task_id)
