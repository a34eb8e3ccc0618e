"""A ``KafkaMessageTrigger`` subclass's own ``filter_shared_stream``, fed single messages.

The shared consumer fans out ``KafkaMessageBatch``es; a subclass that overrides
``filter_shared_stream`` was written for single ``KafkaMessage`` items, as before batches.
``KafkaMessageTrigger.__init_subclass__`` wraps such a filter in ``fed_message_by_message``:
it receives the messages of each batch one by one (a batch is processed, for the ack ledger,
once the filter asks for the message after its last), and its
``reject_shared_stream_event()`` refuses the message it is judging (``MessageRejector``:
the producer dead-letters that one), not its whole batch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from producers.kafka_messages import KafkaMessageBatch

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from producers.kafka_messages import KafkaMessage
    from triggers.base import BaseTrigger, TriggerEvent

__all__ = ("MessageRejector", "fed_message_by_message")


class MessageRejector:
    """``reject_shared_stream_event()`` of a subclass's filter while it judges ``message``:
    refuses that message alone (the producer dead-letters it, its batch's others stay clean)."""

    __slots__ = ("_trigger", "message")

    def __init__(self, trigger: BaseTrigger, message: KafkaMessage) -> None:
        self._trigger = trigger
        self.message = message

    @property
    def trigger_id(self) -> int | None:
        return self._trigger.trigger_id

    def reject_current(self) -> bool:
        self.message.note_rejection(
            self._trigger.trigger_id, "refused by its filter (reject_shared_stream_event())"
        )
        return True


async def _messages_of(
    trigger: BaseTrigger, shared_stream: AsyncIterator[Any]
) -> AsyncIterator[Any]:
    """The messages of the raw events, one by one (a batch's in offset order). The batch is
    processed, for the ack ledger, when the filter asks for the message after its last."""
    from shared_stream.subscriber import route_rejections  # where it runs (the triggerer)

    async for raw in shared_stream:
        if type(raw) is KafkaMessageBatch:
            for message in raw.messages:
                route_rejections(MessageRejector(trigger, message))
                yield message
        else:
            yield raw


def fed_message_by_message(
    own: Callable[[Any, AsyncIterator[Any]], AsyncIterator[TriggerEvent]],
) -> Callable[[Any, AsyncIterator[Any]], AsyncIterator[TriggerEvent]]:
    """A subclass's own ``filter_shared_stream``, written for single ``KafkaMessage`` items,
    fed the messages of the shared consumer's batches one by one."""

    @functools.wraps(own)
    def filter_shared_stream(
        self: BaseTrigger, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        return own(self, _messages_of(self, shared_stream))

    filter_shared_stream.fed_message_by_message = True  # type: ignore[attr-defined]
    return filter_shared_stream
