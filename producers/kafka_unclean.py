"""What happens to Kafka messages that were not cleanly delivered (``on_unclean``, see
``producers.kafka``): which ones are (``per_message``), their copies on the dead-letter
topic with ``sluice.dead_letter.*`` headers (``send_dead_letters``, ``dead_letter_headers``),
and the error of ``on_unclean="stop"`` (``unclean_stop_error``).
"""

from __future__ import annotations

import json
from typing import Any, Final, Protocol

import anyio
from aiokafka import errors as kafka_errors

from producers.exceptions import BrokerUnavailable, UncleanEventError
from producers.kafka_errors import translate_kafka_error
from producers.kafka_messages import KafkaMessage, KafkaMessageBatch, KafkaOffset
from shared_stream.producer import AdvanceItem, AdvanceOutcome

DEAD_LETTER_HEADER: Final = "sluice.dead_letter."
DEAD_LETTER_ERRORS_MAX_CHARS: Final = 4_000


def outcome_text(item: AdvanceItem) -> str:
    o = item.outcome
    return f"acked={o.acked} failed={o.failed} rejected={o.rejected}"


def _reason(item: AdvanceItem) -> str:
    if item.outcome.rejected:
        return "rejected"
    return "failed" if item.outcome.failed else "no_subscribers"


def dead_letter_headers(
    item: AdvanceItem, message: KafkaMessage, group_id: str
) -> list[tuple[str, bytes]]:
    """The ``sluice.dead_letter.*`` headers added to a dead-lettered copy of ``message``."""
    rejected_by = ",".join(str(r.trigger_id) for r in message.rejections)
    errors = json.dumps(
        [{"trigger_id": r.trigger_id, "reason": r.reason} for r in message.rejections]
    )
    if len(errors) > DEAD_LETTER_ERRORS_MAX_CHARS:
        errors = errors[: DEAD_LETTER_ERRORS_MAX_CHARS - 3] + "..."
    pairs = {
        "reason": _reason(item),
        "outcome": outcome_text(item),
        "source": message.coordinates,
        "group": group_id,
        "rejected_by": rejected_by,
        "errors": errors,
    }
    return [(DEAD_LETTER_HEADER + name, text.encode()) for name, text in pairs.items()]


def unclean_stop_error(entry: tuple[AdvanceItem, KafkaMessage], where: str) -> UncleanEventError:
    item, message = entry
    reasons = "; ".join(f"trigger {r.trigger_id}: {r.reason}" for r in message.rejections)
    return UncleanEventError(
        f"Kafka message {message.coordinates} ({where}) was not cleanly delivered "
        f"({outcome_text(item)}{'; ' + reasons if reasons else ''}) and on_unclean='stop': the "
        f"shared stream stops and the broker redelivers from offset {message.offset}. Set "
        "dead_letter_topic, or on_unclean='commit' to skip such messages"
    )


class DeadLetterSource(Protocol):
    """The producer whose messages are dead-lettered (``producers.kafka``)."""

    group_id: str
    dead_letter_topic: str | None
    advance_timeout_s: float

    @property
    def where(self) -> str: ...

    @property
    def address(self) -> str: ...


async def send_dead_letters(
    source: DeadLetterSource, client: Any, items: list[tuple[AdvanceItem, KafkaMessage]]
) -> None:
    """Copy each message to ``source``'s dead-letter topic, with its dead-letter headers,
    through ``client`` (an ``AIOKafkaProducer``); wait for every send, at most
    ``source.advance_timeout_s``."""
    topic = source.dead_letter_topic
    assert topic is not None
    group_id, where, address = source.group_id, source.where, source.address
    try:
        with anyio.fail_after(source.advance_timeout_s):
            sent = [
                await client.send(
                    topic,
                    value=message.value,
                    key=message.key,
                    headers=[*message.headers, *dead_letter_headers(item, message, group_id)],
                )
                for item, message in items
            ]
            for future in sent:
                await future
    except TimeoutError as exc:
        raise BrokerUnavailable(
            f"sending {len(items)} message(s) to dead-letter topic {topic!r} at "
            f"{where} took more than {source.advance_timeout_s}s",
            address=address,
        ) from exc
    except kafka_errors.KafkaError as exc:
        raise translate_kafka_error(
            exc, doing=f"dead-lettering to {topic!r}", where=where, address=address
        ) from exc


def per_message(
    raws: list[tuple[AdvanceItem, KafkaMessage | KafkaMessageBatch]],
) -> list[tuple[AdvanceItem, KafkaMessage]]:
    """Each message of ``raws`` with the outcome it was resolved with.

    A batch's messages share its outcome, except the ones a subscriber refused alone
    (``note_rejection``): those count each rejection as a rejected subscriber instead of
    an acked one. A single message stands for itself (per-message mode).
    """
    if all(type(raw) is KafkaMessage for _, raw in raws):
        return raws  # type: ignore[return-value]  # per-message mode: nothing to split
    live: list[tuple[AdvanceItem, KafkaMessage]] = []
    for item, raw in raws:
        if type(raw) is not KafkaMessageBatch:
            live.append((item, raw))  # type: ignore[arg-type]
            continue
        outcome = item.outcome
        messages = raw.messages
        if outcome.is_clean and not any(message.rejections for message in messages):
            live.append((item, messages[-1]))  # clean throughout: its last one commits it
            continue
        for message in messages:
            rejections = message.rejections
            if not rejections:
                live.append((item, message))
                continue
            refused = len(rejections)
            own = AdvanceOutcome(
                acked=max(outcome.acked - refused, 0),
                failed=outcome.failed,
                rejected=outcome.rejected + refused,
            )
            offset = tuple.__new__(KafkaOffset, (message.topic, message.partition, message.offset))
            live.append((AdvanceItem(offset, own), message))
    return live
