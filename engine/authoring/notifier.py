"""``BaseNotifier``: a callback that sends a notification (Airflow's ``airflow.sdk.BaseNotifier``).

Subclass it, name the attributes that are templates in ``template_fields`` and implement
``notify(context)``; pass an instance where a callback goes::

    class ChatNotifier(BaseNotifier):
        template_fields = ("message",)

        def __init__(self, message: str) -> None:
            super().__init__()
            self.message = message

        def notify(self, context):
            post_to_chat(self.message)

    DAG(..., on_failure_callback=ChatNotifier("{{ dag.dag_id }} failed on {{ ds }}"))
    BashOperator(..., on_success_callback=[ChatNotifier("{{ ti.task_id }} done")])

Called with the callback's context, it renders its template fields with that context (the
task's templates: ``ds``, ``ti``, ``dag``, ``macros``, ``var`` ...) and calls ``notify``; as
Airflow, an exception of ``notify`` is logged, not raised.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import jinja2
import jinja2.sandbox

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from engine.authoring.context import Context

logger = logging.getLogger(__name__)


class BaseNotifier:
    """A callable callback: renders ``template_fields``, then ``notify(context)``."""

    template_fields: ClassVar[Sequence[str]] = ()
    template_ext: ClassVar[Sequence[str]] = ()

    def __init__(self, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"{type(self).__name__}() got unexpected arguments {sorted(kwargs)}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"

    @abstractmethod
    def notify(self, context: Context) -> None:
        """Send the notification."""

    def render_template_fields(self, context: Mapping[str, Any]) -> None:
        """Render each of ``template_fields`` in place with ``context``."""
        for name in self.template_fields:
            setattr(self, name, _render(getattr(self, name), context, tuple(self.template_ext)))

    def __call__(self, *args: Any) -> None:
        if len(args) != 1:
            raise TypeError(
                f"{type(self).__name__} is called with the callback's context only, got "
                f"{len(args)} arguments"
            )
        context = args[0]
        self.render_template_fields(context)
        try:
            self.notify(context)
        except Exception:  # Airflow's: a failed notification is logged, not raised
            logger.exception(
                "Failed to send notification with %s",
                type(self).__name__,
                extra={"action": "notification_failed", "notifier": type(self).__name__},
            )


def _render(value: Any, context: Mapping[str, Any], template_ext: tuple[str, ...]) -> Any:
    """``value`` rendered as the running task renders its templates (``context["ti"]``); a
    context without a task instance (called by hand) renders with a plain strict sandbox."""
    render = getattr(context.get("ti"), "render_template", None)
    if callable(render):
        return render(value, context, template_ext=template_ext)
    return _render_plain(value, context)


def _render_plain(value: Any, context: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        if "{" not in value:
            return value
        env = jinja2.sandbox.SandboxedEnvironment(undefined=jinja2.StrictUndefined)
        return env.from_string(value).render(dict(context))
    if isinstance(value, list | tuple):
        return type(value)(_render_plain(item, context) for item in value)
    if isinstance(value, dict):
        return {key: _render_plain(item, context) for key, item in value.items()}
    return value
