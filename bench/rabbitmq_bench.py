"""RabbitMQ end-to-end throughput: watchers through the real triggerer vs a bare consume/ack loop.

Run by hand (never in tests):  .venv/bin/python bench/rabbitmq_bench.py [--messages 2000]
                                   [--url amqp://guest:guest@127.0.0.1:5672/]
                                   [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

The machine's RabbitMQ (default virtual host). Each case preloads M persistent JSON messages
into a fresh durable classic queue (deleted afterwards), then drains it:

* bare: one aio-pika consumer, prefetch 1000 (the trigger's default ``max_in_flight``),
  ``basic.ack`` of every message as it arrives, from the consume until M are acked: what
  the broker and client allow.
* sluice N=1 / N=10: N ``RabbitMQMessageTrigger`` watchers (no filter) on the queue, run by
  the real ``Triggerer`` in-process on SQLite (and PostgreSQL with ``--pg``), from the
  producer's connection (the group starts consuming after a 0.5 s cohort grace, so all N
  watchers see every message) until all M x N asset events are committed and all M
  deliveries are acked (the shared stream advanced past them: the acks are sent, as the
  bare loop's are).

Figures: messages/s (M / seconds) and asset events/s, min / median / max of ``--repeat``
(>= 3) runs, each case alternating with the bare loop so both see the same load; the ratio
is of medians of the same run. The machine is shared: the figures are noisy. What every
broker bench shares is in ``broker_harness.py``.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from typing import TYPE_CHECKING

import aio_pika
import anyio
import broker_harness

from producers import RabbitMQMessageTrigger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from engine.triggerer.triggerer import Triggerer

PREFETCH = 1000


# -- the broker -------------------------------------------------------------------------


async def new_queue(url: str, messages: int) -> str:
    """A fresh durable queue holding ``messages`` persistent JSON messages."""
    name = f"bench-{uuid.uuid4().hex[:12]}"
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel(publisher_confirms=False)
        await channel.declare_queue(name, durable=True)
        for n in range(messages):
            body = json.dumps({"n": n}).encode()
            message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await channel.default_exchange.publish(message, routing_key=name)
        while True:  # the broker counts what it took in within milliseconds
            if await _ready(channel, name) >= messages:
                break
            await anyio.sleep(0.01)
    return name


async def _ready(channel: aio_pika.abc.AbstractChannel, name: str) -> int:
    declared = await channel.declare_queue(name, passive=True)
    return int(declared.declaration_result.message_count or 0)


async def delete_queue(url: str, name: str) -> None:
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel()
        await channel.queue_delete(name)


# -- the bench --------------------------------------------------------------------------


class RabbitMQBench(broker_harness.BrokerBench):
    """A source is a queue name; "acked" is the shared stream advanced past every message."""

    kind = "rabbitmq"
    ack_poll_s = 0.005

    def __init__(self, url: str) -> None:
        self.url = url

    @property
    def where(self) -> str:
        return "RabbitMQ (machine's)"

    @contextlib.asynccontextmanager
    async def preloaded(self, messages: int) -> AsyncIterator[str]:
        name = await new_queue(self.url, messages)
        try:
            yield name
        finally:
            await delete_queue(self.url, name)

    def watcher(self, source: str) -> RabbitMQMessageTrigger:
        return RabbitMQMessageTrigger(url=self.url, queue=source)

    async def all_acked(self, _source: str, triggerer: Triggerer, messages: int) -> bool:
        stats = triggerer.shared_streams.stats()
        return bool(sum(s.advanced_events for s in stats) >= messages)

    async def bare_loop(self, messages: int) -> float:
        async with self.preloaded(messages) as name:
            async with await aio_pika.connect(self.url) as connection:
                channel = await connection.channel()
                await channel.set_qos(prefetch_count=PREFETCH)
                queue = await channel.get_queue(name)
                acked = 0
                started = time.perf_counter()
                async with queue.iterator() as deliveries:
                    async for message in deliveries:
                        await message.ack()
                        acked += 1
                        if acked == messages:
                            break
                return time.perf_counter() - started


if __name__ == "__main__":
    broker_harness.main(
        __doc__,
        lambda args: contextlib.nullcontext(RabbitMQBench(args.url)),
        [broker_harness.Option("--url", "amqp://guest:guest@127.0.0.1:5672/", "broker")],
    )
