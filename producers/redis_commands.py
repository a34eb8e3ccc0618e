"""The Redis commands of one consumer in one consumer group (redis-py asyncio).

``GroupCommands`` owns the two connections of a ``RedisStreamProducer``: a pool for every
command, and one connection of its own for the blocking ``XREADGROUP`` (so that ``CLIENT
UNBLOCK`` can end that block from the pool's side). Each method is one command (or one
``MULTI``), returns plain values (text ids, raw field dicts) and translates redis-py's
errors (``producers.redis_errors``); what to read, claim or ack is the producer's call.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

import redis.asyncio as redis_asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from producers.exceptions import ProducerError
from producers.redis_core import (
    CONNECT_TIMEOUT_S,
    SOCKET_TIMEOUT_MARGIN_S,
    RedisEndpoint,
    dead_letter_fields,
    text,
)
from producers.redis_errors import translated

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)

#: the idle time ``release`` gives entries: any claim takes them at once
RELEASED_IDLE_MS: Final = 2**40
REQUEST_RETRIES: Final = 2

# (entry id, raw fields): what a read or a claim returns for one entry
Raw = tuple[str, "Mapping[bytes, bytes]"]


class GroupCommands:
    """The commands of consumer ``consumer`` of ``group`` on the server at ``endpoint``."""

    def __init__(self, endpoint: RedisEndpoint, group: str, consumer: str, block_ms: int) -> None:
        self.endpoint = endpoint
        self.group = group
        self.consumer = consumer
        self.block_ms = block_ms
        self.blocked = False
        self.fenced = False
        self._client: Any = None
        self._reader: Any = None
        self._reader_id: int | None = None

    @property
    def address(self) -> str:
        return self.endpoint.address

    @property
    def connected(self) -> bool:
        return self._client is not None

    def _new_client(self, *, single: bool) -> Any:
        return redis_asyncio.Redis.from_url(
            self.endpoint.url,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=self.block_ms / 1000 + SOCKET_TIMEOUT_MARGIN_S,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), REQUEST_RETRIES),
            single_connection_client=single,
            client_name=f"sluice:{self.consumer}",
        )

    def _check(self, action: str) -> None:
        """Refuse every command once fenced: another engine owns the group's entries now,
        and a claim, a touch or an ack from here would take them from it."""
        if self.fenced:
            raise ProducerError(
                f"Redis consumer {self.consumer} of group {self.group} on {self.address} is "
                f"fenced: {action} is not sent"
            )

    async def connect(self) -> None:
        if self._client is not None:
            raise RuntimeError(f"{self!r} is connected already")
        self._client = self._new_client(single=False)
        self._reader = self._new_client(single=True)
        with translated("connect", self.address):
            await self._client.ping()
            self._reader_id = await self._reader.client_id()

    async def aclose(self) -> None:
        client, reader = self._client, self._reader
        self._client = self._reader = None
        for connection in (reader, client):
            if connection is not None:
                await connection.aclose()

    async def create_group(self, stream: str, start_id: str) -> None:
        """``XGROUP CREATE ... MKSTREAM``; an existing group is kept as it is."""
        self._check("create_group")
        with translated("XGROUP CREATE", self.address):
            try:
                await self._client.xgroup_create(stream, self.group, start_id, mkstream=True)
            except redis_asyncio.ResponseError as exc:
                if not str(exc).startswith("BUSYGROUP"):
                    raise

    # -- reads and claims -----------------------------------------------------------------

    async def read_new(
        self, streams: Sequence[str], count: int, block_ms: int
    ) -> list[tuple[str, list[Raw]]]:
        """``XREADGROUP ... >`` on the reader's connection, blocking up to ``block_ms``."""
        self._check("read_new")
        self.blocked = True
        try:
            with translated("XREADGROUP", self.address):
                reply = await self._reader.xreadgroup(
                    self.group, self.consumer, dict.fromkeys(streams, ">"), count, block_ms
                )
        finally:
            self.blocked = False
        return _entries_of(reply)

    async def read_history(self, after: Mapping[str, str], count: int) -> dict[str, list[Raw]]:
        """This consumer's own pending entries after the given ids (no block); an entry
        trimmed since it was read comes with empty fields."""
        self._check("read_history")
        with translated("XREADGROUP", self.address):
            reply = await self._client.xreadgroup(self.group, self.consumer, dict(after), count)
        return dict(_entries_of(reply))

    async def claim(self, stream: str, entry_ids: Sequence[str]) -> list[Raw]:
        """``XCLAIM`` these entries to this consumer now (their delivery count goes up);
        entries trimmed meanwhile are dropped from the pending list and not returned."""
        self._check("claim")
        with translated("XCLAIM", self.address):
            claimed = await self._client.xclaim(
                stream, self.group, self.consumer, 0, list(entry_ids)
            )
        return [(text(i), raw) for i, raw in claimed]

    async def autoclaim(
        self, stream: str, min_idle_ms: int, cursor: str, count: int
    ) -> tuple[str, list[Raw], list[str]]:
        """``XAUTOCLAIM``: the next cursor, the entries claimed, the ids found trimmed."""
        self._check("autoclaim")
        with translated("XAUTOCLAIM", self.address):
            reply = await self._client.xautoclaim(
                stream, self.group, self.consumer, min_idle_ms, cursor, count=count
            )
        next_cursor, entries, *deleted = reply
        gone = [text(i) for i in (deleted[0] if deleted else [])]
        return text(next_cursor), [(text(i), raw or {}) for i, raw in entries], gone

    async def touch(self, stream: str, entry_ids: Sequence[str]) -> None:
        """Reset the idle time of entries this consumer holds (``XCLAIM ... JUSTID``)."""
        self._check("touch")
        with translated("XCLAIM", self.address):
            await self._client.xclaim(
                stream, self.group, self.consumer, 0, list(entry_ids), justid=True
            )

    async def release(self, stream: str, entry_ids: Sequence[str]) -> None:
        """Mark entries idle for a long time, so that the next claim takes them at once."""
        self._check("release")
        with translated("XCLAIM", self.address):
            await self._client.xclaim(
                stream,
                self.group,
                self.consumer,
                0,
                list(entry_ids),
                idle=RELEASED_IDLE_MS,
                justid=True,
            )

    async def delivery_counts(
        self, stream: str, entry_ids: Sequence[str], limit: int
    ) -> dict[str, int]:
        """How many times each of this consumer's pending entries was delivered
        (``XPENDING`` over their id range, at most ``limit`` rows)."""
        self._check("delivery_counts")
        ids = sorted(entry_ids, key=_id_key)
        with translated("XPENDING", self.address):
            pending = await self._client.xpending_range(
                stream, self.group, ids[0], ids[-1], limit, consumername=self.consumer
            )
        return {text(p["message_id"]): int(p["times_delivered"]) for p in pending}

    # -- acks -----------------------------------------------------------------------------

    async def ack(self, stream: str, entry_ids: Sequence[str]) -> None:
        self._check("ack")
        with translated("XACK", self.address):
            await self._client.xack(stream, self.group, *entry_ids)

    async def dead_letter(
        self, stream: str, dead_stream: str, entries: Sequence[Raw], reason: str
    ) -> None:
        """Copy ``entries`` to ``dead_stream`` and ack them, in one ``MULTI``."""
        self._check("dead_letter")
        with translated("MULTI XADD/XACK", self.address):
            async with self._client.pipeline(transaction=True) as pipe:
                for entry_id, raw in entries:
                    pipe.xadd(dead_stream, dead_letter_fields(raw, stream, entry_id, reason))
                pipe.xack(stream, self.group, *(entry_id for entry_id, _ in entries))
                await pipe.execute()

    async def unblock_read(self) -> None:
        """End a blocked ``read_new`` now, as if its block timed out (``CLIENT UNBLOCK``);
        without the right to (an ACL without ``CLIENT``), the block just runs out."""
        if not self.blocked or self._reader_id is None or self._client is None:
            return
        try:
            with translated("CLIENT UNBLOCK", self.address):
                await self._client.client_unblock(self._reader_id, error=False)
        except ProducerError as exc:
            logger.debug("Could not interrupt the blocked read on %s: %s", self.address, exc)

    async def forget_idle_consumers(self, stream: str, idle_ms: int) -> list[str]:
        """Delete the group's other consumers that hold nothing and were idle for
        ``idle_ms`` (the names of engines gone): they would pile up, one per restart."""
        self._check("forget_idle_consumers")
        with translated("XINFO CONSUMERS", self.address):
            consumers = await self._client.xinfo_consumers(stream, self.group)
        gone = [
            text(c["name"])
            for c in consumers
            if text(c["name"]) != self.consumer and c["pending"] == 0 and c["idle"] >= idle_ms
        ]
        for name in gone:
            with translated("XGROUP DELCONSUMER", self.address):
                await self._client.xgroup_delconsumer(stream, self.group, name)
        return gone

    def __repr__(self) -> str:
        return (
            f"<GroupCommands {self.address} group={self.group!r} consumer={self.consumer!r} "
            f"connected={self.connected} blocked={self.blocked}>"
        )


def _entries_of(reply: Any) -> list[tuple[str, list[Raw]]]:
    """An ``XREADGROUP`` reply as ``[(stream, [(entry id, fields), ...]), ...]``."""
    if not reply:
        return []
    items = reply.items() if isinstance(reply, dict) else reply
    return [
        (text(stream), [(text(i), raw or {}) for i, raw in entries]) for stream, entries in items
    ]


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
