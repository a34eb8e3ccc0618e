"""What one ``MqttMessageTrigger`` accepts of the shared messages: pure, no paho.

``MessageFilter`` holds a watcher's declarative rules (``topic_filter``,
``user_property_filter``, ``body_filter``) and its ``apply_function``; ``verdict`` says
whether a message is accepted, skipped, or rejected (and why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from producers.exceptions import ProducerConfigError
from producers.message_filters import (
    MISSING,
    Rejected,
    accepts,
    apply,
    body_matches,
    function_path_problem,
    load_apply_function,
)
from producers.mqtt_core import topic_filter_problem, topic_matches

if TYPE_CHECKING:
    from collections.abc import Callable

    from producers.mqtt_core import MqttMessage


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
        if problem := function_path_problem(self.apply_function):
            problems.append(problem)
        if problems:
            raise ProducerConfigError(f"{where}: " + "; ".join(problems))

    def load(self, trigger_id: int | None) -> None:
        """Import ``apply_function`` (where the trigger runs, once)."""
        if self.apply_function is not None and self.function is None:
            self.function = load_apply_function(self.apply_function, trigger_id)

    def matches_metadata(self, message: MqttMessage) -> bool:
        """The topic and user-property rules (never raise)."""
        if self.topic_filters and not any(
            topic_matches(f, message.topic) for f in self.topic_filters
        ):
            return False
        return all(
            accepts(expected, message.user_properties.get(name, MISSING))
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
        return body_matches(self.body_filter, message.body)

    async def accepts_message(self, message: MqttMessage) -> bool:
        """Every rule, then ``apply_function``; ``Rejected`` when one cannot judge it."""
        if not self.matches_metadata(message) or not self.matches_body(message):
            return False
        if self.function is None:
            return True
        try:
            verdict = await apply(
                self.function, message, self.apply_function_args, self.apply_function_kwargs
            )
        except Exception as exc:  # user code: its error rejects the message
            raise Rejected(f"apply_function raised {type(exc).__name__}: {exc}") from exc
        return bool(verdict)
