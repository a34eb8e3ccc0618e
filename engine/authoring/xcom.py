"""Results between tasks: ``XComArg``, a task's result used as another task's argument.

Theory of operation. At definition time a result is a reference, not a value: calling a
``@task`` function with another task (``load(extract())``), with ``extract()["key"]``, or
with ``op.output`` stores an ``XComArg`` in the new task's arguments and makes the
referenced task its upstream. Nothing runs then. When the downstream task runs, the
executor has sent the results of the run's finished tasks in its context
(``engine.execution.context``); ``resolve_references`` replaces each ``XComArg`` (and
each ``@dag`` parameter, ``DagParam``) in the arguments by its value through
``ti.xcom_pull``, inside lists, tuples, sets and dicts too.

A missing ``return_value`` resolves to None (the upstream returned None or was skipped), as
in Airflow; another missing key raises ``XComNotFound``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, NoReturn

from engine.authoring.dependencies import AbstractOperator, DependencyMixin
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.params import NOTSET, DagParam
from engine.exceptions import AirflowException

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

#: The key of a task's return value among its results (Airflow's ``XCOM_RETURN_KEY``).
XCOM_RETURN_KEY: Final = "return_value"

__all__ = (
    "XCOM_RETURN_KEY",
    "MapXComArg",
    "XComArg",
    "XComNotFound",
    "ZipXComArg",
    "as_references",
    "iter_references",
    "resolve_references",
)


class XComNotFound(AirflowException):
    """A task argument refers to a result the upstream task did not store in this run."""

    def __init__(self, dag_id: str | None, task_id: str, key: str) -> None:
        super().__init__(
            f"result {key!r} of task {task_id!r} (DAG {dag_id!r}) not found in this run: the "
            "task did not push it (with multiple_outputs=True, a dict result is also stored key "
            "by key)"
        )
        self.dag_id, self.task_id, self.key = dag_id, task_id, key


class XComArg(DependencyMixin):
    """The result ``key`` of ``operator`` (``return_value`` by default), resolved at run time.

    Links like the task itself (``a.output >> b``); ``arg["k"]`` is the result ``k`` of the
    same task. Not iterable at definition time (a loop over it is a mistake: the value does
    not exist yet).
    """

    def __init__(self, operator: AbstractOperator, key: str = XCOM_RETURN_KEY) -> None:
        if not isinstance(operator, AbstractOperator):
            raise TypeError(f"XComArg refers to a task, got {operator!r}")
        if not isinstance(key, str) or not key:
            raise TypeError(f"an XComArg key is a non-empty str, got {key!r}")
        self.operator = operator
        self.key = key

    def __repr__(self) -> str:
        if self.key == XCOM_RETURN_KEY:
            return f"XComArg({self.operator!r})"
        return f"XComArg({self.operator!r}, {self.key!r})"

    def __str__(self) -> str:
        """Airflow's template text for this result (for templated fields)."""
        dag_id = self.operator.dag.dag_id if self.operator.dag is not None else None
        return (
            f"{{{{ task_instance.xcom_pull(task_ids={self.operator.task_id!r}, "
            f"dag_id={dag_id!r}, key={self.key!r}) }}}}"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, XComArg):
            return NotImplemented
        return self.operator is other.operator and self.key == other.key

    def __hash__(self) -> int:
        return hash((id(self.operator), self.key))

    def __getitem__(self, key: str) -> XComArg:
        """The result ``key`` of the same task (``a()["total"]``)."""
        if not isinstance(key, str):
            raise TypeError(
                f"{caller_location()}: results of task {self.operator.task_id!r} are looked "
                f"up by key (a str), got {key!r}; index a list result inside the task that "
                "receives it"
            )
        return XComArg(self.operator, key)

    def __iter__(self) -> NoReturn:
        raise TypeError(
            f"{caller_location()}: the result of task {self.operator.task_id!r} is not "
            "iterable while the DAG is defined (it does not exist yet); pass it to a task "
            "and iterate there"
        )

    @property
    def roots(self) -> list[AbstractOperator]:
        return [self.operator]

    @property
    def leaves(self) -> list[AbstractOperator]:
        return [self.operator]

    def map(self, function: Callable[[Any], Any]) -> MapXComArg:
        """This result with ``function`` applied to each item when a task receives it (a
        mapped task maps over the transformed items; a dict's items are ``(key, value)``)."""
        return MapXComArg(self, function)

    def zip(self, *others: XComArg | AbstractOperator, fillvalue: Any = NOTSET) -> ZipXComArg:
        """The items of this result and of ``others`` side by side, as tuples: as long as the
        shortest, or the longest with ``fillvalue`` filling in (Python's ``zip`` /
        ``itertools.zip_longest``)."""
        return ZipXComArg([self, *others], fillvalue=fillvalue)

    def sources(self) -> list[XComArg]:
        """The task results this value is made of."""
        return [self]

    def resolve(self, context: Mapping[str, Any]) -> Any:
        """The value in the running task's context (``ti.xcom_pull``)."""
        ti = context["ti"]
        task_id = self.operator.task_id
        value = ti.xcom_pull(task_ids=task_id, key=self.key, default=NOTSET)
        if value is not NOTSET:
            return value
        if self.key == XCOM_RETURN_KEY or getattr(self.operator, "multiple_outputs", False):
            return None
        raise XComNotFound(ti.dag_id, task_id, self.key)


