"""``Param``: a DAG or task parameter with a default and a JSON-schema check (Airflow's).

``DAG(params={"limit": Param(10, type="integer", minimum=1), "label": "x"})``: a plain value
becomes ``Param(value)``. A task sees ``context["params"]``: the DAG's params, the task's
over them, then the run's ``conf`` over those (Airflow's ``dag_run_conf_overrides_params``),
each checked by its ``Param``; a value that fails fails the task with
``ParamValidationError``. Defaults are checked when the DAG is defined.

The check covers the JSON-schema keywords ``type`` (string, integer, number, boolean, array,
object, null, or a list of them), ``enum``, ``const``, ``minimum``, ``maximum``,
``exclusiveMinimum``, ``exclusiveMaximum``, ``minLength``, ``maxLength``, ``pattern``,
``minItems``, ``maxItems`` and ``format`` (``date``, ``date-time``, ``time``, ``email`` ...:
``engine.authoring.param_formats``). Other validation keywords are stored, not checked: one
warning per keyword (or unknown format) per process says so. There is no jsonschema
dependency: the authoring API imports only the standard library.

A manual run's ``conf`` is checked when it is triggered (``check_run_conf``, from the specs
the DAG processor stores: ``param_spec``), as Airflow refuses to create a run whose params
do not validate; the task checks again when it builds its context.
"""

from __future__ import annotations

import logging
import math
import operator
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.param_formats import FORMAT_CHECKS, UI_ONLY_FORMATS, format_error
from engine.exceptions import ParamValidationError

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)


class ArgNotSet:
    """The type of ``NOTSET``: no value given (``None`` is a value)."""

    _instance: ArgNotSet | None = None

    def __new__(cls) -> ArgNotSet:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOTSET"

    def __bool__(self) -> bool:
        return False


NOTSET: Final = ArgNotSet()

# Keywords that only describe the param (shown by a UI): never checked, never warned about.
_ANNOTATIONS: Final = frozenset(
    {"title", "description", "description_md", "examples", "values_display", "section"}
)
_CHECKED: Final = frozenset(
    {
        "type",
        "enum",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "format",
    }
)
_unchecked_warned: set[str] = set()


def _is_integer(value: object) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _is_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not isinstance(value, float) or math.isfinite(value)


_TYPE_CHECKS: Final[dict[str, Callable[[object], bool]]] = {
    "string": lambda value: isinstance(value, str),
    "integer": _is_integer,
    "number": _is_number,
    "boolean": lambda value: isinstance(value, bool),
    "array": lambda value: isinstance(value, list | tuple),
    "object": lambda value: isinstance(value, dict),
    "null": lambda value: value is None,
}


def _check_schema(schema: Mapping[str, Any], *, where: str) -> None:
    types = schema.get("type")
    names = types if isinstance(types, list | tuple) else [] if types is None else [types]
    unknown = [name for name in names if name not in _TYPE_CHECKS]
    if unknown:
        raise DagDefinitionError(
            f"{where}: type {unknown[0]!r} is not a JSON-schema type; use one of "
            f"{sorted(_TYPE_CHECKS)}"
        )
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except (re.error, TypeError) as exc:
            raise DagDefinitionError(f"{where}: pattern is invalid: {exc}") from exc
    fmt = schema.get("format")
    if fmt is not None and (not isinstance(fmt, str) or fmt not in FORMAT_CHECKS):
        if fmt not in UI_ONLY_FORMATS:
            _warn_unchecked(where, "format", f"format={fmt}")
    for keyword in sorted(set(schema) - _CHECKED - _ANNOTATIONS):
        _warn_unchecked(where, "keyword", keyword)


def _warn_unchecked(where: str, what: str, keyword: str) -> None:
    if keyword not in _unchecked_warned:
        _unchecked_warned.add(keyword)
        logger.warning(
            "%s: schema %s %r is stored but not checked yet",
            where,
            what,
            keyword,
            extra={"action": "param_keyword_unchecked", "keyword": keyword},
        )


def _type_error(value: object, schema: Mapping[str, Any]) -> str | None:
    types = schema.get("type")
    if types is None:
        return None
    names = list(types) if isinstance(types, list | tuple) else [types]
    if any(_TYPE_CHECKS[name](value) for name in names):
        return None
    wanted = names[0] if len(names) == 1 else f"one of {names}"
    return f"{value!r} is not of type {wanted}"


_BOUNDS: Final[tuple[tuple[str, Callable[[Any, Any], bool], str], ...]] = (
    ("minimum", operator.ge, "less than the minimum"),
    ("maximum", operator.le, "greater than the maximum"),
    ("exclusiveMinimum", operator.gt, "not greater than"),
    ("exclusiveMaximum", operator.lt, "not less than"),
)


def _range_error(value: object, schema: Mapping[str, Any]) -> str | None:
    if not _is_number(value):
        return None
    for keyword, holds, words in _BOUNDS:
        if keyword in schema and not holds(value, schema[keyword]):
            return f"{value!r} is {words} {schema[keyword]!r}"
    return None


def _size_error(value: object, schema: Mapping[str, Any]) -> str | None:
    if isinstance(value, str):
        low, high, unit = schema.get("minLength"), schema.get("maxLength"), "characters"
    elif isinstance(value, list | tuple):
        low, high, unit = schema.get("minItems"), schema.get("maxItems"), "items"
    else:
        return None
    if low is not None and len(value) < low:
        return f"{value!r} has fewer than {low} {unit}"
    if high is not None and len(value) > high:
        return f"{value!r} has more than {high} {unit}"
    pattern = schema.get("pattern")
    if isinstance(value, str) and pattern is not None and re.search(pattern, value) is None:
        return f"{value!r} does not match the pattern {pattern!r}"
    return None


