"""How the pages show stored values: JSON (a run's conf, an event's extra) as text escaped
once, long text (errors, JSON) cut to a size a page can carry, and a class path (a task's
operator, a trigger) as its class name with the module for the hover.

Pure: no request, no template. The templates escape what these return (Jinja autoescape),
so nothing here escapes HTML: JSON is written with ``ensure_ascii=False`` and no ``<``
escaping, unlike Jinja's ``tojson`` (meant for ``<script>``), whose ``\\u003c`` showed up
as such on the page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from engine.authoring.dag_files import DAG_MODULE_PREFIX

#: JSON this short stays on one line (``{"rows": 3}``); longer is indented.
ONE_LINE_JSON_CHARS: Final = 80
#: Longer JSON stays on one line (the box wraps it): Python indents JSON in pure Python,
#: about 0.1 s per MB here, and pages render in the engine's event loop; a box shows only
#: the start of a value that long anyway.
INDENT_UP_TO_CHARS: Final = 100_000
#: A value box shows at most this many characters (a 900 KB conf would weigh on every
#: reload of a page that refreshes itself); the rest is counted and left to the REST API.
SHOWN_VALUE_CHARS: Final = 20_000


def json_text(value: Any) -> str:
    """``value`` as JSON for a person: one line when short (or very long), else indented
    by 2; non-ASCII and ``<>&`` written as themselves (the template escapes them once)."""
    line = json.dumps(value, ensure_ascii=False, default=str)
    if len(line) <= ONE_LINE_JSON_CHARS or len(line) > INDENT_UP_TO_CHARS:
        return line
    return json.dumps(value, ensure_ascii=False, default=str, indent=2)


@dataclass(frozen=True, slots=True)
class ShownText:
    """The part of a text a page shows, and how many characters it leaves out."""

    text: str
    left_out: int


def shown(text: str, limit: int = SHOWN_VALUE_CHARS) -> ShownText:
    """The first ``limit`` characters of ``text`` and the count of those left out."""
    if len(text) <= limit:
        return ShownText(text, 0)
    return ShownText(text[:limit], len(text) - limit)


def shown_json(value: Any, limit: int = SHOWN_VALUE_CHARS) -> ShownText:
    """``json_text(value)``, cut to ``limit`` characters."""
    return shown(json_text(value), limit)


def class_name(classpath: str) -> str:
    """The class of a class path: ``ProcessItemsOneByOne`` for
    ``sluice_dag_b11f..._example.ProcessItemsOneByOne``; the text itself without a dot."""
    return classpath.rpartition(".")[2] or classpath


def class_origin(classpath: str) -> str:
    """Where a class comes from, for the hover: its full class path; for a class a DAG file
    defines (its module is the file's generated ``sluice_dag_<digest>_<stem>``) said so,
    with the file's stem."""
    module, _, name = classpath.rpartition(".")
    if not module.startswith(DAG_MODULE_PREFIX):
        return classpath
    stem = module.removeprefix(DAG_MODULE_PREFIX).partition("_")[2]
    return f"{name}, defined in the DAG file {stem} (module {module})"
