"""What a JSON value from a request (a run's conf, an event's extra, a form's field) must be
for the database to store it faithfully: the REST API's bodies and the UI's forms check the
same way (``problem_in_value``)."""

from __future__ import annotations

import math
from typing import Any, Final

__all__ = ("MAX_JSON_DEPTH", "problem_in_value")

#: How deeply a JSON value in a body (conf, extra) may nest: deeper ones are refused before
#: anything walks them recursively (reading the run back, rendering its page).
MAX_JSON_DEPTH: Final = 100


def problem_in_value(value: Any, where: str, depth: int = 0) -> str | None:
    """What in a JSON value a database cannot store faithfully, and where: a non-finite
    number (Python's JSON reader accepts NaN and Infinity, JSON does not), a NUL character
    or an unpaired surrogate in a string or key, nesting deeper than ``MAX_JSON_DEPTH``;
    None when there is nothing."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: {value!r} is not a JSON number (NaN and infinities are refused)"
    if isinstance(value, str):
        return _problem_in_text(value, where)
    if isinstance(value, dict | list) and depth >= MAX_JSON_DEPTH:
        return f"{where}: nested deeper than {MAX_JSON_DEPTH} levels"
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        inner = f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]"
        found = (isinstance(key, str) and _problem_in_text(key, f"{where} (a key)")) or (
            problem_in_value(item, inner, depth + 1)
        )
        if found:
            return found
    return None


def _problem_in_text(text: str, where: str) -> str | None:
    if "\x00" in text:
        return f"{where}: text may not hold a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return f"{where}: text holds an unpaired surrogate (not valid Unicode)"
    return None
