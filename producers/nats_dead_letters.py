"""Where a NATS JetStream producer's dead letters go, and what JetStream gave up on.

``DeadLetters`` publishes a copy of a message to the trigger's ``dead_letter_subject`` (its
PubAck awaited: stored by the stream that captures the subject, before the original is
terminated), with the original's headers plus ``Sluice-Original-Stream`` /
``-Sequence`` / ``-Subject`` and ``Sluice-Dead-Letter-Cause`` (``rejected`` or
``max_deliver``); ``Nats-Msg-Id`` ``<stream>:<sequence>`` makes a copy sent twice one
message (within the dead-letter stream's duplicate window).

``watch`` follows JetStream's MAX_DELIVERIES advisory of the consumer
(``$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<durable>``): a last delivery whose
ack wait ran out (an engine died or stalled holding it) is never delivered again, so it is
read back from the stream by sequence and dead-lettered. Advisories are not stored: one
sent while no producer of the durable runs is missed (the message stays in the stream).

Imported by ``producers.nats`` once nats-py is loaded (never where a DAG file is parsed).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from producers.nats_core import (
    DEAD_LETTER_CAUSE_HEADER,
    DEAD_LETTER_SEQUENCE_HEADER,
    DEAD_LETTER_STREAM_HEADER,
    DEAD_LETTER_SUBJECT_HEADER,
    MAX_DELIVERIES_ADVISORY,
)
from producers.nats_errors import translated

if TYPE_CHECKING:
    from nats.aio.subscription import Subscription
    from nats.js.client import JetStreamContext

logger = logging.getLogger(__name__)


class DeadLetters:
    """One durable consumer's dead-letter copies (``subject`` None: none are made)."""

    def __init__(self, *, stream: str, durable: str, subject: str | None, max_deliver: int):
        self.stream = stream
        self.durable = durable
        self.subject = subject
        self.max_deliver = max_deliver
        self.js: JetStreamContext | None = None  # set once the producer connected

    @property
    def advisory_subject(self) -> str:
        return MAX_DELIVERIES_ADVISORY.format(stream=self.stream, consumer=self.durable)

    async def publish(
        self,
        data: bytes,
        original_headers: dict[str, str] | None,
        *,
        sequence: int,
        subject: str,
        cause: str,
    ) -> None:
        """Store a copy of message ``sequence`` (first received on ``subject``)."""
        assert self.js is not None and self.subject is not None
        headers = {
            **(original_headers or {}),
            DEAD_LETTER_STREAM_HEADER: self.stream,
            DEAD_LETTER_SEQUENCE_HEADER: str(sequence),
            DEAD_LETTER_SUBJECT_HEADER: subject,
            DEAD_LETTER_CAUSE_HEADER: cause,
            "Nats-Msg-Id": f"{self.stream}:{sequence}",
        }
        await self.js.publish(self.subject, data, headers=headers)
        logger.info(
            "Dead-lettered NATS message %s:%s (%s) to %s",
            self.stream,
            sequence,
            cause,
            self.subject,
            extra={"action": "nats.dead_lettered", "stream": self.stream},
        )

    async def watch(self, advisories: Subscription, address: str) -> None:
        """Dead-letter each message the advisory names, until cancelled; ``ProducerError``
        when the connection or a request fails."""
        with translated("max deliveries advisory", address):
            while True:
                advisory = await advisories.next_msg(timeout=None)
                try:
                    sequence = int(json.loads(advisory.data)["stream_seq"])
                except (ValueError, KeyError, TypeError):
                    logger.warning(
                        "Ignored a NATS advisory on %s without a stream_seq: %r",
                        self.advisory_subject,
                        advisory.data[:200],
                        extra={"action": "nats.advisory_unreadable", "stream": self.stream},
                    )
                    continue
                await self._given_up(sequence)

    async def _given_up(self, sequence: int) -> None:
        if self.subject is None:
            self.warn_lost(sequence, "reached max_deliver without an ack")
            return
        assert self.js is not None
        stored = await self.js.get_msg(self.stream, sequence)
        await self.publish(
            stored.data or b"",
            stored.headers,
            sequence=sequence,
            subject=stored.subject or "",
            cause="max_deliver",
        )

    def warn_lost(self, sequence: int, what: str) -> None:
        """JetStream will not deliver message ``sequence`` again and nothing copies it."""
        logger.warning(
            "NATS message %s:%s %s (max_deliver=%s) and no dead_letter_subject is set: "
            "JetStream will not deliver it again and announces it on %s; it stays in the "
            "stream until its retention removes it",
            self.stream,
            sequence,
            what,
            self.max_deliver,
            self.advisory_subject,
            extra={"action": "nats.max_deliveries", "stream": self.stream},
        )

    def __repr__(self) -> str:
        return f"<DeadLetters {self.stream}/{self.durable} -> {self.subject!r}>"
