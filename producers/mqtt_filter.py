"""What one ``MqttMessageTrigger`` accepts of the shared messages: pure, no paho.

``MessageFilter`` holds a watcher's declarative rules (``topic_filter``,
``user_property_filter``, ``body_filter``) and its ``apply_function``; ``verdict`` says
whether a message is accepted, skipped, or rejected (and why).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from producers.exceptions import ProducerConfigError
from producers.mqtt_core import topic_filter_problem, topic_matches
from producers.partition_keys import is_dotted_path

if TYPE_CHECKING:
    from collections.abc import Callable

    from producers.mqtt_core import MqttMessage

_MISSING: Final = object()


def lookup(document: Any, path: str) -> Any:
    """The value at a dotted ``path`` of nested JSON objects, or ``_MISSING``."""
    node = document
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def accepts(expected: Any, actual: Any) -> bool:
    """``actual`` equals ``expected`` (or one of them, for a list); ``true`` is not ``1``."""
    options = expected if isinstance(expected, list) else [expected]
    return any(
        actual is not _MISSING
        and actual == option
        and isinstance(actual, bool) == isinstance(option, bool)
        for option in options
    )


class Rejected(Exception):
    """The message is refused by this watcher (dead-letter path); the text says why."""


@dataclass(slots=True)
class MessageFilter:
    """One watcher's rules. Every rule given must hold; with none, every message matches."""

    topic_filters: tuple[str, ...] = ()
    user_property_filter: dict[str, Any] = field(default_factory=dict)
    body_filter: dict[str, Any] = field(default_factory=dict)
    apply_function: str | None = None
    apply_function_args: list[Any] = field(default_factory=list)
    apply_function_kwargs: dict[str, Any] = field(default_factory=dict)
    function: Callable[..., Any] | None = None

    def check(self, where: str) -> None:
        problems = [p for t in self.topic_filters if (p := topic_filter_problem(t))]
        if self.apply_function is not None and not is_dotted_path(self.apply_function):
            problems.append(
                f"apply_function must be a dotted path 'package.module.function', got "
                f"{self.apply_function!r}"
            )
        if problems:
            raise ProducerConfigError(f"{where}: " + "; ".join(problems))

    def load(self, trigger_id: int | None) -> None:
        """Import ``apply_function`` (where the trigger runs, once)."""
        path = self.apply_function
        if path is None or self.function is not None:
            return
        module_name, _, name = path.rpartition(".")
        try:
            function = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as exc:
            raise ProducerConfigError(
                f"trigger {trigger_id}: cannot import apply_function {path!r}: {exc}; check "
                "the dotted path and that its module is importable by the triggerer"
            ) from exc
        if not callable(function):
            raise ProducerConfigError(
                f"trigger {trigger_id}: apply_function {path!r} is not callable"
            )
        self.function = function

    def matches_metadata(self, message: MqttMessage) -> bool:
        """The topic and user-property rules (never raise)."""
        if self.topic_filters and not any(
            topic_matches(f, message.topic) for f in self.topic_filters
        ):
            return False
        return all(
            accepts(expected, message.user_properties.get(name, _MISSING))
            for name, expected in self.user_property_filter.items()
        )

    def matches_body(self, message: MqttMessage) -> bool:
        """The body rules; ``Rejected`` for a payload they cannot apply to."""
        if not self.body_filter:
            return True
        if not message.body_is_json or not isinstance(message.body, dict):
            raise Rejected(
                f"the payload is not a JSON object; body_filter {sorted(self.body_filter)} "
                "cannot apply"
            )
        return all(
            accepts(expected, lookup(message.body, path))
            for path, expected in self.body_filter.items()
        )

    async def accepts_message(self, message: MqttMessage) -> bool:
        """Every rule, then ``apply_function``; ``Rejected`` when one cannot judge it."""
        if not self.matches_metadata(message) or not self.matches_body(message):
            return False
        if self.function is None:
            return True
        try:
            verdict = self.function(
                message, *self.apply_function_args, **self.apply_function_kwargs
            )
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception as exc:  # user code: its error rejects the message
            raise Rejected(f"apply_function raised {type(exc).__name__}: {exc}") from exc
        return bool(verdict)
