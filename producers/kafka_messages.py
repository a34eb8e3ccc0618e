"""The messages a Kafka shared stream fans out, as its producer and watchers see them.

``KafkaMessage`` is one consumed record (a plain object, so filters are testable without a
broker); ``KafkaMessageBatch`` the consecutive messages of one partition that a Kafka shared
stream fans out as one raw event (see ``producers.kafka``); ``KafkaOffset`` the broker
payload of a raw event. No aiokafka here: ``message_from_record`` only reads a record's
attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence


class KafkaOffset(NamedTuple):
    """The broker payload of a Kafka raw event: ``(topic, partition, offset)``."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a subscriber rejected a message (carried to the dead-letter headers)."""

    trigger_id: int | None
    reason: str


@dataclass(slots=True, eq=False)
class KafkaMessage:
    """One consumed record, as every subscriber of a Kafka shared stream receives it.

    ``headers`` keep the record's order (names may repeat). The same object goes to every
    subscriber: treat it as read-only, except through ``note_rejection`` (dead-letter
    headers) and ``cache`` (decoded forms, computed once for all subscribers).
    ``settings_digest`` identifies the settings the shared consumer was built from.

    Read-only by contract, not ``frozen``: one is built per consumed record, and a frozen
    dataclass's ``__init__`` (``object.__setattr__`` per field) cost ~4 us of the event
    loop's time per record, five times the plain one.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None
    settings_digest: str = field(default="", repr=False)
    rejections: tuple[Rejection, ...] = field(default=(), repr=False)  # rare: no list each
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def coordinates(self) -> str:
        """``topic/partition/offset``, for logs and headers."""
        return f"{self.topic}/{self.partition}/{self.offset}"

    def note_rejection(self, trigger_id: int | None, reason: str) -> None:
        """Record that ``trigger_id`` rejected this message and why."""
        self.rejections = (*self.rejections, Rejection(trigger_id, reason))


class KafkaMessageBatch:
    """Consecutive messages of one partition, fetched together: one raw event of a Kafka
    shared stream in batch mode (``producers.kafka``), fanned out, resolved and advanced as
    one. Its broker payload is the ``KafkaOffset`` of its last message.

    Read-only by contract, as its messages are: every subscriber receives the same object.
    A subscriber refuses one message of it with ``message.note_rejection``, not with
    ``reject_shared_stream_event()`` (which would refuse the whole batch).
    """

    __slots__ = ("messages", "partition", "topic")

    def __init__(self, topic: str, partition: int, messages: Sequence[KafkaMessage]) -> None:
        if not messages:
            raise ValueError(f"a KafkaMessageBatch of {topic}/{partition} needs messages")
        self.topic = topic
        self.partition = partition
        self.messages = messages

    @property
    def last_offset(self) -> int:
        """The offset of its last message (its advance commits the next one)."""
        return self.messages[-1].offset

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[KafkaMessage]:
        return iter(self.messages)

    def __repr__(self) -> str:
        first = self.messages[0].offset
        return (
            f"<KafkaMessageBatch {self.topic}/{self.partition} offsets {first}..{self.last_offset}"
            f" ({len(self.messages)} messages)>"
        )


def message_from_record(record: Any, settings_digest: str = "") -> KafkaMessage:
    """A ``KafkaMessage`` from an aiokafka ``ConsumerRecord``."""
    headers = record.headers
    return KafkaMessage(
        record.topic,
        record.partition,
        record.offset,
        record.key,
        record.value,
        tuple(headers) if headers else (),
        record.timestamp,
        settings_digest,
    )
