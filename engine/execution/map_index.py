"""Named mapping: a copy of a mapped task shown by its ``map_index_template``.

Airflow's ``map_index_template`` (an operator argument, ``@task(map_index_template=...)``)
is a Jinja2 template rendered once the copy ran, with the copy's context, including names
the task put in it while it ran (``get_current_context()["label"] = ...``), whatever the
try's outcome. What it renders to is stored with the copy (``task_instance.
rendered_map_index``, at most 250 characters) and shown where map indexes are. A template
that cannot render (an undefined name, bad syntax) fails nothing: the copy keeps its numeric
index and its log says why; so does a template that renders to an empty string.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from engine.execution.templates import render_template

if TYPE_CHECKING:
    from collections.abc import Mapping

    from engine.authoring.baseoperator import BaseOperator

__all__ = ("RENDERED_MAP_INDEX_MAX_CHARS", "render_map_index")

#: the longest stored rendering (``task_instance.rendered_map_index``), as Airflow's column
RENDERED_MAP_INDEX_MAX_CHARS: Final = 250

logger = logging.getLogger(__name__)


def render_map_index(task: BaseOperator | None, context: Mapping[str, Any] | None) -> str | None:
    """The name of the copy ``context`` belongs to: ``task.map_index_template`` rendered
    with ``context``; None for an unmapped task, no template, or a rendering that failed or
    gave nothing (logged)."""
    template = getattr(task, "map_index_template", None)
    if task is None or context is None or template is None:
        return None
    if int(context.get("map_index", -1)) < 0:
        return None
    try:
        rendered = render_template(template, context, task=task)
    except Exception as exc:  # noqa: BLE001 - a template never fails the try
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
