"""What every page of ``templates/ui/`` shares: the state looks, time formats and value
formats (``times``, ``values``) as template globals and filters, the section of the top
bar, and reading paging arguments.

Page modules render with ``page(request, template, section, **context)``; the templates
extend ``ui/layout.html`` (api-core's ``base.html`` with the section links).
"""

import json
from datetime import datetime
from functools import partial
from typing import Any, Final
from urllib.parse import quote

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from engine.api.credentials import OPERATOR
from engine.api.security import principal_of
from engine.api.storable import problem_in_value
from engine.api.ui.flash import forget_flash, read_flash
from engine.api.ui.login import safe_next
from engine.api.ui.states import legend, look
from engine.api.ui.templating import render, templates
from engine.api.ui.times import readable_time, with_readable_times
from engine.api.ui.values import class_name, class_origin, json_text, shown, shown_json
from engine.db.database import Database
from engine.views import tasks as tasks_view

NOTHING: Final = "\u2013"  # an en dash: no value
PAGE_SIZE: Final = 50
TIME_FORMAT: Final = "%Y-%m-%d %H:%M:%S"


def short_time(value: str | datetime | None) -> str:
    """A time as ``2026-11-25 19:03:12`` (UTC, to the second; the full value is in the
    element's ``datetime`` / ``title``)."""
    if value is None:
        return NOTHING
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).strftime(TIME_FORMAT)
        except ValueError:
            return value
    return value.strftime(TIME_FORMAT)


def seconds(value: float | None) -> str:
    """A duration or age in seconds as ``0.4 s``, ``12 s``, ``3 min``, ``2.5 h``."""
    if value is None:
        return NOTHING
    if value < 10:
        return f"{value:.1f} s"
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.1f} h"


templates.env.globals.update(state_look=look, state_legend=legend)
templates.env.filters.update(shorttime=short_time, seconds=seconds)
templates.env.filters.update(
    json_text=json_text,
    shown_json=shown_json,
    shown_text=shown,
    class_name=class_name,
    class_origin=class_origin,
    readable_time=readable_time,
    readable_times=with_readable_times,
)


def page(request: Request, name: str, section: str, **context: Any) -> HTMLResponse:
    """The page ``templates/ui/<name>`` with ``context``; ``section`` (a top-bar link such
    as ``/dags``) is marked as the current one. ``status_code`` may be passed. A message
    an action left (``flash``) is shown as the page's ``notice``, once."""
    status = int(context.pop("status_code", 200))
    context["notice"] = context.get("notice") or read_flash(request)  # once, after an action
    response = render(request, f"ui/{name}", {"section": section, **context}, status_code=status)
    forget_flash(request, response)
    return response


def can_operate(request: Request) -> bool:
    """Whether the logged-in user may act (op or admin): pages show actions only then."""
    principal = principal_of(request)
    return principal is not None and principal.can(OPERATOR)


def not_found(detail: str) -> HTTPException:
    return HTTPException(404, detail)


async def task_not_found(
    database: Database, dag_id: str, run_id: str, task_id: str, map_index: int
) -> HTTPException:
    """The 404 of a task instance that is not there, naming what is missing (the run, the
    task, the mapped copy), as the REST API and the CLI say it."""
    detail = await database.read(
        partial(
            tasks_view.missing_task_instance,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            map_index=map_index,
            map_option="map_index",
        )
    )
    return not_found(detail)


def json_object_field(text: str, name: str) -> dict[str, Any] | None:
    """A form's JSON field (``conf``, ``extra``): empty for none, else a JSON object the
    database stores faithfully (``engine.api.storable``: no NaN, NUL, lone surrogate or deep
    nesting, as the REST API checks); a ``ValueError`` that names the field otherwise."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object ({{...}}), not {type(value).__name__}")
    if found := problem_in_value(value, name):
        raise ValueError(found)
    return value


def redirect_back(target: str) -> RedirectResponse:
    """After a form action: back to the page it came from (a path of this site only)."""
    return RedirectResponse(safe_next(target), status_code=303)


def part(text: str) -> str:
    """``text`` as one URL path segment (run ids hold ``:`` and ``+``)."""
    return quote(text, safe="")


def dag_url(dag_id: str) -> str:
    return f"/dags/{part(dag_id)}"


def run_url(dag_id: str, run_id: str) -> str:
    return f"{dag_url(dag_id)}/runs/{part(run_id)}"


def task_url(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    copy = f"?map_index={map_index}" if map_index >= 0 else ""
    return f"{run_url(dag_id, run_id)}/tasks/{part(task_id)}{copy}"


def asset_url(name: str) -> str:
    return "/assets/" + quote(name, safe="/")


templates.env.globals.update(
    dag_url=dag_url, run_url=run_url, task_url=task_url, asset_url=asset_url, url_part=part
)