def _value_error(value: object, schema: Mapping[str, Any]) -> str | None:
    if "enum" in schema and value not in schema["enum"]:
        return f"{value!r} is not one of {list(schema['enum'])!r}"
    if "const" in schema and value != schema["const"]:
        return f"{value!r} is not {schema['const']!r}"
    return (
        _type_error(value, schema)
        or _range_error(value, schema)
        or _size_error(value, schema)
        or format_error(value, str(schema.get("format")))
    )


class Param:
    """A parameter: ``Param(default, description=None, type=..., **json_schema_keywords)``."""

    __slots__ = ("description", "schema", "value")

    def __init__(
        self,
        default: Any = NOTSET,
        description: str | None = None,
        type: str | list[str] | None = None,  # Airflow's keyword
        **schema: Any,
    ) -> None:
        where = f"{caller_location()}: Param({default!r})"
        if description is not None and not isinstance(description, str):
            raise DagDefinitionError(f"{where}: description must be a string")
        self.value: Any = default
        self.description = description
        self.schema: dict[str, Any] = dict(schema)
        if type is not None:
            self.schema["type"] = list(type) if isinstance(type, list | tuple) else type
        if description is not None:
            self.schema.setdefault("description", description)
        _check_schema(self.schema, where=where)

    def __repr__(self) -> str:
        return f"Param({self.value!r}, schema={self.schema!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Param):
            return NotImplemented
        return (self.value, self.schema) == (other.value, other.schema)

    __hash__ = None  # type: ignore[assignment]  # schema is a mutable dict

    @property
    def has_value(self) -> bool:
        return self.value is not NOTSET

    def resolve(self, value: Any = NOTSET, *, name: str = "param") -> Any:
        """``value`` (or the default when NOTSET), checked; ``ParamValidationError`` if bad."""
        final = self.value if value is NOTSET else value
        if final is NOTSET:
            raise ParamValidationError(
                f"param {name!r}: no value passed and the Param has no default; pass it in "
                "the run's conf"
            )
        problem = _value_error(final, self.schema)
        if problem is not None:
            raise ParamValidationError(f"param {name!r}: {problem}")
        return final

    def dump(self) -> dict[str, Any]:
        """Plain data: ``{"value": ..., "description": ..., "schema": {...}}``."""
        value = None if self.value is NOTSET else self.value
        return {"value": value, "description": self.description, "schema": dict(self.schema)}


class DagParam:
    """A ``@dag`` function's parameter: stands for ``params[name]`` of the running DAG.

    Passed to a ``@task`` call inside the ``@dag`` function, it becomes the run's value of
    the param when the task runs (the run's ``conf`` can override the default).
    """

    __slots__ = ("default", "name")

    def __init__(self, name: str, default: Any) -> None:
        self.name = name
        self.default = default

    def __repr__(self) -> str:
        return f"DagParam({self.name!r}, default={self.default!r})"

    def resolve(self, context: Mapping[str, Any]) -> Any:
        params = context.get("params")
        if isinstance(params, dict) and self.name in params:
            return params[self.name]
        return self.default


def as_params(value: object, *, where: str) -> dict[str, Param]:
    """``params=`` normalized: a mapping of names to ``Param`` (plain values wrapped)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DagDefinitionError(f"{where}: params must be a dict, got {value!r}")
    params: dict[str, Param] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not name:
            raise DagDefinitionError(f"{where}: param names must be strings, got {name!r}")
        param = item if isinstance(item, Param) else Param(item)
        if param.has_value:
            try:
                param.resolve(name=name)
            except ParamValidationError as exc:
                raise DagDefinitionError(f"{where}: the default of {exc}") from exc
        params[name] = param
    return params


def resolve_params(
    dag_params: Mapping[str, Param],
    task_params: Mapping[str, Param],
    conf: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """What ``context["params"]`` holds: DAG params, the task's over them, ``conf`` over all.

    Every value with a ``Param`` is checked (``ParamValidationError``); a conf key without
    one is passed as it is (as in Airflow).
    """
    merged: dict[str, Param] = {**dag_params, **task_params}
    overrides = dict(conf or {})
    values = {
        name: param.resolve(overrides.pop(name, NOTSET), name=name)
        for name, param in merged.items()
    }
    values.update(overrides)
    return values


def param_spec(param: Param) -> dict[str, Any]:
    """What the DAG processor stores of a param (JSON): ``Param.dump()`` and ``has_value``."""
    return {**param.dump(), "has_value": param.has_value}


def params_from_specs(specs: Mapping[str, Any]) -> dict[str, Param]:
    """The params of stored ``param_spec`` documents (entries of another shape, stored
    before specs were, are left out)."""
    params: dict[str, Param] = {}
    for name, spec in specs.items():
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
            continue
        param = object.__new__(Param)
        param.value = spec.get("value") if spec.get("has_value", True) else NOTSET
        param.description = spec.get("description")
        param.schema = dict(spec["schema"])
        params[name] = param
    return params


def check_run_conf(specs: Mapping[str, Any] | None, conf: Mapping[str, Any] | None) -> None:
    """Refuse a run's ``conf`` its DAG's params do not accept (``ParamValidationError``
    naming the param): each param's value from ``conf``, else its default, checked."""
    if specs:
        resolve_params(params_from_specs(specs), {}, conf)
