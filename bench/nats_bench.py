"""NATS JetStream end-to-end throughput: watchers through the real triggerer vs a bare loop.

Run by hand (never in tests):  .venv/bin/python bench/nats_bench.py [--messages 2000]
                                   [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]
                                   [--servers nats://127.0.0.1:4222]

The machine's nats-server with JetStream (``../shared/SERVICES.md``). Each case publishes M
messages into a fresh stream (deleted afterwards), then drains it:

* bare: one nats-py loop on a durable pull consumer (explicit ack), ``fetch(256)`` + ``ack``
  of each + one ``flush`` per batch, from the first fetch until M messages are acked: what
  the broker allows.
* sluice N=1 / N=10: N ``NatsJetStreamTrigger`` watchers (no filter) on the stream, run by
  the real ``Triggerer`` in-process on SQLite (and PostgreSQL with ``--pg``), from the
  producer's connection (the group starts after a 0.5 s cohort grace, so all N watchers
  see every message) until all M x N asset events are committed and the consumer has no
  message pending nor unacked.

Figures: messages/s (M / seconds) and asset events/s, min / median / max of ``--repeat``
(>= 3) runs, each case alternating with the bare loop so both see the same load; the ratio
is of medians of the same run. What every broker bench shares is in ``broker_harness.py``.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import broker_harness
import nats
from nats.js.api import ConsumerConfig

from producers import NatsJetStreamTrigger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from engine.triggerer.triggerer import Triggerer

DURABLE = "bench"
PUBLISH_CHUNK = 200


async def new_stream(js: Any, messages: int) -> str:
    name = f"BENCH{uuid.uuid4().hex[:12]}"
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    for start in range(0, messages, PUBLISH_CHUNK):
        async with anyio.create_task_group() as tg:
            for n in range(start, min(messages, start + PUBLISH_CHUNK)):
                tg.start_soon(js.publish, f"{name}.x", json.dumps({"n": n}).encode())
    return name


async def consumer_drained(js: Any, stream: str) -> bool:
    info = await js.consumer_info(stream, DURABLE)
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


@dataclass(frozen=True, slots=True)
class Source:
    nc: Any
    js: Any
    stream: str


class NatsBench(broker_harness.BrokerBench):
    """A source is a stream (and the connection that made it); "acked" is read from the
    durable consumer's info."""

    kind = "nats"

    def __init__(self, servers: str) -> None:
        self.servers = servers

    @property
    def where(self) -> str:
        return f"nats-server at {self.servers}"

    @contextlib.asynccontextmanager
    async def preloaded(self, messages: int) -> AsyncIterator[Source]:
        nc = await nats.connect(self.servers)
        js = nc.jetstream()
        stream = await new_stream(js, messages)
        try:
            yield Source(nc, js, stream)
        finally:
            await js.delete_stream(stream)
            await nc.close()

    def watcher(self, source: Source) -> NatsJetStreamTrigger:
        return NatsJetStreamTrigger(servers=self.servers, stream=source.stream, durable=DURABLE)

    async def all_acked(self, source: Source, _t: Triggerer, _m: int) -> bool:
        return await consumer_drained(source.js, source.stream)

    async def bare_loop(self, messages: int) -> float:
        async with self.preloaded(messages) as source:
            js, stream = source.js, source.stream
            await js.add_consumer(stream, ConsumerConfig(durable_name=DURABLE, ack_wait=30))
            subscription = await js.pull_subscribe_bind(DURABLE, stream=stream)
            started = time.perf_counter()
            acked = 0
            while acked < messages:
                try:
                    batch = await subscription.fetch(256, timeout=1)
                except nats.errors.TimeoutError:
                    continue
                for msg in batch:
                    await msg.ack()
                await source.nc.flush()
                acked += len(batch)
            return time.perf_counter() - started


if __name__ == "__main__":
    broker_harness.main(
        __doc__,
        lambda args: contextlib.nullcontext(NatsBench(args.servers)),
        [broker_harness.Option("--servers", "nats://127.0.0.1:4222", "nats-server -js")],
    )
