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
next owner's ``XAUTOCLAIM`` takes it at once, and closes the connections. ``fence`` (the
engine lost the group to another) stops every command at once: what it held is claimed by
the new owner after ``claim_idle_ms``. After each full
claim pass, the group's other consumers that hold nothing and were idle for
``claim_idle_ms`` are deleted (one name per engine process would pile up otherwise). The
commands themselves, and the translation of redis-py's errors, are ``GroupCommands``'.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import anyio

from producers.exceptions import ProducerError
from producers.redis_commands import GroupCommands
from producers.redis_core import (
    CLOSE_TIMEOUT_S,
    DEAD_LETTER_SUFFIX,
    DEFAULT_BLOCK_MS,
    DEFAULT_BODY_FIELD,
    DEFAULT_CLAIM_IDLE_MS,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_MAX_IN_FLIGHT,
    READ_ENTRIES,
    Disposition,
    InFlight,
    InFlightEntries,
    OnReject,
    RedisEndpoint,
    RedisEntry,
    RedisEntryRef,
    check_settings,
    disposition_of,
    make_entry,
    read_plan,
)
from shared_stream.producer import SharedStreamProducer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from producers.redis_commands import Raw
    from shared_stream.producer import AdvanceItem

__all__ = ("RedisEntry", "RedisEntryRef", "RedisStreamProducer")

