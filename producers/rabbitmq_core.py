"""The pure pieces of the RabbitMQ adapter: message types, settings, settlement bookkeeping.

No I/O here and no aio-pika: a DAG file that declares a ``RabbitMQMessageTrigger`` imports
this module, never the client (``producers.rabbitmq``, ``producers.rabbitmq_errors``).

Theory of operation of ``Settlements``. AMQP 0-9-1 delivery tags are numbered per channel
(1, 2, 3, ...) and every delivery stays *unacked* until the consumer settles it: ``ack``,
``reject(requeue=False)`` (to the queue's dead-letter exchange, or dropped) or
``nack(requeue=True)`` (back to the queue). ``ack(multiple=True)`` of tag T settles every
unacked tag up to T on the channel, so it is correct only when every delivery before T
that is still outstanding is one we mean to ack now. ``plan`` takes one lane's resolved
prefix and returns the operations in the order to send them: rejects and requeues first
(each alone), then the acks, folded into one ``multiple`` ack for the tags below the oldest
delivery still outstanding on the channel, each alone above it. The driver sends them in
that order under one lock, so no other settlement slips in between. Tags are registered as
they arrive (``arrived``) and handed to the subscribers in tag order (``next_ready``): every
tag below the next one to hand over has arrived, so "below the oldest outstanding" is exact.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, Literal, get_args
from urllib.parse import unquote, urlsplit

from producers.exceptions import ProducerConfigError, ProducerError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from shared_stream.producer import AdvanceOutcome

Lanes = Literal["queue", "routing_key"]
LANE_MODES: Final[tuple[str, ...]] = get_args(Lanes)
Dedup = Literal["message_id", "payload"]
DEDUP_MODES: Final[tuple[str, ...]] = get_args(Dedup)
OnReject = Literal["dead_letter", "requeue"]
ON_REJECT_POLICIES: Final[tuple[str, ...]] = get_args(OnReject)
DEFAULT_MAX_IN_FLIGHT: Final = 1000
#: AMQP's prefetch count is a short (0 means unlimited, which would not bound anything)
MAX_PREFETCH: Final = 65535
CONNECT_TIMEOUT_S: Final = 5.0
CLOSE_TIMEOUT_S: Final = 5.0
DEFAULT_PORT: Final = 5672
DEFAULT_TLS_PORT: Final = 5671
DELIVERY_COUNT_HEADER: Final = "x-delivery-count"
DEAD_LETTER_ARGUMENT: Final = "x-dead-letter-exchange"


def address_of(url: str) -> str:
    """The broker's address as errors and logs show it: the URL without its credentials."""
    parts = urlsplit(url)
    scheme = parts.scheme or "amqp"
    default = DEFAULT_TLS_PORT if scheme == "amqps" else DEFAULT_PORT
    host = parts.hostname or "localhost"
    port = parts.port or default
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return f"{scheme}://{host}:{port} vhost {vhost!r}"


@dataclass(frozen=True, slots=True)
class RabbitMQConnection:
    """Which broker and queue; the URL (it holds the password) is left out of ``repr``."""

    url: str = field(repr=False)
    queue: str

    @property
    def address(self) -> str:
        return address_of(self.url)


@dataclass(frozen=True, slots=True)
class RabbitMQMessage:
    """The raw event every subscriber gets (shared between them: do not mutate).

    ``body`` is the JSON-decoded body when it parses, else its text (UTF-8, undecodable
    bytes replaced); ``raw_body`` the bytes. ``headers`` and ``properties`` hold plain JSON
    values (bytes as text, timestamps as ISO 8601). ``delivery_count`` is the delivery's
    number on a quorum queue (its ``x-delivery-count`` header + 1), None on a classic queue,
    which only says whether it was ``redelivered``.
    """

    queue: str
    message_id: str | None
    body: Any
    raw_body: bytes
    routing_key: str
    exchange: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    redelivered: bool
    delivery_count: int | None


@dataclass(frozen=True, slots=True)
class RabbitMQDelivery:
    """The broker payload of one delivery: its channel's tag and its ordering lane."""

    delivery_tag: int
    lane: str | None


