"""Dynamic task mapping: what a mapped task maps over, and how many copies it gets.

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
(stored in ``dag_task.mapping``, built by ``source_json``): each expanded argument's literal
length, or the upstream task and key whose result it maps over. ``map_length`` turns that and
the upstream results into the number of copies; an empty input gives none (the task is
skipped), a result that is neither a list nor a dict is an error
(``UnmappableXComTypePushed``), and so is a length over ``MAX_MAP_LENGTH`` (Airflow's ``[core]
max_map_length``).

In the task process, ``MappedOperator.unmap(context)`` builds the operator of one copy: the
partial arguments plus this ``map_index``'s slice of the expanded ones (``sequence_of``,
``unravel``, ``pick``), references resolved. A task whose result a mapped task maps over must
return a list or a dict: the task process fails it otherwise, as Airflow does.
``MappedOperator`` and ``partial`` live in ``engine.authoring.baseoperator`` and
``engine.authoring.partial``; this module is what they and the scheduler share.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.params import NOTSET
from engine.authoring.xcom import XCOM_RETURN_KEY, MapXComArg, XComArg, ZipXComArg
from engine.exceptions import AirflowException

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = (
    "EXPAND",
    "EXPAND_KWARGS",
    "MAX_MAP_LENGTH",
    "UnmappableXComLengthPushed",
    "UnmappableXComTypePushed",
    "XComForMappingNotPushed",
    "cross_product_order",
    "describe_mapping",
    "map_length",
    "mapped_source_ids",
    "pick",
    "sequence_of",
    "source_json",
    "unravel",
)

#: Airflow's ``[core] max_map_length``: the most copies one mapped task may have.
MAX_MAP_LENGTH: Final = 1024
EXPAND: Final = "expand"
EXPAND_KWARGS: Final = "expand_kwargs"


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


# --- run time ---------------------------------------------------------------------------------


def source_json(value: Any) -> dict[str, Any]:
    """How the scheduler counts one expanded argument's items."""
    if isinstance(value, ZipXComArg):
        parts = [source_json(arg) for arg in value.args]
        return {"zip": parts, "longest": value.fillvalue is not NOTSET}
    if isinstance(value, MapXComArg):
        return source_json(value.arg)  # map() keeps the length
    if isinstance(value, XComArg):
        return {"task_id": value.operator.task_id, "key": value.key}
    return {"literal": len(value)}


def sequence_of(value: Any, context: Mapping[str, Any], task_id: str) -> list[Any]:
    """What one expanded argument maps over, as a list (a dict's ``(key, value)`` items)."""
    if isinstance(value, XComArg):
        resolved = value.resolve(context)
        if not isinstance(resolved, list | tuple | dict):
            raise UnmappableXComTypePushed(value.operator.task_id, resolved, for_task=task_id)
        value = resolved
    if isinstance(value, Mapping):
        return list(value.items())
    return list(value)


def pick(items: Sequence[Any], index: int, task_id: str) -> Any:
    if index >= len(items):
        raise IndexError(
            f"mapped task {task_id!r}: map_index {index} is past the {len(items)} items it "
            "maps over (did the upstream result change since the copies were created?)"
        )
    return items[index]


def unravel(index: int, lengths: Sequence[int], task_id: str) -> list[int]:
    """The index into each expanded argument of copy ``index`` (last argument fastest)."""
    total = 1
    for length in lengths:
        total *= length
    pick(range(total), index, task_id)
    out: list[int] = []
    for length in reversed(lengths):
        index, position = divmod(index, length)
        out.append(position)
    return out[::-1]


def cross_product_order(*values: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The order copies map over several arguments (documentation and tests)."""
    return list(itertools.product(*values))


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
