"""What a NATS JetStream producer checks and creates when it connects.

``ConsumerSetup.prepare`` makes sure the stream exists (creating it when the trigger asks),
that several filter subjects meet a server that has them (2.10), that the dead-letter
subject is captured by a stream and cannot flow back to the watchers, then creates or
updates the durable pull consumer (explicit ack, ``ack_wait``, ``max_deliver``,
``max_ack_pending`` = ``max_in_flight``, the deliver policy) and binds a pull subscription
to it. What cannot work is a ``ProducerConfigError`` naming the setting; the client's errors
are translated by the caller (``producers.nats_errors.translated``).

Imported by ``producers.nats`` once nats-py is loaded (never where a DAG file is parsed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig

from producers.exceptions import ProducerConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from nats.aio.client import Client
    from nats.js.client import JetStreamContext

logger = logging.getLogger(__name__)

MULTIPLE_FILTERS_SINCE = (2, 10)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerSetup:
    """The stream and durable consumer one producer reads (checked by ``check_settings``)."""

    address: str
    stream: str
    durable: str
    subjects: Sequence[str]
    create_stream: bool
    stream_subjects: Sequence[str]
    ack_wait_s: float
    max_deliver: int
    dead_letter_subject: str | None
    max_in_flight: int
    deliver_policy: str

    async def prepare(self, nc: Client, js: JetStreamContext) -> JetStreamContext.PullSubscription:
        await self._ensure_stream(js)
        self._check_server(nc)
        if self.dead_letter_subject is not None:
            await self._check_dead_letter_subject(js, self.dead_letter_subject)
        await js.add_consumer(self.stream, self.consumer_config())
        return await js.pull_subscribe_bind(self.durable, stream=self.stream)

    def consumer_config(self) -> ConsumerConfig:
        subjects: dict[str, Any] = {}
        if len(self.subjects) == 1:
            subjects["filter_subject"] = self.subjects[0]
        elif self.subjects:
            subjects["filter_subjects"] = list(self.subjects)
        return ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_deliver=self.max_deliver,
            max_ack_pending=self.max_in_flight,
            deliver_policy=DeliverPolicy(self.deliver_policy),
            **subjects,
        )

    async def _ensure_stream(self, js: JetStreamContext) -> None:
        try:
            await js.stream_info(self.stream)
            return
        except nats.js.errors.NotFoundError:
            if not self.create_stream:
                raise ProducerConfigError(
                    f"NATS JetStream stream {self.stream!r} does not exist on {self.address}: "
                    "create it, or give the trigger create_stream=True and stream_subjects"
                ) from None
        await js.add_stream(StreamConfig(name=self.stream, subjects=list(self.stream_subjects)))
        logger.info(
            "Created NATS JetStream stream %s (subjects %s)",
            self.stream,
            list(self.stream_subjects),
            extra={"action": "nats.stream_created", "stream": self.stream},
        )

    def _check_server(self, nc: Client) -> None:
        version = nc.connected_server_version
        if len(self.subjects) > 1 and (version.major, version.minor) < MULTIPLE_FILTERS_SINCE:
            raise ProducerConfigError(
                f"NATS consumer {self.durable!r} on {self.address}: several filter subjects "
                f"{list(self.subjects)} need nats-server 2.10 or later (this one is "
                f"{version.major}.{version.minor}); give one subject (a wildcard such as "
                "'orders.>' works) or one watcher key per subject"
            )

    async def _check_dead_letter_subject(self, js: JetStreamContext, subject: str) -> None:
        try:
            owner = await js.find_stream_name_by_subject(subject)
        except nats.js.errors.NotFoundError:
            raise ProducerConfigError(
                f"NATS dead_letter_subject {subject!r}: no JetStream stream on {self.address} "
                "captures it, so a dead-lettered message would be lost; create a stream "
                f"whose subjects include {subject!r}"
            ) from None
        if owner == self.stream and not self.subjects:
            raise ProducerConfigError(
                f"NATS dead_letter_subject {subject!r} is captured by stream {self.stream!r} "
                "itself and the consumer takes every subject of it: a dead-lettered message "
                "would come back to the watchers; give the trigger subjects that exclude it"
            )
