"""Named mapping: a copy of a mapped task shown by its ``map_index_template``.

Airflow's ``map_index_template`` (an operator argument, ``@task(map_index_template=...)``)
is a Jinja2 template rendered once the copy ran, with the copy's context, including names
the task put in it while it ran (``get_current_context()["label"] = ...``). What it renders
to is stored with the copy (``task_instance.rendered_map_index``, at most 250 characters)
and shown where map indexes are.

As Airflow's task runner does: after a successful ``execute`` the template renders
strictly, before the results are stored, so a template that cannot render (an undefined
name, bad syntax) fails the try with an error naming it (``strict=True``); after a failed
or skipped try it renders leniently, and a template that cannot render leaves the copy its
number and its log says why, never masking the task's own error. A template that renders to
an empty string names nothing either.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from engine.execution.templates import TemplateRenderError, render_template

if TYPE_CHECKING:
    from collections.abc import Mapping

    from engine.authoring.baseoperator import BaseOperator

__all__ = ("RENDERED_MAP_INDEX_MAX_CHARS", "render_map_index")

#: the longest stored rendering (``task_instance.rendered_map_index``), as Airflow's column
RENDERED_MAP_INDEX_MAX_CHARS: Final = 250

logger = logging.getLogger(__name__)


def render_map_index(
    task: BaseOperator | None, context: Mapping[str, Any] | None, *, strict: bool = False
) -> str | None:
    """The name of the copy ``context`` belongs to: ``task.map_index_template`` rendered
    with ``context``; None for an unmapped task, no template, or a rendering that gave
    nothing. A template that cannot render raises ``TemplateRenderError`` when ``strict``
    (the try succeeded), else gives None and logs why."""
    template = getattr(task, "map_index_template", None)
    if task is None or context is None or template is None:
        return None
    if int(context.get("map_index", -1)) < 0:
        return None
    try:
        rendered = render_template(template, context, task=task)
    except Exception as exc:  # any error: a failed try keeps its own error
        if strict:
            raise TemplateRenderError(
                f"task {task.task_id!r}: map_index_template {template!r} did not render: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        logger.warning(
            "map_index_template of task %r did not render (%s: %s); the copy keeps its map "
            "index %s",
            task.task_id,
            type(exc).__name__,
            exc,
            context.get("map_index"),
            extra={"action": "map_index_template_failed"},
        )
        return None
    text = "" if rendered is None else str(rendered)
    if not text:
        logger.warning(
            "map_index_template of task %r rendered to nothing; the copy keeps its map index %s",
            task.task_id,
            context.get("map_index"),
            extra={"action": "map_index_template_empty"},
        )
        return None
    if len(text) > RENDERED_MAP_INDEX_MAX_CHARS:
        logger.warning(
            "map_index_template of task %r rendered to %d characters; kept the first %d",
            task.task_id,
            len(text),
            RENDERED_MAP_INDEX_MAX_CHARS,
            extra={"action": "map_index_template_truncated"},
        )
        text = text[:RENDERED_MAP_INDEX_MAX_CHARS]
    return text
