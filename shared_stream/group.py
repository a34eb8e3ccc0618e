"""One shared-stream group: the poll, the fan-out, and (ack mode) the advancer and timer.

``SharedStreamGroup.run()`` is the group's task (named ``shared-stream-poll[<key repr>]``).
It polls the upstream and fans each raw event out to every subscriber's bounded queue; in
ack mode it also runs one advancer task (at most one ``advance`` in flight) and one timer
task (ack timeouts by deadline). All bookkeeping is the ``AckLedger``'s; this module only
awaits I/O and carries out the ledger's effects, never awaiting between the two.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.lowlevel

from shared_stream.bookkeeping import AckLedger
from shared_stream.effects import (
    AbandonEvents,
    AdvanceBatch,
    ExpireDeparted,
    FailReason,
    FailSubscriber,
    ReleaseBindings,
)
from shared_stream.exceptions import (
    AckTimeout,
    DuplicateSubscription,
    SharedStreamTerminated,
    SubscriberOverflow,
)
from shared_stream.stats import GroupCounters, GroupStats
from shared_stream.subscriber import SubscriberStream, forget_current_stream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Hashable, Sequence

    from shared_stream.effects import Effect
    from shared_stream.producer import SharedStreamProducer
    from shared_stream.settings import GroupSettings
    from triggers.base import BaseEventTrigger

logger = logging.getLogger(__name__)

MAX_TIMER_SLEEP_S: Final = 3600.0
# The poll yields to the subscribers after this many broadcasts at most (or as soon as a
# queue is half full): bursts are fanned out in batches, each subscriber wakes once per batch.
YIELD_EVERY_EVENTS: Final = 64


class SharedStreamGroup:
    """Subscribers of one key, the upstream they share, and (ack mode) its ledger."""

    def __init__(
        self,
        *,
        key: Hashable,
        trigger_cls: type[BaseEventTrigger],
        kwargs: dict[str, Any],
        settings: GroupSettings,
    ) -> None:
        self.key = key
        self.label = repr(key)  # the key in reports (stats, logs)
        self.trigger_cls = trigger_cls
        self.kwargs = kwargs
        self.settings = settings
        self.ledger: AckLedger | None = None
        if trigger_cls.uses_ack_mode():
            self.ledger = AckLedger(
                ack_timeout_s=settings.ack_timeout_s, binding_seqs=settings.binding_seqs
            )
        self.streams: dict[int, SubscriberStream] = {}
        self.producer: SharedStreamProducer | None = None
        self.stopping = False
        self.terminated = False
        self.finished = anyio.Event()
        self._scope = anyio.CancelScope()  # the whole group (terminate, forced stop)
        self._poll_scope = anyio.CancelScope()
        self._timer_scope = anyio.CancelScope()
        self._pending_batch: AdvanceBatch | None = None
        self._pending_since = 0.0  # settings.clock() when _pending_batch was dispatched
        self.counters = GroupCounters()
        self._advance_wakeup = anyio.Event()
        self._timer_wakeup = anyio.Event()
        self._timer_idle = False
        self._drain_deadline = math.inf

    # -- subscribers (called by the manager, synchronously) -------------------------------

    def add_subscriber(self, trigger_id: int) -> SubscriberStream:
        if trigger_id in self.streams:
            raise DuplicateSubscription(
                f"trigger {trigger_id!r} is already subscribed to shared stream key="
                f"{self.key!r}; unsubscribe it before subscribing it again"
            )
        if self.ledger is not None:
            self.ledger.subscribe(trigger_id)
        stream = SubscriberStream(
            trigger_id=trigger_id, key=self.key, ledger=self.ledger, sink=self
        )
        self.streams[trigger_id] = stream
        return stream

    def remove_subscriber(self, trigger_id: int, *, failed: bool = False) -> bool:
        stream = self.streams.pop(trigger_id, None)
        if stream is None:
            return False
        stream.close()
        if self.ledger is not None:
            self.carry_out(self.ledger.unsubscribe(trigger_id, failed=failed))
        return True

    def bind(self, trigger_id: int) -> int | None:
        if self.ledger is None or trigger_id not in self.streams:
            return None
        seq = self.ledger.bind(trigger_id)
        if seq is not None:
            self.settings.binding_owner[seq] = self
        return seq

    def confirm(self, seqs: Sequence[int]) -> None:
        if self.ledger is not None:
            self.carry_out(self.ledger.confirm_persisted(seqs))

    def refuse(self, seqs: Sequence[int]) -> None:
        if self.ledger is not None:
            rejected, effects = self.ledger.refuse_persisted(seqs)
            self.counters.rejects += rejected
            self.carry_out(effects)

    def check_timeouts(self, now: float) -> None:
        if self.ledger is not None and not self.stopping:
            self.carry_out(self.ledger.check_timeouts(now))

    # -- effects --------------------------------------------------------------------------

    def carry_out(self, effects: Sequence[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, AdvanceBatch):
                self._pending_batch = effect
                self._pending_since = self.settings.clock()
                self._advance_wakeup.set()
            elif isinstance(effect, FailSubscriber):
                self._fail_subscriber(effect.trigger_id, effect.reason)
            elif isinstance(effect, ReleaseBindings):
                owner = self.settings.binding_owner
                for seq in effect.seqs:
                    owner.pop(seq, None)
            elif isinstance(effect, ExpireDeparted):
                self._count_departed_timeout(effect)
            elif isinstance(effect, AbandonEvents):
                logger.info(
                    "Shared stream group key=%r abandoned %d unresolved event(s); "
                    "the broker redelivers them",
                    self.key,
                    len(effect.seqs),
                    extra={"action": "shared_stream.abandon", "count": len(effect.seqs)},
                )

    def _count_departed_timeout(self, effect: ExpireDeparted) -> None:
        self.counters.ack_timeouts += 1
        logger.warning(
            "Trigger %r left shared stream key=%s with %d event(s) whose trigger events were "
            "not confirmed persisted within %ss; they fail and the broker redelivers them",
            effect.trigger_id,
            self.label,
            effect.events,
            self.settings.ack_timeout_s,
            extra={"action": "shared_stream.ack_timeout", "trigger_id": effect.trigger_id},
        )

    def record_reject(self) -> None:
        """A subscriber rejected its current raw event (``reject_shared_stream_event``)."""
        self.counters.rejects += 1

    def stats(self) -> GroupStats:
        """A snapshot of this group's counters and gauges (cheap: O(subscribers + lanes))."""
        c = self.counters
        depth = max((len(stream.queue) for stream in self.streams.values()), default=0)
        ledger = self.ledger
        outstanding: dict[str, int] = {}
        oldest_age: float | None = None
        if ledger is not None:
            outstanding = {repr(lane): n for lane, n in ledger.outstanding_by_lane().items()}
            oldest = ledger.oldest_unresolved_at()
            if oldest is not None:
                oldest_age = max(self.settings.clock() - oldest, 0.0)
        return GroupStats(
            key=self.label,
            mode="fast" if ledger is None else "ack",
            subscribers=len(self.streams),
            queue_high_water=c.queue_high_water,
            queue_depth=depth,
            outstanding_by_lane=outstanding,
            oldest_unresolved_age_s=oldest_age,
            events_polled=c.events_polled,
            deliveries=c.deliveries,
            advances=c.advances,
            advanced_events=c.advanced_events,
            last_advance_batch=c.last_advance_batch,
            advance_latency_sum_s=c.advance_latency_sum_s,
            overflows=c.overflows,
            ack_timeouts=c.ack_timeouts,
            rejects=c.rejects,
        )

    def _fail_subscriber(self, trigger_id: int, reason: FailReason) -> None:
        stream = self.streams.pop(trigger_id, None)
        if stream is None:
            return
        error: Exception
        if reason is FailReason.ACK_TIMEOUT:
            self.counters.ack_timeouts += 1
            error = AckTimeout(
                f"trigger {trigger_id!r} did not resolve a raw event of shared stream "
                f"key={self.key!r} within {self.settings.ack_timeout_s}s (still processing "
                "it, or its trigger events were never confirmed persisted); the broker "
                "redelivers it. Raise [triggerer] shared_stream_ack_timeout if that is normal."
            )
        else:
            self.counters.overflows += 1
            error = SubscriberOverflow(
                f"trigger {trigger_id!r} fell behind shared stream key={self.key!r}: its "
                f"queue of {self.settings.max_queue} raw events was full. Raise [triggerer] "
                "shared_stream_subscriber_queue_size or narrow shared_stream_key()."
            )
        logger.warning(
            "%s", error, extra={"action": f"shared_stream.{reason.value}", "trigger_id": trigger_id}
        )
        stream.fail(error, drain=False)

    # -- fan-out --------------------------------------------------------------------------

    def fan_out(self, seq: int, raw: Any) -> bool:
        """Append the event to every subscriber's queue; a full queue fails that subscriber.

        Returns True when some queue is at least half full (the poll should yield now).
        """
        item = (seq, raw)
        limit = self.settings.max_queue
        longest = 0
        overflowed: list[int] | None = None
        for stream in self.streams.values():
            queue = stream.queue
            length = len(queue)
            if length >= limit:
                if overflowed is None:
                    overflowed = []
                overflowed.append(stream.trigger_id)
                continue
            if length > longest:
                longest = length
            queue.append(item)
            if stream.waiter is not None:
                stream.wake()
        counters = self.counters
        delivered = len(self.streams)
        if overflowed is not None:
            delivered -= len(overflowed)
        if delivered:
            counters.deliveries += delivered
            if longest >= counters.queue_high_water:
                counters.queue_high_water = longest + 1
        if overflowed is not None:
            for trigger_id in overflowed:
                if self.ledger is None:
                    self._fail_subscriber(trigger_id, FailReason.OVERFLOW)
                else:
                    self.carry_out(self.ledger.fail_subscriber(trigger_id, FailReason.OVERFLOW))
        return 2 * (longest + 1) >= limit

    def _broadcast(self, raw: Any, broker_payload: Any, producer: SharedStreamProducer) -> bool:
        ledger = self.ledger
        assert ledger is not None
        lane = producer.get_advance_lane(broker_payload)
        seq, effects = ledger.broadcast(broker_payload, lane=lane, now=self.settings.clock())
        crowded = self.fan_out(seq, raw)
        if effects:
            self.carry_out(effects)
        if self._timer_idle:
            self._timer_idle = False
            self._timer_wakeup.set()
        return crowded

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """The group's task: poll until stopped or failed, then close the producer."""
        forget_current_stream()  # inherited from the subscribing task; not ours
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    if self.ledger is not None:
                        tg.start_soon(
                            self._advance_loop, name=f"shared-stream-advance[{self.key!r}]"
                        )
                        tg.start_soon(self._timer_loop, name=f"shared-stream-timer[{self.key!r}]")
                    with self._poll_scope:
                        await self._poll()
            if self._scope.cancelled_caught and not self.terminated:
                logger.warning(
                    "Shared stream group key=%r did not drain within the stop grace period of "
                    "%ss; cancelled it (events not advanced yet are redelivered)",
                    self.key,
                    self.settings.stop_grace_s,
                    extra={"action": "shared_stream.drain_timeout"},
                )
        finally:
            with anyio.CancelScope(shield=True):
                await self._close_producer()
            self.finished.set()

    def begin_stop(self, reason: str) -> None:
        """Stop polling; remaining subscribers' streams end; drain resolved prefixes.

        The drain is bounded by the stop grace period: past it the group is cancelled.
        """
        if self.stopping:
            return
        self.stopping = True
        self._drain_deadline = anyio.current_time() + self.settings.stop_grace_s
        self._scope.deadline = self._drain_deadline
        self.settings.on_gone(self)
        for stream in self.streams.values():
            stream.fail(
                SharedStreamTerminated(f"shared stream key={self.key!r} {reason}"), drain=False
            )
        self.streams.clear()
        if self.ledger is not None:
            self.carry_out(self.ledger.stop(drain=True))
        self._poll_scope.cancel()
        self._timer_scope.cancel()
        self._advance_wakeup.set()

    def terminate(self, error: BaseException) -> None:
        """The group failed: subscribers get ``error``, nothing more is advanced."""
        if self.terminated:
            return
        self.terminated = self.stopping = True
        self.settings.on_gone(self)
        # No traceback here: each subscriber fails with ``error``, and its trigger runtime
        # reports it with the traceback.
        logger.error(
            "Shared stream group key=%r terminated: %r; its subscribers fail and the broker "
            "redelivers every event not advanced yet",
            self.key,
            error,
            extra={"action": "shared_stream.group_terminated"},
        )
        drain = self.ledger is None  # fast mode: queued events are still delivered
        for stream in self.streams.values():
            stream.fail(error, drain=drain)
        self.streams.clear()
        if self.ledger is not None:
            self.carry_out(self.ledger.stop(drain=False))
        self._pending_batch = None
        self._scope.cancel()

    async def _poll(self) -> None:
        try:
            if self.settings.cohort_grace_s > 0:
                await anyio.sleep(self.settings.cohort_grace_s)
            if self.ledger is None:
                await self._poll_source()
            else:
                await self._poll_producer()
        except Exception as exc:  # noqa: BLE001 - user-code boundary: any error ends the group
            if not self.stopping:
                self.terminate(exc)
            else:
                logger.warning(
                    "Shared stream poll key=%r raised while stopping: %r",
                    self.key,
                    exc,
                    extra={"action": "shared_stream.poll_error_on_stop"},
                )
            return
        if self.stopping:
            return
        self.terminate(
            SharedStreamTerminated(
                f"the shared stream poll of key={self.key!r} ended; open_shared_stream() / "
                "open_stream() must yield for the group's whole lifetime (loop forever)"
            )
        )

    async def _poll_source(self) -> None:
        stream = self.trigger_cls.open_shared_stream(self.kwargs)
        unyielded = 0
        try:
            async for raw in stream:
                self.counters.events_polled += 1
                unyielded += 1
                if self.fan_out(0, raw) or unyielded >= YIELD_EVERY_EVENTS:
                    unyielded = 0
                    await anyio.lowlevel.checkpoint()
        finally:
            await _aclose(stream)

    async def _poll_producer(self) -> None:
        producer = self.producer = self.trigger_cls.create_shared_stream_producer(self.kwargs)
        stream = producer.open_stream()
        unyielded = 0
        try:
            async for raw, broker_payload in stream:
                self.counters.events_polled += 1
                unyielded += 1
                if (
                    self._broadcast(raw, broker_payload, producer)
                    or unyielded >= YIELD_EVERY_EVENTS
                ):
                    unyielded = 0
                    await anyio.lowlevel.checkpoint()
        finally:
            await _aclose(stream)

    async def _advance_loop(self) -> None:
        ledger = self.ledger
        assert ledger is not None
        while True:
            batch = self._pending_batch
            if batch is None:
                if self.stopping:
                    return
                self._advance_wakeup = anyio.Event()
                await self._advance_wakeup.wait()
                continue
            self._pending_batch = None
            dispatched_at = self._pending_since
            producer = self.producer
            assert producer is not None
            try:
                completed = await self._advance(producer, batch)
            except Exception as exc:  # noqa: BLE001 - user-code boundary: any error ends the group
                self.terminate(exc)
                return
            if not completed or self.terminated:
                return
            self._count_advance(len(batch.seqs), self.settings.clock() - dispatched_at)
            self.carry_out(ledger.advance_done(batch))

    def _count_advance(self, size: int, latency_s: float) -> None:
        counters = self.counters
        counters.advances += 1
        counters.advanced_events += size
        counters.last_advance_batch = size
        counters.advance_latency_sum_s += max(latency_s, 0.0)

    async def _advance(self, producer: SharedStreamProducer, batch: AdvanceBatch) -> bool:
        """Await one advance; while draining, shielded and bounded by the drain deadline."""
        if not self.stopping:
            await producer.advance(batch.items)
            return True
        with anyio.CancelScope(deadline=self._drain_deadline, shield=True) as scope:
            await producer.advance(batch.items)
        return not scope.cancelled_caught

    async def _timer_loop(self) -> None:
        ledger = self.ledger
        assert ledger is not None
        with self._timer_scope:
            while True:
                deadline = ledger.next_deadline()
                if deadline is None:
                    self._timer_wakeup = anyio.Event()
                    self._timer_idle = True
                    await self._timer_wakeup.wait()
                    continue
                delay = min(deadline - self.settings.clock(), MAX_TIMER_SLEEP_S)
                await anyio.sleep(max(delay, 0.0))
                self.check_timeouts(self.settings.clock())

    async def _close_producer(self) -> None:
        producer = self.producer
        if producer is None:
            return
        with anyio.move_on_after(self.settings.stop_grace_s):
            try:
                await producer.aclose()
            except Exception:
                logger.exception(
                    "Closing the producer of shared stream key=%r failed",
                    self.key,
                    extra={"action": "shared_stream.aclose_failed"},
                )

    def __repr__(self) -> str:
        state = "terminated" if self.terminated else "stopping" if self.stopping else "running"
        return (
            f"<SharedStreamGroup key={self.key!r} mode={'fast' if self.ledger is None else 'ack'} "
            f"subscribers={len(self.streams)} state={state} ledger={self.ledger!r}>"
        )


async def _aclose(stream: AsyncIterator[Any]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
