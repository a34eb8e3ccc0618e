"""The JSON-schema ``format`` of a ``Param``, checked as Airflow's validator checks it.

Airflow validates params with ``jsonschema`` and its ``FormatChecker``: a string param with
``format="date"`` must hold a date, and a run whose conf gives a bad value is refused when
it is triggered. These are the formats that checker knows in an Airflow install:

- ``date``: ``YYYY-MM-DD``, a real day (``2026-02-30`` is refused);
- ``date-time``: RFC 3339, ``2026-03-10T09:00:00Z`` / ``...T09:00:00.5+02:00`` (a ``T``
  or ``t``, seconds and a UTC offset required, as ``rfc3339-validator``);
- ``time``: ``HH:MM:SS`` with optional fraction and optional UTC offset (Airflow's example
  DAG ``example_params_ui_tutorial`` gives ``"12:13:14"``, which it accepts);
- ``email`` / ``idn-email``: holds an ``@`` (jsonschema's rule, no more);
- ``ipv4`` / ``ipv6``: an address of that family; ``uuid``: the hyphenated form;
- ``regex``: a regular expression Python compiles.

As in JSON Schema, a format applies to strings only (a ``None`` of a ``["null", "string"]``
param passes). Formats this checker does not know pass unchecked, as in jsonschema;
``multiline`` only tells a trigger form to show a text area, and any other unknown name is
warned about once per process (``engine.authoring.params``). Standard library only.
"""

from __future__ import annotations

import ipaddress
import re
import uuid
from datetime import date
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

_DATE: Final = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIME: Final = r"(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})(?:\.\d+)?"
_OFFSET: Final = r"(?:[Zz]|[+-](?P<oh>\d{2}):(?P<om>\d{2}))"
_DATE_TIME: Final = re.compile(rf"(?P<date>\d{{4}}-\d{{2}}-\d{{2}})[Tt]{_TIME}{_OFFSET}")
_LOOSE_TIME: Final = re.compile(rf"{_TIME}{_OFFSET}?")
_UUID_HYPHENS: Final = (8, 13, 18, 23)

#: formats that only shape a trigger form (never a reason to refuse a value)
UI_ONLY_FORMATS: Final = frozenset({"multiline"})


def _is_date(text: str) -> bool:
    if not _DATE.fullmatch(text):
        return False
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def _time_fields_ok(match: re.Match[str]) -> bool:
    hour, minute, second = int(match["h"]), int(match["m"]), int(match["s"])
    if hour > 23 or minute > 59 or second > 60:  # 60: a leap second, as RFC 3339
        return False
    offset_hour, offset_minute = match["oh"], match["om"]
    return offset_hour is None or (int(offset_hour) <= 23 and int(offset_minute) <= 59)


def _is_date_time(text: str) -> bool:
    match = _DATE_TIME.fullmatch(text)
    return match is not None and _is_date(match["date"]) and _time_fields_ok(match)


def _is_time(text: str) -> bool:
    match = _LOOSE_TIME.fullmatch(text)
    return match is not None and _time_fields_ok(match)


def _parses(parse: Callable[[str], object]) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            parse(text)
        except (ValueError, re.error):
            return False
        return True

    return check


def _is_uuid(text: str) -> bool:
    return _parses(uuid.UUID)(text) and all(
        len(text) > pos and text[pos] == "-" for pos in _UUID_HYPHENS
    )


FORMAT_CHECKS: Final[dict[str, Callable[[str], bool]]] = {
    "date": _is_date,
    "date-time": _is_date_time,
    "time": _is_time,
    "email": lambda text: "@" in text,
    "idn-email": lambda text: "@" in text,
    "ipv4": _parses(ipaddress.IPv4Address),
    "ipv6": _parses(ipaddress.IPv6Address),
    "uuid": _is_uuid,
    "regex": _parses(re.compile),
}

_EXAMPLES: Final = {
    "date": "2026-03-10",
    "date-time": "2026-03-10T09:00:00+00:00",
    "time": "09:00:00",
    "email": "ann@example.com",
    "idn-email": "ann@example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "regex": "^[a-z]+$",
}


def format_error(value: object, name: str) -> str | None:
    """Why ``value`` is not a ``name`` (None when it is, is no string, or the format is
    not one this checker knows)."""
    check = FORMAT_CHECKS.get(name)
    if check is None or not isinstance(value, str) or check(value):
        return None
    return f"{value!r} is not a {name!r} (e.g. {_EXAMPLES[name]!r})"
