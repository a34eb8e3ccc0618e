"""The partition key of a Kafka watcher's events: its rule, checked against the consumer's
settings, and the key a message gives (``producers.partition_keys`` for what each option
means and why a message without a valid key is rejected)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from producers.exceptions import ProducerConfigError
from producers.kafka_codec import Undecodable, decoded_value
from producers.partition_keys import (
    NoKey,
    PartitionKeyRule,
    field_key,
    function_key,
    key_text,
    named_key,
    partition_key_rule,
    utf8,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from producers.kafka_messages import KafkaMessage
    from producers.kafka_settings import KafkaSettings


def kafka_key_rule(settings: KafkaSettings, **options: Any) -> PartitionKeyRule | None:
    """The watcher's partition key rule from its ``partition_key_*`` keywords; refused where
    a message without a valid key would stop its partition for good (no dead-letter topic,
    ``on_unclean`` left to its default, ``"stop"``)."""
    rule = partition_key_rule("KafkaMessageTrigger", **options)
    if rule is not None and settings.on_unclean is None and not settings.dead_letter_topic:
        raise ProducerConfigError(
            f"KafkaMessageTrigger {rule.describe()}: a message that gives no valid key is "
            "rejected, and without a dead_letter_topic on_unclean defaults to 'stop', which "
            "would stop its partition at that message for good; set dead_letter_topic "
            "(rejected messages are copied there, then committed past), or "
            "on_unclean='commit' (skipped with a warning), or on_unclean='stop' to choose that"
        )
    return rule


def partition_key_of(
    message: KafkaMessage,
    rule: PartitionKeyRule,
    value_format: str,
    function: Callable[[Any], Any] | None,
) -> str:
    """The key ``rule`` takes from a message whose value decoded as ``value_format``, or
    ``NoKey`` saying why there is none; ``function`` is a function rule's, loaded."""
    if rule.source == "field":
        decoded = decoded_value(message, value_format)  # cached by the filter
        if isinstance(decoded, Undecodable) or decoded[0] != "json":
            raise NoKey("the value is not JSON")
        return field_key(decoded[1], rule)
    if rule.source == "header":
        headers: dict[str, bytes | None] = {}
        for name, value in message.headers:
            headers.setdefault(name, value)  # the first of a repeated header
        return named_key(headers, rule, "header")
    if rule.source == "message_key":
        if message.key is None:
            raise NoKey("the message has no key")
        return key_text(utf8(message.key, "the message key"), "the message key")
    assert function is not None, "the trigger loads its partition_key_function first"
    return function_key(function, message)
