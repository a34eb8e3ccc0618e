"""The kit's RabbitMQ adapter: ``RabbitMQMessageTrigger`` on the machine's RabbitMQ.

A stream is a fresh quorum queue whose dead-letter exchange is the default one, routing to
``<queue>.dlq``; with more than one lane, a direct exchange of the stream's own routes
``lane<i>`` to the queue and the watchers order by routing key (``lanes="routing_key"``).
Watchers declare the queue with the same arguments (``declare=True``): they know its
dead-letter exchange. ``dead_letter=False`` watchers requeue what they reject
(``on_reject="requeue"``): the broker delivers it again, until ``max_deliveries``
dead-letters it.

``unresolved`` is the queue's ready + unacknowledged messages, asked of its Raft leader with
``rabbitmqctl eval`` (AMQP itself only tells the ready ones; ``list_queues messages`` is a
metric the leader refreshes every 5 s, stale just after a publish). ``dead_lettered`` takes
what reached ``<queue>.dlq`` and keeps it, so each call returns everything seen so far.
The private broker is a node of the case's own (``tests.services_rabbitmq.PrivateRabbitMQ``:
7 to 13 s to start on this machine); ``stop`` / ``start`` stop and start the broker
application inside it (``rabbitmqctl stop_app`` / ``start_app``: the AMQP port closes and
every connection breaks as when the process stops, in 2.5 + 4 s instead of 1 + 13 s);
durable queues and persistent messages survive.
"""

from __future__ import annotations

import json
import re
import uuid
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Final

import aio_pika
import anyio
import anyio.to_thread

from tests.services_rabbitmq import PrivateRabbitMQ

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping, Sequence

    import pytest

KIND = "rabbitmq"
_QUEUE_NAME: Final = re.compile(r"[A-Za-z0-9._-]+")
#: a quorum queue's ready + checked-out messages, from its leader's state machine
_MESSAGES_TOTAL: Final = """\
case rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"QUEUE">>)) of
    {ok, Q} ->
        {ok, {_, N}, _} = ra:leader_query(
            amqqueue:get_pid(Q), fun rabbit_fifo:query_messages_total/1),
        N;
    {error, not_found} -> 0
end."""
HEARTBEAT_S = 2  # the watchers' AMQP heartbeat (the broker's default is 60 s)
MAX_DELIVERIES = 5  # a dead_letter=False watcher's rejected message: delivered this often


class Broker:
    """Where a stream lives: its AMQP URL and how ``rabbitmqctl`` reaches its node."""

    def __init__(self, url: str, ctl: list[str], env: Mapping[str, str] | None = None) -> None:
        self.url = url
        self.ctl = ctl
        self.env = dict(env) if env is not None else None

    async def messages(self, queue: str) -> int:
        """Ready + unacknowledged messages of ``queue`` (0 when it does not exist), asked of
        the queue's Raft leader itself (``rabbit_fifo:query_messages_total``): exact at the
        call. ``list_queues messages`` is not: a quorum queue's counts there are metrics its
        leader publishes once per tick (5 s), so it said 0 for 20 messages just published."""
        assert _QUEUE_NAME.fullmatch(queue), queue  # goes into an Erlang expression
        command = [*self.ctl, "eval", _MESSAGES_TOTAL.replace("QUEUE", queue)]
        result = await anyio.run_process(command, env=self.env, check=True)
        return int(result.stdout.decode().strip())