def decode_body(raw: bytes) -> Any:
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def plain(value: Any) -> Any:
    """An AMQP field value as plain JSON (bytes as UTF-8 text, decimals and timestamps)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, Decimal):
        return float(value) if value.is_finite() else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


def delivery_count(headers: Mapping[str, Any]) -> int | None:
    """A quorum queue's count of this message's deliveries, this one included (None: the
    queue does not count; a first delivery carries no header)."""
    count = headers.get(DELIVERY_COUNT_HEADER)
    if isinstance(count, int) and not isinstance(count, bool):
        return count + 1
    return None


def dedup_key(message: RabbitMQMessage, dedup: Dedup) -> str | None:
    """``rabbitmq:<queue>:<message_id>``; with ``dedup="payload"``, a digest of the body
    when there is no message id; else None (nothing recognises a redelivery)."""
    if message.message_id:
        return f"rabbitmq:{message.queue}:{message.message_id}"
    if dedup == "payload":
        return f"rabbitmq:{message.queue}:sha256:{hashlib.sha256(message.raw_body).hexdigest()}"
    return None


def check_settings(
    *,
    queue: str,
    declare: bool = False,
    queue_arguments: Mapping[str, Any] | None = None,
    lanes: str = "queue",
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    max_deliveries: int | None = None,
    dedup: str = "message_id",
    on_reject: str = "dead_letter",
    where: str = "RabbitMQ producer",
) -> None:
    """Raise ``ProducerConfigError`` for settings that cannot work."""
    problems = []
    if not queue:
        problems.append("queue must name a queue")
    if queue_arguments and not declare:
        problems.append(
            "queue_arguments are the arguments the queue is declared with: set declare=True"
        )
    if lanes not in LANE_MODES:
        problems.append(f"lanes={lanes!r} is not one of {list(LANE_MODES)}")
    if not 1 <= max_in_flight <= MAX_PREFETCH:
        problems.append(
            f"max_in_flight={max_in_flight} must be within 1..{MAX_PREFETCH} (it is the "
            "channel's prefetch count)"
        )
    if max_deliveries is not None and max_deliveries < 1:
        problems.append(f"max_deliveries={max_deliveries} must be at least 1 (or None)")
    if dedup not in DEDUP_MODES:
        problems.append(f"dedup={dedup!r} is not one of {list(DEDUP_MODES)}")
    if on_reject not in ON_REJECT_POLICIES:
        problems.append(f"on_reject={on_reject!r} is not one of {list(ON_REJECT_POLICIES)}")
    if problems:
        raise ProducerConfigError(f"{where}: " + "; ".join(problems))


class Disposition(enum.Enum):
    """What ``advance`` does with one delivery."""

    ACK = "ack"
    DEAD_LETTER = "dead_letter"  # reject(requeue=False)
    REQUEUE = "requeue"  # nack(requeue=True)


def disposition_of(outcome: AdvanceOutcome, on_reject: OnReject = "dead_letter") -> Disposition:
    """Clean -> ack; any reject -> ``on_reject`` (dead-letter, or requeue: delivered again,
    until a quorum queue's ``max_deliveries`` dead-letters it); failed or zero-subscriber
    -> requeue."""
    if outcome.is_clean:
        return Disposition.ACK
    if outcome.rejected and on_reject == "dead_letter":
        return Disposition.DEAD_LETTER
    return Disposition.REQUEUE


@dataclass(frozen=True, slots=True)
class Settle:
    """One AMQP settlement to send: ``ack`` (``multiple``: every unacked tag up to this
    one), ``reject`` (requeue=False) or ``nack`` (requeue=True)."""

    method: Literal["ack", "reject", "nack"]
    delivery_tag: int
    multiple: bool = False


class Settlements:
    """The deliveries of one channel not settled yet; see the module docstring."""

    def __init__(self) -> None:
        self._outstanding: set[int] = set()
        self._oldest: list[int] = []  # a heap of outstanding tags, settled ones popped lazily
        self._arrived: dict[int, Any] = {}
        self._next_tag = 1
        self.settled = 0

    def arrived(self, delivery_tag: int, item: Any) -> None:
        """A delivery arrived (in any order); it is outstanding from now on."""
        self._outstanding.add(delivery_tag)
        heapq.heappush(self._oldest, delivery_tag)
        self._arrived[delivery_tag] = item

    def next_ready(self) -> Any | None:
        """The arrived delivery with the next tag in order, taken out (None: not arrived)."""
        item = self._arrived.pop(self._next_tag, None)
        if item is not None:
            self._next_tag += 1
        return item

    def settle_now(self, delivery_tag: int, method: Literal["reject", "nack"]) -> Settle:
        """Settle one delivery that was never handed over (e.g. past ``max_deliveries``)."""
        self._take(delivery_tag)
        return Settle(method, delivery_tag)

    def plan(self, batch: Iterable[tuple[int, Disposition]]) -> list[Settle]:
        """The settlements of a resolved prefix, in the order to send them."""
        acks: list[int] = []
        others: list[Settle] = []
        for tag, disposition in batch:
            self._take(tag)
            if disposition is Disposition.ACK:
                acks.append(tag)
            elif disposition is Disposition.DEAD_LETTER:
                others.append(Settle("reject", tag))
            else:
                others.append(Settle("nack", tag))
        acks.sort()
        oldest = self.oldest_outstanding()
        folded = [tag for tag in acks if oldest is None or tag < oldest]
        single = acks[len(folded) :]
        if len(folded) > 1:
            others.append(Settle("ack", folded[-1], multiple=True))
        else:
            single = folded + single
        others.extend(Settle("ack", tag) for tag in single)
        return others

    def oldest_outstanding(self) -> int | None:
        while self._oldest and self._oldest[0] not in self._outstanding:
            heapq.heappop(self._oldest)
        return self._oldest[0] if self._oldest else None

    def release_all(self) -> int:
        """Forget every outstanding delivery (the channel is closing: the broker requeues
        them); returns how many there were."""
        count = len(self._outstanding)
        self._outstanding.clear()
        self._oldest.clear()
        self._arrived.clear()
        return count

    def _take(self, delivery_tag: int) -> None:
        if delivery_tag not in self._outstanding:
            raise ProducerError(
                f"RabbitMQ delivery tag {delivery_tag} is not outstanding: it was settled "
                "twice or never delivered on this channel"
            )
        self._outstanding.remove(delivery_tag)
        self.settled += 1

    def __len__(self) -> int:
        return len(self._outstanding)

    def __repr__(self) -> str:
        return (
            f"<Settlements outstanding={len(self._outstanding)} waiting={len(self._arrived)} "
            f"next_tag={self._next_tag} settled={self.settled}>"
        )


def lane_of(mode: Lanes, routing_key: str) -> str | None:
    return routing_key if mode == "routing_key" else None
