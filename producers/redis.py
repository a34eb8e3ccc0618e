"""Redis Streams shared-stream producer (redis-py asyncio): one consumer of a group, acked
once resolved.

Theory of operation. ``open_stream`` connects, creates the consumer group on every stream
(``XGROUP CREATE ... MKSTREAM`` at ``start_id``; an existing group is kept as it is), then
loops in rounds. A round first does what is due, then reads:

1. *touch*: the entries in flight for a third of ``claim_idle_ms`` get their idle time reset
   (``XCLAIM ... JUSTID`` to this consumer), so no other consumer's ``XAUTOCLAIM`` takes an
   entry a slow subscriber still holds;
2. *redeliver*: entries a subscriber failed (ack timeout, overflow, no subscriber) are read
   again at once (``XCLAIM`` to this consumer: their delivery count goes up);
3. *own history*: on start, this consumer's own pending entries (read from id 0), so a
   restarted engine (same consumer name) redelivers what it held;
4. *claim*: every half ``claim_idle_ms``, ``XAUTOCLAIM`` the entries of any consumer idle
   for ``claim_idle_ms`` (a dead engine's);
5. *read*: ``XREADGROUP ... >`` with ``BLOCK`` on a connection of its own, for at most the
   free in-flight capacity (``max_in_flight``); ``advance`` interrupts the block
   (``CLIENT UNBLOCK``) when an entry must be read again.

An entry delivered more than ``max_deliveries`` times is not yielded: it is copied to the
dead stream (its fields, ``sluice.original_stream``, ``sluice.original_id`` and
``sluice.reason``) and acked in one ``MULTI``. Every other entry read is yielded as
``(RedisEntry, RedisEntryRef)`` and stays *in flight* until its advance.

``advance`` takes one lane's resolved prefix (a lane is a stream): clean -> one ``XACK`` with
every id; rejected -> dead stream + ``XACK`` (one ``MULTI``), or with ``on_reject="leave"``
left pending, not held: the next ``XAUTOCLAIM`` (this consumer's too) delivers it again
after ``claim_idle_ms``; failed or zero-subscriber -> left pending and read again at once.
``aclose`` marks what is still in flight idle for a long time (``XCLAIM ... IDLE``), so the
next owner's ``XAUTOCLAIM`` takes it at once, and closes the connections. Every redis-py
error is translated here to ``producers.exceptions``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Final

import anyio
import redis.asyncio as redis_asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from producers.exceptions import ProducerError
from producers.redis_core import (
    CLOSE_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    DEAD_LETTER_SUFFIX,
    DEFAULT_BLOCK_MS,
    DEFAULT_BODY_FIELD,
    DEFAULT_CLAIM_IDLE_MS,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_MAX_IN_FLIGHT,
    SOCKET_TIMEOUT_MARGIN_S,
    Disposition,
    InFlight,
    InFlightEntries,
    OnReject,
    RedisEndpoint,
    RedisEntry,
    RedisEntryRef,
    check_settings,
    dead_letter_fields,
    disposition_of,
    make_entry,
    read_plan,
    text,
)
from producers.redis_errors import translated
from shared_stream.producer import SharedStreamProducer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from shared_stream.producer import AdvanceItem

__all__ = ("RedisEntry", "RedisEntryRef", "RedisStreamProducer")

logger = logging.getLogger(__name__)

#: the idle time ``aclose`` gives the entries it releases: any claim takes them at once
RELEASED_IDLE_MS: Final = 2**40
REQUEST_RETRIES: Final = 2

# One entry read: (stream, entry id, raw fields, delivery count).
_Read = tuple[str, str, "Mapping[bytes, bytes]", int]


def default_consumer_name() -> str:
    """One consumer per engine process: ``<host>-<pid>``."""
    return f"{socket.gethostname()}-{os.getpid()}"


class RedisStreamProducer(SharedStreamProducer):
    """One consumer group's ack-mode producer over one or more streams; see the module
    docstring for the model."""

    def __init__(
        self,
        endpoint: RedisEndpoint,
        *,
        streams: Sequence[str],
        group: str,
        consumer_name: str | None = None,
        body_field: str = DEFAULT_BODY_FIELD,
        start_id: str = "0",
        block_ms: int = DEFAULT_BLOCK_MS,
        claim_idle_ms: int | None = DEFAULT_CLAIM_IDLE_MS,
        max_deliveries: int | None = DEFAULT_MAX_DELIVERIES,
        dead_letter_stream: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        on_reject: OnReject = "dead_letter",
    ) -> None:
        check_settings(
            streams=streams,
            group=group,
            url=endpoint.url,
            max_in_flight=max_in_flight,
            block_ms=block_ms,
            claim_idle_ms=claim_idle_ms,
            max_deliveries=max_deliveries,
            start_id=start_id,
            on_reject=on_reject,
        )
        self.endpoint = endpoint
        self.on_reject: OnReject = on_reject
        self.streams = tuple(streams)
        self.group = group
        self.consumer = consumer_name or default_consumer_name()
        self.body_field = body_field
        self.start_id = start_id
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self.max_deliveries = max_deliveries
        self.dead_letter_stream = dead_letter_stream
        self.max_in_flight = max_in_flight
        self.in_flight = InFlightEntries()
        self._redeliver: dict[str, dict[str, InFlight]] = defaultdict(dict)
        self._history: dict[str, str] = {}
        self._next_claim_at = 0.0
        self._claim_cursor = dict.fromkeys(self.streams, "0-0")
        self._turn = 0
        self._client: Any = None
        self._reader: Any = None
        self._reader_id: int | None = None
        self._blocked = False
        self._changed = anyio.Event()

    @property
    def address(self) -> str:
        return self.endpoint.address

    def dead_stream_of(self, stream: str) -> str:
        return self.dead_letter_stream or f"{stream}{DEAD_LETTER_SUFFIX}"

    # -- the producer ---------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[RedisEntry, RedisEntryRef]]:
        await self._connect()
        self._history = dict.fromkeys(self.streams, "0")
        while True:
            for read in await self._round():
                yield self._admit(read)

    def get_advance_lane(self, broker_payload: Any) -> str:
        ref: RedisEntryRef = broker_payload
        return ref.stream

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        plan: dict[Disposition, list[InFlight]] = {d: [] for d in Disposition}
        for ref, outcome in batch:
            entry = self.in_flight.pop(ref.stream, ref.entry_id)
            plan[disposition_of(outcome, self.on_reject)].append(entry)
        for entry in plan[Disposition.REDELIVER]:
            self._redeliver[entry.stream][entry.entry_id] = entry
        self._changed.set()
        if plan[Disposition.REDELIVER]:
            await self._interrupt_read()
        for stream, entries in _by_stream(plan[Disposition.DEAD_LETTER]).items():
            reason = "rejected by a watcher (its filter, or no partition key)"
            await self._dead_letter(stream, entries, reason)
        for stream, entries in _by_stream(plan[Disposition.ACK]).items():
            with translated("XACK", self.address):
                await self._client.xack(stream, self.group, *(e.entry_id for e in entries))

    async def aclose(self) -> None:
        """Release what is still in flight to the next claim (best effort), disconnect."""
        entries = self.in_flight.drain()
        for pending in self._redeliver.values():
            entries.extend(pending.values())
        self._redeliver.clear()
        client, reader = self._client, self._reader
        self._client = self._reader = None
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            try:
                if client is not None and entries:
                    await self._release(client, entries)
            except ProducerError as exc:
                logger.warning(
                    "Could not release %d in-flight Redis entries of %s: %s; another "
                    "consumer claims them after claim_idle_ms, this one on its restart",
                    len(entries),
                    self.address,
                    exc,
                    extra={"action": "redis.release_failed", "address": self.address},
                )
            finally:
                for connection in (reader, client):
                    if connection is not None:
                        await connection.aclose()

    # -- connecting -----------------------------------------------------------------------

    def _new_client(self, *, single: bool) -> Any:
        socket_timeout = self.block_ms / 1000 + SOCKET_TIMEOUT_MARGIN_S
        return redis_asyncio.Redis.from_url(
            self.endpoint.url,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=socket_timeout,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), REQUEST_RETRIES),
            single_connection_client=single,
            client_name=f"sluice:{self.consumer}",
        )

    async def _connect(self) -> None:
        if self._client is not None:
            raise RuntimeError(f"{self!r}: open_stream() runs once per producer")
        self._client = self._new_client(single=False)
        self._reader = self._new_client(single=True)
        with translated("connect", self.address):
            await self._client.ping()
            self._reader_id = await self._reader.client_id()
        for stream in self.streams:
            await self._create_group(stream)
        logger.info(
            "Redis stream producer connected to %s: group %s, consumer %s, streams %s",
            self.address,
            self.group,
            self.consumer,
            ", ".join(self.streams),
            extra={"action": "redis.connected", "address": self.address},
        )

    async def _create_group(self, stream: str) -> None:
        with translated("XGROUP CREATE", self.address):
            try:
                await self._client.xgroup_create(stream, self.group, self.start_id, mkstream=True)
            except redis_asyncio.ResponseError as exc:
                if not str(exc).startswith("BUSYGROUP"):
                    raise

    # -- one round ------------------------------------------------------------------------

    async def _round(self) -> list[_Read]:
        await self._touch_due()
        if any(self._redeliver.values()):
            return await self._checked(await self._read_again())
        capacity = self.max_in_flight - len(self.in_flight)
        if capacity <= 0:
            await self._wait_changed(self._seconds_to_due(claim=False))
            return []
        if self._history:
            return await self._checked(await self._read_history(capacity))
        if self.claim_idle_ms is not None and anyio.current_time() >= self._next_claim_at:
            return await self._checked(await self._claim(capacity))
        return await self._read_new(capacity)

    def _admit(self, read: _Read) -> tuple[RedisEntry, RedisEntryRef]:
        stream, entry_id, raw, count = read
        entry = InFlight(stream, entry_id, raw, count, touched_at=anyio.current_time())
        self.in_flight.add(entry)
        return make_entry(stream, entry_id, raw, self.body_field, count), RedisEntryRef(
            stream, entry_id
        )

    async def _read_new(self, capacity: int) -> list[_Read]:
        streams, count = read_plan(self.streams, capacity, self._turn)
        self._turn += 1
        block_ms = max(1, min(self.block_ms, int(self._seconds_to_due() * 1000)))
        self._blocked = True
        try:
            with translated("XREADGROUP", self.address):
                reply = await self._reader.xreadgroup(
                    self.group, self.consumer, dict.fromkeys(streams, ">"), count, block_ms
                )
        finally:
            self._blocked = False
        return [
            (stream, entry_id, raw, 1)
            for stream, entries in _entries_of(reply)
            for entry_id, raw in entries
            if raw  # never empty for a new entry; kept symmetric with history reads
        ]

    async def _read_history(self, capacity: int) -> list[_Read]:
        """This consumer's own pending entries, from id 0 (the start of a restarted one)."""
        streams, count = read_plan(list(self._history), capacity, self._turn)
        self._turn += 1
        ids = {stream: self._history[stream] for stream in streams}
        with translated("XREADGROUP", self.address):
            reply = await self._client.xreadgroup(self.group, self.consumer, ids, count)
        got: dict[str, list[tuple[str, Mapping[bytes, bytes]]]] = dict(_entries_of(reply))
        reads: list[_Read] = []
        for stream in streams:
            entries = got.get(stream, [])
            if not entries:
                del self._history[stream]
                continue
            self._history[stream] = entries[-1][0]
            live = [(i, raw) for i, raw in entries if not self._held(stream, i)]
            reads += await self._with_counts(stream, await self._drop_trimmed(stream, live))
        return reads

    async def _read_again(self) -> list[_Read]:
        """The entries subscribers failed, claimed again by this consumer (count + 1)."""
        reads: list[_Read] = []
        for stream, entries in list(self._redeliver.items()):
            del self._redeliver[stream]
            counts = {
                i: e.delivery_count + 1
                for i, e in entries.items()
                if (stream, i) not in self.in_flight
            }
            if not counts:
                continue
            with translated("XCLAIM", self.address):
                claimed = await self._client.xclaim(
                    stream, self.group, self.consumer, 0, list(counts)
                )
            found = {text(i): raw for i, raw in claimed}
            _log_lost(stream, [i for i in counts if i not in found], self.address)
            reads += [(stream, i, raw, counts[i]) for i, raw in found.items()]
        return reads

    async def _claim(self, capacity: int) -> list[_Read]:
        """Entries of any consumer idle for ``claim_idle_ms`` (a dead engine's)."""
        assert self.claim_idle_ms is not None
        streams, count = read_plan(self.streams, capacity, self._turn)
        self._turn += 1
        more = False
        reads: list[_Read] = []
        for stream in streams:
            with translated("XAUTOCLAIM", self.address):
                cursor, entries, *deleted = await self._client.xautoclaim(
                    stream,
                    self.group,
                    self.consumer,
                    self.claim_idle_ms,
                    self._claim_cursor[stream],
                    count=count,
                )
            self._claim_cursor[stream] = text(cursor)
            more = more or text(cursor) != "0-0"
            _log_lost(stream, [text(i) for i in (deleted[0] if deleted else [])], self.address)
            live = [(text(i), raw) for i, raw in entries if not self._held(stream, text(i))]
            reads += await self._with_counts(stream, live)
        if reads:
            logger.info(
                "Redis consumer %s claimed %d idle pending entries of group %s on %s",
                self.consumer,
                len(reads),
                self.group,
                self.address,
                extra={"action": "redis.claimed", "address": self.address},
            )
        if not more:
            self._next_claim_at = anyio.current_time() + self.claim_idle_ms / 2000
        return reads

    def _held(self, stream: str, entry_id: str) -> bool:
        """Whether this producer holds the entry already (in flight, or to read again)."""
        return (stream, entry_id) in self.in_flight or entry_id in self._redeliver.get(stream, {})

    async def _with_counts(
        self, stream: str, entries: Sequence[tuple[str, Mapping[bytes, bytes]]]
    ) -> list[_Read]:
        """``entries`` (this consumer's now) with their delivery counts (``XPENDING``)."""
        if not entries:
            return []
        ids = sorted((i for i, _ in entries), key=_id_key)
        with translated("XPENDING", self.address):
            pending = await self._client.xpending_range(
                stream,
                self.group,
                ids[0],
                ids[-1],
                len(entries) + len(self.in_flight),
                consumername=self.consumer,
            )
        counts = {text(p["message_id"]): int(p["times_delivered"]) for p in pending}
        return [(stream, i, raw, counts.get(i, 1)) for i, raw in entries]

    async def _drop_trimmed(
        self, stream: str, entries: Sequence[tuple[str, Mapping[bytes, bytes]]]
    ) -> list[tuple[str, Mapping[bytes, bytes]]]:
        """Entries a history read returns without fields were trimmed or deleted before
        they were acked: ack them (nothing is left to deliver) and say so."""
        gone = [i for i, raw in entries if not raw]
        if gone:
            _log_lost(stream, gone, self.address)
            with translated("XACK", self.address):
                await self._client.xack(stream, self.group, *gone)
        return [(i, raw) for i, raw in entries if raw]

    async def _checked(self, reads: list[_Read]) -> list[_Read]:
        """``reads`` without those delivered more than ``max_deliveries`` times, which go to
        the dead stream."""
        limit = self.max_deliveries
        if limit is None:
            return reads
        over = [r for r in reads if r[3] > limit]
        for stream, group in _by_stream_reads(over).items():
            entries = [InFlight(s, i, raw, n, touched_at=0.0) for s, i, raw, n in group]
            await self._dead_letter(
                stream, entries, f"delivered more than max_deliveries={limit} times"
            )
        return [r for r in reads if r[3] <= limit] if over else reads

    # -- what is due ----------------------------------------------------------------------

    def _touch_every_s(self) -> float | None:
        return None if self.claim_idle_ms is None else self.claim_idle_ms / 3000

    def _seconds_to_due(self, *, claim: bool = True) -> float:
        """Seconds until the next touch (or claim) is due: block at most that long."""
        now = anyio.current_time()
        due = [now + self.block_ms / 1000]
        every_s = self._touch_every_s()
        if every_s is not None:
            if claim:
                due.append(self._next_claim_at)
            if (touch := self.in_flight.next_due(every_s)) is not None:
                due.append(touch)
        return max(0.0, min(due) - now)

    async def _touch_due(self) -> None:
        every_s = self._touch_every_s()
        if every_s is None:
            return
        now = anyio.current_time()
        due = self.in_flight.due(now, every_s)
        for stream, entries in _by_stream(due).items():
            with translated("XCLAIM", self.address):
                await self._client.xclaim(
                    stream,
                    self.group,
                    self.consumer,
                    0,
                    [e.entry_id for e in entries],
                    justid=True,
                )
        self.in_flight.touched(due, now)

    async def _wait_changed(self, timeout_s: float) -> None:
        self._changed = anyio.Event()
        with anyio.move_on_after(timeout_s):
            await self._changed.wait()

    async def _interrupt_read(self) -> None:
        """End a blocked ``XREADGROUP`` now (as if its block timed out), so the round that
        reads failed entries again starts at once."""
        if not self._blocked or self._reader_id is None or self._client is None:
            return
        try:
            with translated("CLIENT UNBLOCK", self.address):
                await self._client.client_unblock(self._reader_id, error=False)
        except ProducerError as exc:  # e.g. an ACL without CLIENT: the block times out
            logger.debug("Could not interrupt the blocked read on %s: %s", self.address, exc)

    # -- writes ---------------------------------------------------------------------------

    async def _dead_letter(self, stream: str, entries: Sequence[InFlight], reason: str) -> None:
        """Copy ``entries`` of ``stream`` to its dead stream and ack them, in one MULTI."""
        dead = self.dead_stream_of(stream)
        with translated("MULTI XADD/XACK", self.address):
            async with self._client.pipeline(transaction=True) as pipe:
                for entry in entries:
                    pipe.xadd(
                        dead, dead_letter_fields(entry.raw_fields, stream, entry.entry_id, reason)
                    )
                pipe.xack(stream, self.group, *(e.entry_id for e in entries))
                await pipe.execute()
        logger.warning(
            "Moved %d Redis entries of stream %s to %s: %s (ids %s)",
            len(entries),
            stream,
            dead,
            reason,
            ", ".join(e.entry_id for e in entries[:5]),
            extra={"action": "redis.dead_lettered", "address": self.address, "stream": stream},
        )

    async def _release(self, client: Any, entries: Sequence[InFlight]) -> None:
        for stream, held in _by_stream(entries).items():
            with translated("XCLAIM", self.address):
                await client.xclaim(
                    stream,
                    self.group,
                    self.consumer,
                    0,
                    [e.entry_id for e in held],
                    idle=RELEASED_IDLE_MS,
                    justid=True,
                )

    def __repr__(self) -> str:
        return (
            f"<RedisStreamProducer {self.address} group={self.group!r} "
            f"consumer={self.consumer!r} streams={list(self.streams)} "
            f"in_flight={len(self.in_flight)} connected={self._client is not None}>"
        )


def _entries_of(reply: Any) -> list[tuple[str, list[tuple[str, Mapping[bytes, bytes]]]]]:
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


def _by_stream(entries: Sequence[InFlight]) -> dict[str, list[InFlight]]:
    grouped: dict[str, list[InFlight]] = defaultdict(list)
    for entry in entries:
        grouped[entry.stream].append(entry)
    return grouped


def _by_stream_reads(reads: Sequence[_Read]) -> dict[str, list[_Read]]:
    grouped: dict[str, list[_Read]] = defaultdict(list)
    for read in reads:
        grouped[read[0]].append(read)
    return grouped


def _log_lost(stream: str, entry_ids: Sequence[str], address: str) -> None:
    if not entry_ids:
        return
    logger.warning(
        "Redis entries %s of stream %s on %s were trimmed or deleted before Sluice acked "
        "them: they are lost (MAXLEN / XTRIM / XDEL are the stream owner's)",
        ", ".join(entry_ids[:5]),
        stream,
        address,
        extra={"action": "redis.entries_lost", "address": address, "stream": stream},
    )