class RabbitKitStream:
    """A quorum queue, its dead-letter queue and (several lanes) its direct exchange."""

    imports = "from producers import RabbitMQMessageTrigger"

    def __init__(self, broker: Broker, lanes: int) -> None:
        self.broker = broker
        self.lanes = lanes
        self.name = f"kit-{uuid.uuid4().hex[:16]}"
        self.dlq = f"{self.name}.dlq"
        self.arguments = {
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": self.dlq,
        }
        self._dead: list[bytes] = []
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None

    async def _open(self) -> aio_pika.abc.AbstractChannel:
        """The stream's client channel, opened again after a broker restart."""
        if self._channel is None or self._channel.is_closed:
            if self._connection is not None:
                await self._connection.close()
            self._connection = await aio_pika.connect(self.broker.url, timeout=10)
            self._channel = await self._connection.channel()
        return self._channel

    async def create(self) -> None:
        channel = await self._open()
        await channel.declare_queue(self.dlq, durable=True)
        queue = await channel.declare_queue(self.name, durable=True, arguments=self.arguments)
        if self.lanes > 1:
            exchange = await channel.declare_exchange(
                self.name, aio_pika.ExchangeType.DIRECT, durable=True
            )
            for lane in range(self.lanes):
                await queue.bind(exchange, routing_key=f"lane{lane}")

    def watcher_source(
        self,
        *,
        match: Mapping[str, Any] | None = None,
        dead_letter: bool = True,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {
            # the broker drops a frozen engine's connection (and requeues what it held) after
            # two missed heartbeats, as Kafka's short session timeout drops its member
            "url": f"{self.broker.url}?heartbeat={HEARTBEAT_S}",
            "queue": self.name,
            "declare": True,
            "queue_arguments": self.arguments,
            "lanes": "routing_key" if self.lanes > 1 else "queue",
        }
        if match:
            kwargs["body_filter"] = dict(match)
        if not dead_letter:
            kwargs.update(on_reject="requeue", max_deliveries=MAX_DELIVERIES)
        kwargs.update(options or {})
        return f"RabbitMQMessageTrigger(**{kwargs!r})"

    async def publish(self, bodies: Sequence[Mapping[str, Any]], *, lane: int = 0) -> None:
        for body in bodies:
            await self.publish_raw(json.dumps(dict(body)).encode(), lane=lane)

    async def publish_raw(self, payload: bytes, *, lane: int = 0) -> None:
        """Persistent, with a publisher confirm; aio-pika gives it a message id."""
        assert 0 <= lane < self.lanes, (lane, self.lanes)
        channel = await self._open()
        message = aio_pika.Message(payload, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        if self.lanes > 1:
            exchange = await channel.get_exchange(self.name)
            await exchange.publish(message, routing_key=f"lane{lane}")
        else:
            await channel.default_exchange.publish(message, routing_key=self.name)

    async def unresolved(self) -> int:
        return await self.broker.messages(self.name)

    async def dead_lettered(self) -> list[bytes]:
        channel = await self._open()
        queue = await channel.get_queue(self.dlq)
        while (message := await queue.get(fail=False)) is not None:
            self._dead.append(message.body)
            await message.ack()
        return list(self._dead)

    async def aclose(self) -> None:
        try:
            channel = await self._open()
            for name in (self.name, self.dlq):
                await channel.queue_delete(name)
            if self.lanes > 1:
                await channel.exchange_delete(self.name)
        finally:
            if self._connection is not None:
                await self._connection.close()
                self._connection = self._channel = None


@asynccontextmanager
async def _stream(broker: Broker, lanes: int) -> AsyncIterator[RabbitKitStream]:
    stream = RabbitKitStream(broker, lanes)
    await stream.create()
    try:
        yield stream
    finally:
        await stream.aclose()


class PrivateRabbitKit:
    """A RabbitMQ node of one case's own, stopped and started on its ports."""

    def __init__(self) -> None:
        self.node = PrivateRabbitMQ()
        ctl = [f"{self.node.bin}/rabbitmqctl", "-n", self.node.node]
        self.broker = Broker(self.node.url, ctl, env=self.node.env())

    def stream(self, *, lanes: int = 1) -> Any:
        return _stream(self.broker, lanes)

    async def stop(self) -> None:
        """The broker application stops (port closed, connections broken); its Erlang node
        stays up, so that ``start`` takes 4 s instead of a node's 10 to 13 s."""
        await anyio.to_thread.run_sync(self.node.stop_app)

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self.node.start_app)

    async def open(self) -> None:
        await anyio.to_thread.run_sync(self.node.start)


class RabbitKit:
    kind = KIND
    cannot: Mapping[str, str] = {}
    #: what an engine logs when it opens a consumer or settles outside advance's acks (acks
    #: themselves are not logged: one line per delivery)
    consumer_actions = frozenset(
        {"rabbitmq.connected", "rabbitmq.dead_lettered", "rabbitmq.max_deliveries"}
    )

    def __init__(self, url: str) -> None:
        self.broker = Broker(url, ["rabbitmqctl"])

    def stream(self, *, lanes: int = 1) -> Any:
        return _stream(self.broker, lanes)

    @asynccontextmanager
    async def private(self) -> AsyncIterator[PrivateRabbitKit]:
        private = PrivateRabbitKit()
        try:
            await private.open()
            yield private
        finally:
            await anyio.to_thread.run_sync(private.node.remove)

    def payload_n(self, payload: Mapping[str, Any]) -> int:
        return int(payload["body"]["n"])

    def dedup_prefix(self) -> str:
        return "rabbitmq:"


@contextmanager
def kit_broker(request: pytest.FixtureRequest) -> Iterator[RabbitKit]:
    """The kit's RabbitMQ: the machine's broker (started if it is down)."""
    yield RabbitKit(request.getfixturevalue("rabbitmq_url"))
