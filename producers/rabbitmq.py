"""RabbitMQ shared-stream producer (aio-pika / aiormq): consume, fan out, ack once resolved.

Theory of operation. ``open_stream`` opens one plain (not robust) connection and one
channel, sets the channel's prefetch count to ``max_in_flight`` (the broker never has more
unacknowledged deliveries out to us), declares the queue (``declare=True``, with
``queue_arguments``) or checks that it exists, and consumes it with manual
acknowledgement. Deliveries arrive on the client's tasks; they are registered in
``Settlements`` and handed to the subscribers strictly in delivery-tag order as
``(RabbitMQMessage, RabbitMQDelivery)``. A delivery past ``max_deliveries`` (a quorum
queue's ``x-delivery-count``) is dead-lettered there and never handed over.

``advance`` takes one lane's resolved prefix (a lane is the queue, or a routing key with
``lanes="routing_key"``) and settles it (``rabbitmq_core.Settlements.plan``): clean -> ack
(one ``multiple`` ack where no earlier delivery of the channel is still outstanding),
rejected -> ``reject(requeue=False)`` (the queue's dead-letter exchange, or dropped when it
has none; or ``on_reject="requeue"``: ``nack(requeue=True)``), failed or zero-subscriber
-> ``nack(requeue=True)``, redelivered at once.

The client (aio-pika, aiormq) is imported in a worker thread as the stream opens: building
the producer, which the shared-stream manager does on the event loop, imports nothing of
it. The connection is not aio-pika's robust one on purpose: a reconnect gets a new channel
whose delivery tags restart at 1, so the old in-flight deliveries could never be settled.
A closed connection, channel or consumer ends the stream (``BrokerUnavailable`` naming the
address, never the password); the broker requeues every unacknowledged delivery, and the
group restarts with backoff. ``aclose`` closes the connection, which releases what is
still in flight for redelivery.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import anyio.to_thread

from producers.exceptions import BrokerRequestFailed, BrokerUnavailable, ProducerError
from producers.rabbitmq_core import (
    CLOSE_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    DEAD_LETTER_ARGUMENT,
    DEFAULT_MAX_IN_FLIGHT,
    Lanes,
    OnReject,
    RabbitMQConnection,
    RabbitMQDelivery,
    RabbitMQMessage,
    Settle,
    Settlements,
    check_settings,
    decode_body,
    delivery_count,
    disposition_of,
    lane_of,
    plain,
)
from producers.rabbitmq_errors import quiet_connect_errors, translate_error, translated
from shared_stream.producer import SharedStreamProducer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from aiormq.abc import AbstractChannel, DeliveredMessage

    from shared_stream.producer import AdvanceItem

__all__ = (
    "RabbitMQConnection",
    "RabbitMQDelivery",
    "RabbitMQMessage",
    "RabbitMQSharedStreamProducer",
)

logger = logging.getLogger(__name__)

_PROPERTIES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "timestamp",
    "message_type",
    "user_id",
    "app_id",
    "priority",
    "delivery_mode",
)


class RabbitMQSharedStreamProducer(SharedStreamProducer):
    """One queue's ack-mode consumer; see the module docstring for the model."""

    #: (address, queue) already warned about: a rejected message would be dropped
    _warned_no_dead_letter: ClassVar[set[tuple[str, str]]] = set()

    def __init__(
        self,
        connection: RabbitMQConnection,
        *,
        declare: bool = False,
        queue_arguments: Mapping[str, Any] | None = None,
        lanes: Lanes = "queue",
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_deliveries: int | None = None,
        on_reject: OnReject = "dead_letter",
    ) -> None:
        check_settings(
            queue=connection.queue,
            declare=declare,
            queue_arguments=queue_arguments,
            lanes=lanes,
            max_in_flight=max_in_flight,
            max_deliveries=max_deliveries,
            on_reject=on_reject,
        )
        self.connection = connection
        self.on_reject: OnReject = on_reject
        self.declare = declare
        self.queue_arguments = dict(queue_arguments or {})
        self.lanes: Lanes = lanes
        self.max_in_flight = max_in_flight
        self.max_deliveries = max_deliveries
        self.settlements = Settlements()
        self.dead_lettered = 0
        self._amqp: Any = None  # the aio-pika connection
        self._channel: AbstractChannel | None = None
        self._closing = False
        self._lost: ProducerError | None = None
        self._arrival = anyio.Event()
        self._settle_lock = anyio.Lock()

    @property
    def queue(self) -> str:
        return self.connection.queue

    @property
    def address(self) -> str:
        return self.connection.address

    # -- the producer ---------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[RabbitMQMessage, RabbitMQDelivery]]:
        await self._connect()
        while True:
            if self._lost is not None:  # what arrived before is void: the broker requeued it
                raise self._lost
            delivered = self.settlements.next_ready()
            if delivered is None:
                self._arrival = anyio.Event()
                await self._arrival.wait()
                continue
            message = self._parse(delivered)
            tag = delivered.delivery_tag
            if self._is_past_max_deliveries(message):
                await self._dead_letter_now(tag, message)
                continue
            yield message, RabbitMQDelivery(tag, lane_of(self.lanes, message.routing_key))

    def get_advance_lane(self, broker_payload: Any) -> str | None:
        delivery: RabbitMQDelivery = broker_payload
        return delivery.lane

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        on_reject = self.on_reject
        async with self._settle_lock:
            plan = self.settlements.plan(
                (item.broker_payload.delivery_tag, disposition_of(item.outcome, on_reject))
                for item in batch
            )
            await self._send(plan)
        rejected = sum(1 for s in plan if s.method == "reject")
        if rejected:
            self.dead_lettered += rejected
            logger.info(
                "Rejected %d RabbitMQ message(s) of queue %r to its dead-letter exchange",
                rejected,
                self.queue,
                extra={"action": "rabbitmq.dead_lettered", "queue": self.queue},
            )

    async def aclose(self) -> None:
        """Close the connection: the broker requeues every delivery not acknowledged."""
        self._closing = True
        released = self.settlements.release_all()
        amqp, self._amqp, self._channel = self._amqp, None, None
        if amqp is None:
            return
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            try:
                await amqp.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken connection: nothing to do
                logger.debug("Closing the RabbitMQ connection to %s: %r", self.address, exc)
        if released:
            logger.debug(
                "Released %d in-flight RabbitMQ message(s) of %r for redelivery",
                released,
                self.queue,
                extra={"action": "rabbitmq.released", "queue": self.queue},
            )

    # -- connecting -----------------------------------------------------------------------

    async def _connect(self) -> None:
        if self._amqp is not None or self._closing:
            raise RuntimeError(f"{self!r}: open_stream() runs once per producer")
        address, queue = self.address, self.queue
        quiet_connect_errors()
        # 0.2 s of imports the first time: not on the event loop
        aio_pika = await anyio.to_thread.run_sync(importlib.import_module, "aio_pika")
        with translated("connect", address=address, queue=queue):
            self._amqp = await aio_pika.connect(self.connection.url, timeout=CONNECT_TIMEOUT_S)
            self._amqp.close_callbacks.add(self._on_closed)
            channel = await self._amqp.channel(publisher_confirms=False)
            channel.close_callbacks.add(self._on_closed)
            await channel.set_qos(prefetch_count=self.max_in_flight)
        with translated("queue.declare", address=address, queue=queue):
            declared = await channel.declare_queue(
                queue,
                durable=True,
                passive=not self.declare,
                arguments=self.queue_arguments or None,
            )
        with translated("basic.consume", address=address, queue=queue):
            self._channel = await channel.get_underlay_channel()
            self._channel.on_consumer_cancel_callbacks.add(self._on_consumer_cancelled)
            await self._channel.basic_consume(queue, self._on_delivery, no_ack=False)
        self._warn_if_rejects_are_dropped()
        logger.info(
            "RabbitMQ consumer connected to queue %r at %s (%d message(s) ready, prefetch %d)",
            queue,
            address,
            declared.declaration_result.message_count or 0,
            self.max_in_flight,
            extra={"action": "rabbitmq.connected", "queue": queue},
        )

    def _warn_if_rejects_are_dropped(self) -> None:
        if DEAD_LETTER_ARGUMENT in self.queue_arguments or (
            self.on_reject == "requeue" and self.max_deliveries is None
        ):
            return
        seen = (self.address, self.queue)
        if seen in self._warned_no_dead_letter:
            return
        self._warned_no_dead_letter.add(seen)
        logger.warning(
            "RabbitMQ queue %r at %s: a message a watcher rejects is rejected with "
            "requeue=False; unless the queue has a dead-letter exchange (an %s argument or a "
            "policy, which Sluice cannot see over AMQP), the broker drops it. Declare it "
            "with queue_arguments={'%s': ...} (declare=True) or a policy",
            self.queue,
            self.address,
            DEAD_LETTER_ARGUMENT,
            DEAD_LETTER_ARGUMENT,
            extra={"action": "rabbitmq.no_dead_letter_exchange", "queue": self.queue},
        )

    # -- the client's callbacks (its tasks, on this event loop) ---------------------------

    async def _on_delivery(self, delivered: DeliveredMessage) -> None:
        if self._closing:
            return  # released with the connection
        tag = delivered.delivery_tag
        assert tag is not None, "a consumer's delivery always has a tag"
        self.settlements.arrived(tag, delivered)
        self._arrival.set()

    def _on_closed(self, _sender: Any, exc: BaseException | None = None) -> None:
        if self._closing or self._lost is not None:
            return
        cause = exc if exc is not None else ConnectionError("closed")
        lost = translate_error(cause, action="consume", address=self.address, queue=self.queue)
        if not isinstance(lost, BrokerUnavailable):  # a channel error is a loss too
            lost = BrokerUnavailable(str(lost), address=self.address)
        lost.__cause__ = cause
        self._lost = lost
        self._arrival.set()

    def _on_consumer_cancelled(self, _frame: Any) -> None:
        if self._closing or self._lost is not None:
            return
        self._lost = BrokerRequestFailed(
            f"RabbitMQ cancelled the consumer of queue {self.queue!r} at {self.address} (the "
            "queue was deleted?); the watchers restart with backoff"
        )
        self._arrival.set()

    # -- messages -------------------------------------------------------------------------

    def _parse(self, delivered: DeliveredMessage) -> RabbitMQMessage:
        props = delivered.header.properties
        headers = plain(dict(props.headers or {}))
        properties = {
            name: plain(value)
            for name in _PROPERTIES
            if (value := getattr(props, name, None)) is not None
        }
        return RabbitMQMessage(
            queue=self.queue,
            message_id=props.message_id or None,
            body=decode_body(delivered.body),
            raw_body=delivered.body,
            routing_key=delivered.routing_key or "",
            exchange=delivered.exchange or "",
            headers=headers,
            properties=properties,
            redelivered=bool(delivered.redelivered),
            delivery_count=delivery_count(headers),
        )

    def _is_past_max_deliveries(self, message: RabbitMQMessage) -> bool:
        limit = self.max_deliveries
        count = message.delivery_count
        return limit is not None and count is not None and count > limit

    async def _dead_letter_now(self, tag: int, message: RabbitMQMessage) -> None:
        async with self._settle_lock:
            await self._send([self.settlements.settle_now(tag, "reject")])
        self.dead_lettered += 1
        logger.warning(
            "RabbitMQ message %s of queue %r was delivered %s times (max_deliveries=%s): "
            "rejected to the queue's dead-letter exchange without reaching the watchers",
            message.message_id or f"(no message id, tag {tag})",
            self.queue,
            message.delivery_count,
            self.max_deliveries,
            extra={"action": "rabbitmq.max_deliveries", "queue": self.queue},
        )

    async def _send(self, plan: Sequence[Settle]) -> None:
        channel = self._channel
        if channel is None or self._lost is not None:
            raise self._lost or BrokerUnavailable(
                f"RabbitMQ channel of queue {self.queue!r} at {self.address} is closed",
                address=self.address,
            )
        with translated("settle", address=self.address, queue=self.queue):
            for settle in plan:
                if settle.method == "ack":
                    await channel.basic_ack(settle.delivery_tag, multiple=settle.multiple)
                elif settle.method == "reject":
                    await channel.basic_reject(settle.delivery_tag, requeue=False)
                else:
                    await channel.basic_nack(settle.delivery_tag, requeue=True)

    def __repr__(self) -> str:
        return (
            f"<RabbitMQSharedStreamProducer queue={self.queue!r} at {self.address} "
            f"in_flight={len(self.settlements)} lanes={self.lanes!r} "
            f"connected={self._channel is not None}>"
        )
