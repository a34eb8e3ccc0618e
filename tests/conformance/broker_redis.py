"""The kit's Redis Streams adapter: ``RedisStreamTrigger`` on the machine's Redis
(``tests/services_redis.py``, database 11).

A stream of ``lanes`` lanes is that many Redis streams (``<name>-0``, ``<name>-1``, ...)
read by one consumer group, with one dead stream ``<name>:dead`` for all of them. Watchers
claim a dead engine's pending entries after ``CLAIM_IDLE_MS``, so what an engine held when
it died comes back within the case. ``unresolved`` is what the group would still deliver:
its pending entries (in flight included) plus the entries after its last-delivered id (all
of them before the engine made the group). ``dead_lettered`` reads the dead stream's
``body`` fields in arrival order. The private broker is a ``redis-server`` of the case's own
that keeps its data in an append-only file, so a restart keeps streams and groups.
"""

from __future__ import annotations

import json
import uuid
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Final

import anyio
import redis.asyncio as redis_asyncio

from tests.services_redis import PrivateRedisServer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping, Sequence

    import pytest

KIND: Final = "redis"
GROUP: Final = "sluice-kit"
CLAIM_IDLE_MS: Final = 1000  # what an engine that died held comes back after this
BLOCK_MS: Final = 1000


_UNRESOLVED: Final = """
local total = 0
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    local found = false
    for _, flat in ipairs(redis.call('XINFO', 'GROUPS', key)) do
      local group = {}
      for i = 1, #flat, 2 do group[flat[i]] = flat[i + 1] end
      if group['name'] == ARGV[1] then
        found = true
        local after = redis.call('XRANGE', key, '(' .. group['last-delivered-id'], '+')
        total = total + group['pending'] + #after
      end
    end
    if not found then total = total + redis.call('XLEN', key) end
  end
end
return total
"""


class RedisKitStream:
    """``lanes`` streams, one consumer group, one dead stream."""

    imports = "from producers import RedisStreamTrigger"

    def __init__(self, url: str, lanes: int) -> None:
        self.url = url
        self.lanes = lanes
        self.name = f"kit-{uuid.uuid4().hex[:16]}"
        self.streams = [f"{self.name}-{lane}" for lane in range(lanes)]
        self.dead = f"{self.name}:dead"
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            self._client = redis_asyncio.Redis.from_url(self.url)
        return self._client

    async def reconnect(self) -> None:
        """A restarted server: drop the old connections."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def watcher_source(
        self,
        *,
        match: Mapping[str, Any] | None = None,
        dead_letter: bool = True,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {
            "streams": self.streams,
            "group": GROUP,
            "url": self.url,
            "dead_letter_stream": self.dead,
            "claim_idle_ms": CLAIM_IDLE_MS,
            "block_ms": BLOCK_MS,
        }
        if match:
            kwargs["body_filter"] = dict(match)
        if not dead_letter:
            kwargs["on_reject"] = "leave"  # pending: claimed and delivered again
        kwargs.update(options or {})
        return f"RedisStreamTrigger(**{kwargs!r})"

    async def publish(self, bodies: Sequence[Mapping[str, Any]], *, lane: int = 0) -> None:
        async with self.client().pipeline(transaction=False) as pipe:
            for body in bodies:
                pipe.xadd(self.streams[lane], {"body": json.dumps(dict(body))})
            await pipe.execute()

    async def publish_raw(self, payload: bytes, *, lane: int = 0) -> None:
        await self.client().xadd(self.streams[lane], {"body": payload})

    async def unresolved(self) -> int:
        # One script: every stream's pending and undelivered counts at one instant (read
        # apart, a consumer read in between would hide entries from both counts).
        return int(await self.client().eval(_UNRESOLVED, len(self.streams), *self.streams, GROUP))

    async def dead_lettered(self) -> list[bytes]:
        return [fields[b"body"] for _, fields in await self.client().xrange(self.dead)]

    async def aclose(self) -> None:
        try:
            await self.client().delete(*self.streams, self.dead)
        finally:
            await self.reconnect()


@asynccontextmanager
async def _stream(url: str, lanes: int, made: list[RedisKitStream]) -> AsyncIterator[Any]:
    stream = RedisKitStream(url, lanes)
    made.append(stream)
    try:
        yield stream
    finally:
        made.remove(stream)
        await stream.aclose()


class PrivateRedis:
    """A ``redis-server`` of one case's own (append-only file: a restart keeps the data)."""

    def __init__(self) -> None:
        self.server = PrivateRedisServer()
        self._streams: list[RedisKitStream] = []

    def stream(self, *, lanes: int = 1) -> Any:
        return _stream(self.server.url, lanes, self._streams)

    async def stop(self) -> None:
        await anyio.to_thread.run_sync(self.server.stop)

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self.server.start)
        for stream in self._streams:
            await stream.reconnect()


class RedisKit:
    kind = KIND
    cannot: Mapping[str, str] = {}
    #: what an engine logs when it (re)opens a consumer or moves entries of the group (acks
    #: are not logged one by one: a zombie's would fail on its fenced commands)
    consumer_actions = frozenset({"redis.connected", "redis.claimed", "redis.dead_lettered"})
    disturbed_actions: frozenset[str] = frozenset()

    def __init__(self, url: str) -> None:
        self.url = url
        self._streams: list[RedisKitStream] = []

    def stream(self, *, lanes: int = 1) -> Any:
        return _stream(self.url, lanes, self._streams)

    @asynccontextmanager
    async def private(self) -> AsyncIterator[PrivateRedis]:
        private = PrivateRedis()
        await private.start()
        try:
            yield private
        finally:
            await anyio.to_thread.run_sync(private.server.remove)

    def payload_n(self, payload: Mapping[str, Any]) -> int:
        return int(payload["body"]["n"])

    def dedup_prefix(self) -> str:
        return "redis:"


@contextmanager
def kit_broker(request: pytest.FixtureRequest) -> Iterator[RedisKit]:
    """The kit's Redis Streams broker: database 11 of the machine's Redis."""
    yield RedisKit(request.getfixturevalue("redis_streams_url"))