logger = logging.getLogger(__name__)

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
        self.commands = GroupCommands(endpoint, group, self.consumer, block_ms)
        self._redeliver: dict[str, dict[str, InFlight]] = defaultdict(dict)
        self._history: dict[str, str] = {}
        self._next_claim_at = 0.0
        self._claim_cursor = dict.fromkeys(self.streams, "0-0")
        self._turn = 0
        self._opened = False
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

    def fence(self) -> None:
        """Send nothing more to the group (no read, claim, touch nor ack): another engine
        owns it now and claims what this one held after ``claim_idle_ms``."""
        self.commands.fenced = True
        self._changed.set()
        logger.warning(
            "Redis consumer %s of group %s on %s fenced: reads, claims and acks nothing more",
            self.consumer,
            self.group,
            self.address,
            extra={"action": "redis.fenced", "address": self.address},
        )

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        if self.commands.fenced:
            raise ProducerError(f"{self!r} is fenced: nothing is acked")
        plan: dict[Disposition, list[InFlight]] = {d: [] for d in Disposition}
        for ref, outcome in batch:
            entry = self.in_flight.pop(ref.stream, ref.entry_id)
            plan[disposition_of(outcome, self.on_reject)].append(entry)
        for entry in plan[Disposition.REDELIVER]:
            self._redeliver[entry.stream][entry.entry_id] = entry
        self._changed.set()
        if plan[Disposition.REDELIVER]:
            await self.commands.unblock_read()
        for stream, entries in _by_stream(plan[Disposition.DEAD_LETTER]).items():
            reason = "rejected by a watcher (its filter, or no partition key)"
            await self._dead_letter(stream, [(e.entry_id, e.raw_fields) for e in entries], reason)
        for stream, entries in _by_stream(plan[Disposition.ACK]).items():
            await self.commands.ack(stream, [e.entry_id for e in entries])

    async def aclose(self) -> None:
        """Release what is still in flight to the next claim (best effort), disconnect."""
        entries = self.in_flight.drain()
        for pending in self._redeliver.values():
            entries.extend(pending.values())
        self._redeliver.clear()
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            try:
                if self.commands.connected and not self.commands.fenced:
                    for stream, held in _by_stream(entries).items():
                        await self.commands.release(stream, [e.entry_id for e in held])
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
                await self.commands.aclose()

    async def _connect(self) -> None:
        if self._opened:
            raise RuntimeError(f"{self!r}: open_stream() runs once per producer")
        self._opened = True
        await self.commands.connect()
        for stream in self.streams:
            await self.commands.create_group(stream, self.start_id)
        logger.info(
            "Redis stream producer connected to %s: group %s, consumer %s, streams %s",
            self.address,
            self.group,
            self.consumer,
            ", ".join(self.streams),
            extra={"action": "redis.connected", "address": self.address},
        )

    # -- one round ------------------------------------------------------------------------

    async def _round(self) -> list[_Read]:
        await self._touch_due()
        if any(self._redeliver.values()):
            return await self._checked(await self._read_again())
        # At most READ_ENTRIES a read: without hiredis, redis-py parses a reply in Python on
        # the event loop (~0.2 ms an entry on a busy machine): a big one would block it.
        capacity = min(self.max_in_flight - len(self.in_flight), READ_ENTRIES)
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
        got = await self.commands.read_new(streams, count, block_ms)
        return [(stream, i, raw, 1) for stream, entries in got for i, raw in entries if raw]

    async def _read_history(self, capacity: int) -> list[_Read]:
        """This consumer's own pending entries, from id 0 (the start of a restarted one)."""
        streams, count = read_plan(list(self._history), capacity, self._turn)
        self._turn += 1
        got = await self.commands.read_history({s: self._history[s] for s in streams}, count)
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
            found = dict(await self.commands.claim(stream, list(counts)))
            _log_lost(stream, [i for i in counts if i not in found], self.address)
            reads += [(stream, i, raw, counts[i]) for i, raw in found.items()]
        return reads

    async def _claim(self, capacity: int) -> list[_Read]:
        """Entries of any consumer idle for ``claim_idle_ms`` (a dead engine's)."""
        idle_ms = self.claim_idle_ms
        assert idle_ms is not None
        streams, count = read_plan(self.streams, capacity, self._turn)
        self._turn += 1
        more = False
        reads: list[_Read] = []
        for stream in streams:
            cursor, entries, gone = await self.commands.autoclaim(
                stream, idle_ms, self._claim_cursor[stream], count
            )
            self._claim_cursor[stream] = cursor
            if cursor == "0-0":
                await self._forget_idle_consumers(stream, idle_ms)
            more = more or cursor != "0-0"
            _log_lost(stream, gone, self.address)
            live = [(i, raw) for i, raw in entries if not self._held(stream, i)]
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
            self._next_claim_at = anyio.current_time() + idle_ms / 2000
        return reads

    async def _forget_idle_consumers(self, stream: str, idle_ms: int) -> None:
        gone = await self.commands.forget_idle_consumers(stream, idle_ms)
        if gone:
            logger.info(
                "Deleted %d idle Redis consumers holding nothing from group %s of %s: %s",
                len(gone),
                self.group,
                stream,
                ", ".join(gone[:5]),
                extra={"action": "redis.consumers_deleted", "address": self.address},
            )

    def _held(self, stream: str, entry_id: str) -> bool:
        """Whether this producer holds the entry already (in flight, or to read again)."""
        return (stream, entry_id) in self.in_flight or entry_id in self._redeliver.get(stream, {})

    async def _with_counts(self, stream: str, entries: Sequence[Raw]) -> list[_Read]:
        """``entries`` (this consumer's now) with their delivery counts."""
        if not entries:
            return []
        limit = len(entries) + len(self.in_flight)
        counts = await self.commands.delivery_counts(stream, [i for i, _ in entries], limit)
        return [(stream, i, raw, counts.get(i, 1)) for i, raw in entries]

    async def _drop_trimmed(self, stream: str, entries: Sequence[Raw]) -> list[Raw]:
        """Entries a history read returns without fields were trimmed or deleted before
        they were acked: ack them (nothing is left to deliver) and say so."""
        gone = [i for i, raw in entries if not raw]
        if gone:
            _log_lost(stream, gone, self.address)
            await self.commands.ack(stream, gone)
        return [(i, raw) for i, raw in entries if raw]

    async def _checked(self, reads: list[_Read]) -> list[_Read]:
        """``reads`` without those delivered more than ``max_deliveries`` times, which go to
        the dead stream."""
        limit = self.max_deliveries
        if limit is None:
            return reads
        over = [r for r in reads if r[3] > limit]
        by_stream: dict[str, list[Raw]] = defaultdict(list)
        for stream, entry_id, raw, _ in over:
            by_stream[stream].append((entry_id, raw))
        for stream, entries in by_stream.items():
            reason = f"delivered more than max_deliveries={limit} times"
            await self._dead_letter(stream, entries, reason)
        return [r for r in reads if r[3] <= limit] if over else reads

    async def _dead_letter(self, stream: str, entries: Sequence[Raw], reason: str) -> None:
        dead = self.dead_stream_of(stream)
        await self.commands.dead_letter(stream, dead, entries, reason)
        logger.warning(
            "Moved %d Redis entries of stream %s to %s: %s (ids %s)",
            len(entries),
            stream,
            dead,
            reason,
            ", ".join(entry_id for entry_id, _ in entries[:5]),
            extra={"action": "redis.dead_lettered", "address": self.address, "stream": stream},
        )

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
            await self.commands.touch(stream, [e.entry_id for e in entries])
        self.in_flight.touched(due, now)

    async def _wait_changed(self, timeout_s: float) -> None:
        self._changed = anyio.Event()
        with anyio.move_on_after(timeout_s):
            await self._changed.wait()

    def __repr__(self) -> str:
        return (
            f"<RedisStreamProducer {self.address} group={self.group!r} "
            f"consumer={self.consumer!r} streams={list(self.streams)} "
            f"in_flight={len(self.in_flight)} connected={self.commands.connected}>"
        )


def _by_stream(entries: Sequence[InFlight]) -> dict[str, list[InFlight]]:
    grouped: dict[str, list[InFlight]] = defaultdict(list)
    for entry in entries:
        grouped[entry.stream].append(entry)
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
