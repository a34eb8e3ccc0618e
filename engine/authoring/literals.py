"""``literal(value)``: a value templates leave alone (Airflow's ``airflow.sdk.literal``).

A template field's strings are Jinja2 templates; wrap one in ``literal`` when it must reach
the task exactly as written (a shell snippet with ``{{``, a JSON template for another tool)::

    BashOperator(task_id="echo", bash_command=literal("echo '{{ not rendered }}'"))

The task sees the wrapped value itself (``engine.execution.templates`` unwraps it instead of
rendering it), inside lists and dicts too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True, slots=True)
class LiteralValue:
    """A value wrapped by ``literal``: rendering gives ``value`` back unrendered."""

    value: Any

    def resolve(self, context: Mapping[str, Any] | None = None) -> Any:
        return self.value


def literal(value: Any) -> LiteralValue:
    """Wrap ``value`` so that template rendering leaves it exactly as it is."""
    return LiteralValue(value)
