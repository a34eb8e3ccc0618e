"""Redis Streams end-to-end throughput: watchers through the real triggerer vs a bare
XREADGROUP/XACK loop on the same server in the same run.

Run by hand (never in tests):  .venv/bin/python bench/redis_bench.py [--messages 5000]
                                   [--url redis://127.0.0.1:6379/11] [--repeat 3]
                                   [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

Each case preloads M entries (a JSON ``body`` field) into a fresh stream of the server at
``--url``, then drains it through a fresh consumer group:

* bare: one redis-py asyncio loop, ``XREADGROUP COUNT 250 BLOCK 1000`` + one ``XACK`` per
  batch, from the first read until M entries are acked: what the server allows a client.
* sluice N=1 / N=10: N ``RedisStreamTrigger`` watchers (no filter) on the stream, run by the
  real ``Triggerer`` in-process on SQLite (and PostgreSQL with ``--pg``), from the
  producer's connection (the group starts reading after a 0.5 s cohort grace, so all N
  watchers see every entry) until all M x N asset events are committed and every entry is
  acked.

Figures: messages/s and asset events/s, min / median / max of ``--repeat`` runs, each case
alternating with the bare loop so both see the same load; the ratio is of medians. The
streams are deleted afterwards. What every broker bench shares is in ``broker_harness.py``.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import broker_harness
import redis.asyncio as redis_asyncio

from producers import RedisStreamTrigger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from engine.triggerer.triggerer import Triggerer

GROUP = "bench"
BARE_COUNT = 250
PRELOAD_CHUNK = 1000


async def new_stream(client: Any, messages: int) -> str:
    name = f"bench-{uuid.uuid4().hex[:12]}"
    for start in range(0, messages, PRELOAD_CHUNK):
        async with client.pipeline(transaction=False) as pipe:
            for n in range(start, min(messages, start + PRELOAD_CHUNK)):
                pipe.xadd(name, {"body": json.dumps({"n": n})})
            await pipe.execute()
    return name


async def all_acked(client: Any, stream: str) -> bool:
    """Nothing pending and every entry delivered to the group."""
    [group] = await client.xinfo_groups(stream)
    [(last, _)] = await client.xrevrange(stream, count=1)
    return bool(group["pending"] == 0 and group["last-delivered-id"] == last)


class RedisBench(broker_harness.BrokerBench):
    """A source is (client, stream name); "acked" is read from the group's ``XINFO``."""

    kind = "redis"

    def __init__(self, url: str) -> None:
        self.url = url

    @property
    def where(self) -> str:
        return f"Redis at {self.url}"

    @contextlib.asynccontextmanager
    async def preloaded(self, messages: int) -> AsyncIterator[tuple[Any, str]]:
        client = redis_asyncio.Redis.from_url(self.url)
        stream = ""
        try:
            stream = await new_stream(client, messages)
            yield client, stream
        finally:
            if stream:
                await client.delete(stream, f"{stream}:dead")
            await client.aclose()

    def watcher(self, source: tuple[Any, str]) -> RedisStreamTrigger:
        _, stream = source
        return RedisStreamTrigger(stream=stream, group=GROUP, url=self.url, block_ms=1000)

    async def all_acked(self, source: tuple[Any, str], _t: Triggerer, _m: int) -> bool:
        return await all_acked(*source)

    async def bare_loop(self, messages: int) -> float:
        async with self.preloaded(messages) as (client, stream):
            await client.xgroup_create(stream, GROUP, "0")
            started = time.perf_counter()
            acked = 0
            while acked < messages:
                reply = await client.xreadgroup(GROUP, "bare", {stream: ">"}, BARE_COUNT, 1000)
                for _, entries in reply or []:
                    ids = [entry_id for entry_id, _ in entries]
                    json.loads(entries[-1][1][b"body"])  # as a consumer would decode them
                    await client.xack(stream, GROUP, *ids)
                    acked += len(ids)
            return time.perf_counter() - started


if __name__ == "__main__":
    broker_harness.main(
        __doc__,
        lambda args: contextlib.nullcontext(RedisBench(args.url)),
        [broker_harness.Option("--url", "redis://127.0.0.1:6379/11", "the Redis server")],
        default_messages=5000,
        unit="entries",
        min_repeat=1,
    )
