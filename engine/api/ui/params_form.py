"""The trigger form generated from a DAG's ``Param``s, and reading it back into a run's conf.

Each param gets one field chosen from its schema (Airflow 3's trigger form does the same):
``enum`` -> a select, ``boolean`` -> a checkbox, ``integer`` / ``number`` -> a number
input, ``array`` / ``object`` -> a JSON textarea, anything else -> a text input; a param
without a ``type`` is typed by its default's value. A ``null`` among the types lets an
empty field mean None. Each value read is checked by its ``Param`` (``Param.resolve``, the
check ``trigger_dag`` makes again when it creates the run), and a problem is kept with its
field so the page shows it next to it, with what was typed kept.

Pure: no I/O. Inputs are named ``param:<name>``; ``FORM_MARK`` tells a form with param
fields from a bare conf textarea (the DAG list's quick trigger).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.params import NOTSET, Param, params_from_specs
from engine.exceptions import ParamValidationError

if TYPE_CHECKING:
    from collections.abc import Mapping

FIELD_PREFIX: Final = "param:"
#: The hidden field a params form carries (``form=params``).
FORM_MARK: Final = "params"
#: A param without a declared type is typed by its default (bool before int: a bool is one).
_BY_VALUE: Final = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (list, "array"),
    (dict, "object"),
    (str, "string"),
)


@dataclass(frozen=True, slots=True)
class ParamField:
    """One field of the form: ``widget`` is text, integer, number, checkbox, select or
    json; ``text`` what the input holds (``options``: a select's (value, shown) pairs,
    values as JSON text); ``error`` the problem with the value read, if any."""

    name: str
    widget: str
    title: str
    description: str | None
    text: str
    checked: bool
    options: tuple[tuple[str, str], ...]
    required: bool
    error: str | None

    @property
    def input_name(self) -> str:
        return FIELD_PREFIX + self.name


class _NoValue(Exception):
    """The field was left empty and the param takes no None: its default applies."""


def _types(param: Param) -> tuple[str | None, bool]:
    """The param's main JSON type (None: unknown) and whether an empty field means None.

    Without a declared type, the default's type is the main one, and an empty field means
    None only when the default is None."""
    declared = param.schema.get("type")
    if declared is None:
        value = param.value if param.has_value else NOTSET
        main = next((name for kind, name in _BY_VALUE if isinstance(value, kind)), None)
        return main, value is None
    names = list(declared) if isinstance(declared, list | tuple) else [declared]
    return next((n for n in names if n != "null"), None), "null" in names


_WIDGETS: Final = {
    "boolean": "checkbox",
    "integer": "integer",
    "number": "number",
    "array": "json",
    "object": "json",
}


def widget_of(param: Param) -> str:
    """The field a param gets: select (enum), checkbox, integer, number, json or text."""
    if "enum" in param.schema:
        return "select"
    main, _ = _types(param)
    return _WIDGETS.get(main or "", "text")


def value_text(widget: str, value: Any) -> str:
    """A value as its input shows it."""
    if value is None or value is NOTSET:
        return "" if widget != "select" else "null"
    if widget in ("json", "select"):
        return json.dumps(value, indent=2 if widget == "json" else None, sort_keys=False)
    return str(value)


def fields(
    specs: Mapping[str, Any],
    *,
    values: Mapping[str, Any] | None = None,
    texts: Mapping[str, str] | None = None,
    errors: Mapping[str, str] | None = None,
) -> list[ParamField]:
    """The form's fields: filled from ``texts`` (what was typed), else ``values`` (a conf),
    else the params' defaults."""
    shown = []
    for name, param in params_from_specs(specs).items():
        widget = widget_of(param)
        value = (values or {}).get(name, param.value)
        text = (texts or {}).get(name, value_text(widget, value))
        checked = text == "on" if texts is not None and widget == "checkbox" else value is True
        shown.append(
            ParamField(
                name=name,
                widget=widget,
                title=str(param.schema.get("title") or name),
                description=param.description,
                text=text,
                checked=checked,
                options=_options(param) if widget == "select" else (),
                required=not param.has_value,
                error=(errors or {}).get(name),
            )
        )
    return shown


def _options(param: Param) -> tuple[tuple[str, str], ...]:
    shown_as = param.schema.get("values_display")
    labels = shown_as if isinstance(shown_as, dict) else {}
    return tuple(
        (json.dumps(v), str(labels.get(str(v), "(none)" if v is None else v)))
        for v in param.schema["enum"]
    )


def read_form(
    specs: Mapping[str, Any], form: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """The params' values read from a submitted form: (values, problems by param name, the
    texts typed by param name). A field left empty whose param takes no None is left out
    (its default applies; without a default, that is the problem shown)."""
    values: dict[str, Any] = {}
    problems: dict[str, str] = {}
    texts: dict[str, str] = {}
    for name, param in params_from_specs(specs).items():
        widget = widget_of(param)
        typed = form.get(FIELD_PREFIX + name)
        texts[name] = "on" if widget == "checkbox" and typed is not None else typed or ""
        try:
            value = _parse(param, widget, typed)
        except _NoValue:
            value = NOTSET
        except ValueError as exc:
            problems[name] = str(exc)
            continue
        problem = check(param, name, value)
        if problem is not None:
            problems[name] = problem
        elif value is not NOTSET:
            values[name] = value
    return values, problems, texts


def check_conf(specs: Mapping[str, Any], conf: Mapping[str, Any]) -> dict[str, str]:
    """Each param's problem with ``conf`` (its value there, else its default), by name."""
    problems = {}
    for name, param in params_from_specs(specs).items():
        problem = check(param, name, conf.get(name, NOTSET))
        if problem is not None:
            problems[name] = problem
    return problems


def check(param: Param, name: str, value: Any) -> str | None:
    """The param's problem with ``value`` (NOTSET: its default), None if it takes it."""
    try:
        param.resolve(value, name=name)
    except ParamValidationError as exc:
        return str(exc).removeprefix(f"param {name!r}: ")
    return None


def _parse(param: Param, widget: str, typed: str | None) -> Any:
    """A field's text as the param's value; ``ValueError`` saying what is wrong."""
    if widget == "checkbox":
        return typed is not None
    if typed is None:  # no such field posted: the default applies
        raise _NoValue
    text = (typed or "").strip() if widget != "text" else typed or ""
    _, nullable = _types(param)
    if text == "" and widget != "select":
        if nullable:
            return None
        if widget != "text" or not param.has_value:
            raise _NoValue
        return ""
    if widget == "integer":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a whole number") from None
    if widget == "number":
        return _number(text)
    if widget in ("json", "select"):
        return _json(text)
    return text


def _number(text: str) -> int | float:
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{text!r} is not a finite number")
    return int(number) if number.is_integer() and "." not in text else number


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value (JSON has no NaN or infinity)")


def _json(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from exc