def _items(arg: XComArg, context: Mapping[str, Any]) -> list[Any]:
    """A list or dict result as a list (a dict's ``(key, value)`` items)."""
    value = arg.resolve(context)
    if isinstance(value, Mapping):
        return list(value.items())
    if not isinstance(value, list | tuple):
        raise TypeError(
            f"the result of task {arg.operator.task_id!r} is {type(value).__name__}; map() "
            "and zip() take a list or a dict"
        )
    return list(value)


class MapXComArg(XComArg):
    """``arg.map(function)``: ``function`` applied to each item of a list or dict result."""

    def __init__(self, arg: XComArg, function: Callable[[Any], Any]) -> None:
        if not callable(function):
            raise DagDefinitionError(f"{caller_location()}: map() takes a function")
        super().__init__(arg.operator, arg.key)
        self.arg = arg
        self.function = function

    def __repr__(self) -> str:
        return f"{self.arg!r}.map({getattr(self.function, '__name__', self.function)})"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    @property
    def roots(self) -> list[AbstractOperator]:
        return self.arg.roots

    @property
    def leaves(self) -> list[AbstractOperator]:
        return self.arg.leaves

    def sources(self) -> list[XComArg]:
        return self.arg.sources()

    def resolve(self, context: Mapping[str, Any]) -> Any:
        return [self.function(item) for item in _items(self.arg, context)]


class ZipXComArg(XComArg):
    """``a.zip(b, ...)``: tuples of the items of several list or dict results."""

    def __init__(self, args: list[Any], *, fillvalue: Any = NOTSET) -> None:
        args = [XComArg(a) if isinstance(a, AbstractOperator) else a for a in args]
        for arg in args:
            if not isinstance(arg, XComArg):
                raise DagDefinitionError(
                    f"{caller_location()}: zip() takes task results, got {arg!r}"
                )
        super().__init__(args[0].operator, args[0].key)
        self.args = args
        self.fillvalue = fillvalue

    def __repr__(self) -> str:
        return f"zip({', '.join(map(repr, self.args))})"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    @property
    def roots(self) -> list[AbstractOperator]:
        return [arg.operator for arg in self.args]

    @property
    def leaves(self) -> list[AbstractOperator]:
        return [arg.operator for arg in self.args]

    def sources(self) -> list[XComArg]:
        return [source for arg in self.args for source in arg.sources()]

    def resolve(self, context: Mapping[str, Any]) -> Any:
        columns = [_items(arg, context) for arg in self.args]
        if self.fillvalue is NOTSET:
            return list(zip(*columns, strict=False))
        return list(itertools.zip_longest(*columns, fillvalue=self.fillvalue))


def _walk(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with ``leaf`` applied inside plain lists, tuples, sets and dict values."""
    kind = type(value)
    if kind is list or kind is tuple:
        return kind(_walk(item, leaf) for item in value)
    if kind is set or kind is frozenset:
        return kind(_walk(item, leaf) for item in value)
    if kind is dict:
        return {key: _walk(item, leaf) for key, item in value.items()}
    return leaf(value)


def _as_reference(value: Any) -> Any:
    if isinstance(value, AbstractOperator):
        return XComArg(value)
    if isinstance(value, DependencyMixin) and not isinstance(value, XComArg):
        raise DagDefinitionError(
            f"{caller_location()}: {value!r} passed as a task argument; only a task (its "
            "result) or a task's result can be passed: order a task group with >> instead"
        )
    return value


def as_references(value: Any) -> Any:
    """A task's arguments with each task in them replaced by its result (``XComArg``)."""
    return _walk(value, _as_reference)


def iter_references(value: Any) -> Iterator[XComArg]:
    """The ``XComArg``\\ s in a task's arguments (inside plain containers too)."""
    found: list[XComArg] = []

    def collect(item: Any) -> Any:
        if isinstance(item, XComArg):
            found.append(item)
        return item

    _walk(value, collect)
    return iter(found)


def resolve_references(value: Any, context: Mapping[str, Any]) -> Any:
    """A task's arguments with results (``XComArg``) and ``@dag`` params (``DagParam``)
    replaced by their values in the running task's context."""

    def resolve(item: Any) -> Any:
        if isinstance(item, XComArg | DagParam):
            return item.resolve(context)
        return item

    return _walk(value, resolve)
