"""One shared-stream group: its subscribers, the fan-out, and (ack mode) its ledger.

The group fans each raw event its task polls (``group_task.GroupTask``, which ``run()``
runs) out to every subscriber's bounded queue. It owns its subscribers' streams, its
counters and, in ack mode, its ``AckLedger``: it alone feeds the ledger (the manager's
calls, what its streams report through ``subscriber.GroupPort`` and what its task reports
through ``group_task.TaskPort``) and carries out the effects the ledger returns, never
awaiting between the two. All bookkeeping is the ledger's; nothing here awaits but ``run``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

import anyio

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
    SharedStreamFenced,
    SharedStreamTerminated,
    SubscriberOverflow,
)
from shared_stream.group_task import GroupTask
from shared_stream.keys import UnstableKeyError, broker_kind, stream_key_digest
from shared_stream.stats import GroupCounters
from shared_stream.subscriber import SubscriberStream
from triggers.exceptions import is_reported_by_the_trigger

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Sequence

    from shared_stream.effects import Effect
    from shared_stream.producer import SharedStreamProducer
    from shared_stream.routes import BindingRoutes
    from shared_stream.settings import GroupSettings
    from shared_stream.stats import GroupStats
    from triggers.base import BaseEventTrigger

logger = logging.getLogger(__name__)


class SharedStreamGroup:
    """Subscribers of one key, the upstream they share, and (ack mode) its ledger."""

    def __init__(
        self,
        *,
        key: Hashable,
        trigger_cls: type[BaseEventTrigger],
        kwargs: dict[str, Any],
        settings: GroupSettings,
        routes: BindingRoutes[SharedStreamGroup],
    ) -> None:
        self.key = key
        self.label = repr(key)  # the key in reports (stats, logs)
        self.digest = _digest(key)  # the key as trigger rows store it (stats)
        self.broker = broker_kind(key, trigger_cls)  # what it reads (stats)
        self.trigger_cls = trigger_cls
        self.kwargs = kwargs
        self.settings = settings
        self.routes = routes
        self.ledger: AckLedger | None = None
        self.serial = 0  # ack mode: the serial its binding seqs carry (``routes.open``)
        # bind(trigger_id): a binding seq for the trigger event the subscriber just yielded
        # (None: none), carrying this group's serial. The ledger's own method, no wrapper
        # (it runs once per delivery): the ledger knows exactly the subscribers whose streams
        # the group holds (it dropped the failed ones first), so it alone answers.
        self.bind: Callable[[int], int | None] = _no_binding
        # The other per-delivery calls are the ledger's own methods too, called by the
        # manager and the streams; what they return goes to ``carry_out`` (almost always
        # nothing). catch_up(trigger_id): count what the subscriber's stream moved past
        # (``subscriber.GroupPort``). confirm_binding(seq): that binding is persisted; True
        # when ``dispatch()`` must follow (once, after the caller's other seqs).
        self.catch_up: Callable[[int], Sequence[Effect]] = _no_effects
        self.confirm_binding: Callable[[int], bool] = _nothing_bound
        self.dispatch: Callable[[], Sequence[Effect]] = _no_effects
        if trigger_cls.uses_ack_mode():
            self.serial, seqs = routes.open(self)
            ledger = self.ledger = AckLedger(
                ack_timeout_s=settings.ack_timeout_s, binding_seqs=seqs
            )
            self.bind = ledger.bind
            self.catch_up = ledger.catch_up
            self.confirm_binding = ledger.confirm_binding
            self.dispatch = ledger.dispatch
        self.streams: dict[int, SubscriberStream] = {}
        # The subscribers of the key's group that failed before this one: its first poll
        # waits for them to be back (``wait_for_cohort``), so none misses what it fans out.
        self.cohort: frozenset[int] = frozenset()
        # Ack mode: subscribers that left failed, whose triggers restart them (trigger id ->
        # until when, ``anyio.current_time``): the poll fans nothing out until they are back
        # (``wait_for_returns``). The events they failed come back from the broker at once;
        # fanned out while they are away, their siblings alone would resolve (ack) them.
        self.away: dict[int, float] = {}
        self.away_changed = anyio.Event()
        # who was subscribed when the group was terminated (``SharedStreamManager``)
        self.departed: frozenset[int] = frozenset()
        self.stopping = False
        self.terminated = False
        self.error: BaseException | None = None  # what terminated the group
        self.stop_reason: str | None = None  # why ``begin_stop`` stopped it
        self.finished = anyio.Event()
        self.counters = GroupCounters()
        self.task = GroupTask(self)
        # the queue length from which the poll yields to the subscribers (half full)
        self._crowded_at = (settings.max_queue + 1) // 2 - 1

    @property
    def mode(self) -> Literal["fast", "ack"]:
        """``ack`` when the trigger class has a producer to advance, else ``fast``."""
        return "fast" if self.ledger is None else "ack"

    # -- subscribers (called by the manager, synchronously) -------------------------------

    def add_subscriber(self, trigger_id: int) -> SubscriberStream:
        if trigger_id in self.streams:
            raise DuplicateSubscription(
                f"trigger {trigger_id!r} is already subscribed to shared stream key="
                f"{self.key!r}; unsubscribe it before subscribing it again"
            )
        if self.ledger is None:
            stream = SubscriberStream(trigger_id=trigger_id, key=self.key, group=None)
        else:
            cursor = self.ledger.subscribe(trigger_id)
            stream = SubscriberStream(
                trigger_id=trigger_id, key=self.key, group=self, cursor=cursor
            )
        self.streams[trigger_id] = stream
        if self.away.pop(trigger_id, None) is not None or trigger_id in self.cohort:
            self.away_changed.set()
        return stream

    def remove_subscriber(self, trigger_id: int, *, failed: bool = False) -> bool:
        stream = self.streams.pop(trigger_id, None)
        if stream is None:
            return False
        stream.close()
        if failed:
            self._mark_away(trigger_id)
        if self.ledger is not None:
            self.carry_out(self.ledger.unsubscribe(trigger_id, failed=failed))
        return True

    @property
    def pending_confirmations(self) -> int:
        """Binding seqs handed out and neither confirmed nor released."""
        return 0 if self.ledger is None else self.ledger.binding_count

    def refuse(self, seqs: Sequence[int]) -> None:
        if self.ledger is not None:
            rejected, effects = self.ledger.refuse_persisted(seqs)
            self.counters.rejects += rejected
            self.carry_out(effects)

    def check_timeouts(self, now: float) -> None:
        if self.ledger is not None and not self.stopping:
            self.carry_out(self.ledger.check_timeouts(now))

    # -- what its streams report (ack mode only: ``subscriber.GroupPort``) -----------------

    def moved_past(self, trigger_id: int) -> None:
        """The subscriber asked for its next event and waits: it moved past its current
        one; the ledger counts its moves."""
        ledger = self.ledger
        assert ledger is not None
        effects = ledger.pull(trigger_id)
        if effects:
            self.carry_out(effects)

    def reject_current(self, trigger_id: int) -> bool:
        """The subscriber rejected its current raw event (``reject_shared_stream_event``);
        False when it has no event in its binding window."""
        ledger = self.ledger
        if ledger is None or not ledger.is_in_window(trigger_id):
            return False
        effects = ledger.reject(trigger_id)
        self.counters.rejects += 1
        if effects:
            self.carry_out(effects)
        return True

    # -- effects --------------------------------------------------------------------------

    def carry_out(self, effects: Sequence[Effect]) -> None:
        """Do what the ledger returned (the manager and the streams hand back what
        ``dispatch`` and ``catch_up`` returned)."""
        for effect in effects:
            if isinstance(effect, AdvanceBatch):
                self.task.slot.put(effect)
            elif isinstance(effect, FailSubscriber):
                self._fail_subscriber(effect.trigger_id, effect.reason)
            elif isinstance(effect, ReleaseBindings):
                self.routes.void(effect.seqs)
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

    def stats(self) -> GroupStats:
        """A snapshot of this group's counters and gauges (cheap: O(subscribers + lanes))."""
        depth = max((len(stream.queue) for stream in self.streams.values()), default=0)
        ledger = self.ledger
        outstanding: dict[str, int] = {}
        oldest_age: float | None = None
        if ledger is not None:
            outstanding = {repr(lane): n for lane, n in ledger.outstanding_by_lane().items()}
            oldest = ledger.oldest_unresolved_at()
            if oldest is not None:
                oldest_age = max(self.settings.clock() - oldest, 0.0)
        return self.counters.snapshot(
            key=self.label,
            mode=self.mode,
            subscribers=len(self.streams),
            queue_depth=depth,
            outstanding_by_lane=outstanding,
            oldest_unresolved_age_s=oldest_age,
            digest=self.digest,
            broker=self.broker,
        )

    def _fail_subscriber(self, trigger_id: int, reason: FailReason) -> None:
        stream = self.streams.pop(trigger_id, None)
        if stream is None:
            return
        self._mark_away(trigger_id)
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
        counters = self.counters
        limit = self.settings.max_queue
        # A queue shorter than both the high-water mark and half the limit needs no check
        # (the usual case): only a longer one can overflow, crowd the poll or raise the mark.
        watch = counters.queue_high_water
        if watch > self._crowded_at:
            watch = self._crowded_at
        longest = -1  # the longest queue that was checked, before this event
        overflowed: list[int] | None = None
        for stream in self.streams.values():
            queue = stream.queue
            if len(queue) >= watch:
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
        delivered = len(self.streams)
        if overflowed is not None:
            delivered -= len(overflowed)
        if delivered:
            counters.deliveries += delivered
            if longest >= counters.queue_high_water:
                counters.queue_high_water = longest + 1
        if overflowed is not None:
            self._fail_overflowed(overflowed)
        return 2 * (longest + 1) >= limit

    def _fail_overflowed(self, trigger_ids: list[int]) -> None:
        for trigger_id in trigger_ids:
            if self.ledger is None:
                self._fail_subscriber(trigger_id, FailReason.OVERFLOW)
            else:
                self.carry_out(self.ledger.fail_subscriber(trigger_id, FailReason.OVERFLOW))

    def broadcast(self, item: tuple[Any, Any], producer: SharedStreamProducer) -> bool:
        """Ack mode: a raw event and its broker payload, polled from ``producer``: into the
        ledger, then out to the subscribers (see ``fan_out``)."""
        raw, broker_payload = item
        ledger = self.ledger
        assert ledger is not None
        lane = producer.get_advance_lane(broker_payload)
        seq, effects = ledger.broadcast(broker_payload, lane=lane, now=self.settings.clock())
        crowded = self.fan_out(seq, raw)
        if effects:
            self.carry_out(effects)
        self.task.timer.poke()
        return crowded

    def next_deadline(self) -> float | None:
        """Ack mode: when the ledger may next time a subscriber out."""
        assert self.ledger is not None
        return self.ledger.next_deadline()

    def advanced(self, batch: AdvanceBatch, elapsed_s: float) -> None:
        """Ack mode: ``producer.advance`` returned for ``batch``, dispatched ``elapsed_s`` ago;
        its events with a rejected outcome count as dead-lettered (the producer sent them
        its dead-letter way, or stopped the group and never returns here)."""
        assert self.ledger is not None
        rejected = sum(1 for item in batch.items if item.outcome.rejected)
        self.counters.count_advance(len(batch.seqs), elapsed_s, rejected=rejected)
        self.carry_out(self.ledger.advance_done(batch))

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """The group's task: poll until stopped or failed, then close the producer."""
        try:
            await self.task.run()
        finally:
            self.finished.set()

    def begin_stop(self, reason: str) -> None:
        """Stop polling; remaining subscribers' streams end; drain resolved prefixes.

        The drain is bounded by the stop grace period: past it the group is cancelled.
        """
        if self.stopping:
            return
        self.stopping = True
        self.stop_reason = reason
        for stream in self.streams.values():
            stream.fail(
                SharedStreamTerminated(f"shared stream key={self.key!r} {reason}"), drain=False
            )
        self.streams.clear()
        if self.ledger is not None:
            self.carry_out(self.ledger.stop(drain=True))
        self.task.stop()

    async def wait_for_cohort(self, bound_s: float) -> None:
        """Before the first poll: wait, at most ``bound_s``, until every subscriber of the
        key's previous group that failed has subscribed again, when one of them is back
        already (the group is their restart; their restarts come
        a few milliseconds apart, and a broker that reconnects faster would fan its first
        events out to the first ones only: in ack mode, the others would never see them)."""
        if not self.cohort & self.streams.keys():
            return  # not a restart of that cohort (a new subscriber): nobody to wait for
        until = anyio.current_time() + bound_s
        for trigger_id in self.cohort - self.streams.keys():
            self.away.setdefault(trigger_id, until)
        await self.wait_for_returns()

    async def wait_for_returns(self) -> None:
        """Ack mode, before the poll fans an event out: wait until every subscriber that
        left failed is back, each at most ``cohort_return_s`` after it left (then the group
        goes on without it, and says so; it joins at the next event)."""
        away = self.away
        while away and not self.stopping:
            now = anyio.current_time()
            late = sorted(t for t, until in away.items() if until <= now)
            for trigger_id in late:
                del away[trigger_id]
            if late:
                logger.info(
                    "Shared stream group key=%r goes on without trigger(s) %s: they failed and "
                    "were not back within %ss; they join at the next event",
                    self.key,
                    late,
                    self.settings.cohort_return_s,
                    extra={"action": "shared_stream.cohort_incomplete"},
                )
            if not away:
                return
            self.away_changed = anyio.Event()
            with anyio.move_on_after(min(away.values()) - now):
                await self.away_changed.wait()

    @property
    def returning(self) -> frozenset[int]:
        """Who the key's next group waits for: the subscribers this one had when it was
        terminated, and those that left it failed and were not back when it ended."""
        return self.departed | self.away.keys()

    def _mark_away(self, trigger_id: int) -> None:
        if self.ledger is not None and not self.stopping:
            self.away[trigger_id] = anyio.current_time() + self.settings.cohort_return_s

    def fence(self, reason: str) -> None:
        """The owner lost its lease: the producer leaves the broker's consumer membership
        now (``SharedStreamProducer.fence``), and the group ends without advancing more."""
        self.task.fence()
        self.terminate(SharedStreamFenced(f"shared stream key={self.key!r} fenced: {reason}"))

    def terminate(self, error: BaseException) -> None:
        """The group failed: subscribers get ``error``, nothing more is advanced."""
        if self.terminated:
            return
        self.terminated = self.stopping = True
        self.error = error
        # No traceback here: each subscriber fails with ``error``, and its trigger runtime
        # reports it (an unreachable upstream: one warning per subscriber's streak; a refused
        # login: one error per distinct error and streak), so a group that could not even
        # connect says so at DEBUG only.
        level = logging.ERROR
        if is_reported_by_the_trigger(error):
            level = logging.WARNING if self.counters.events_polled else logging.DEBUG
        logger.log(
            level,
            "Shared stream group key=%r terminated: %r; its subscribers fail and the broker "
            "redelivers every event not advanced yet",
            self.key,
            error,
            extra={"action": "shared_stream.group_terminated"},
        )
        drain = self.ledger is None  # fast mode: queued events are still delivered
        self.departed = frozenset(self.streams)
        for stream in self.streams.values():
            stream.fail(error, drain=drain)
        self.streams.clear()
        if self.ledger is not None:
            self.carry_out(self.ledger.stop(drain=False))
        self.task.cancel()

    def __repr__(self) -> str:
        state = "terminated" if self.terminated else "stopping" if self.stopping else "running"
        return (
            f"<SharedStreamGroup key={self.key!r} mode={self.mode} "
            f"subscribers={len(self.streams)} state={state} ledger={self.ledger!r}>"
        )


def _no_binding(trigger_id: int) -> None:
    """Fast mode: nothing is gated on persistence, nothing to bind."""


def _no_effects(*args: object) -> Sequence[Effect]:
    """Fast mode: no ledger, nothing to carry out."""
    return ()


def _nothing_bound(seq: int) -> bool:
    """Fast mode: no binding seq was handed out."""
    return False


def _digest(key: Hashable) -> str | None:
    """The key's fleet-wide digest; None for a key without a stable one (its triggers still
    share this group, and the trigger rows hold no digest either)."""
    try:
        return stream_key_digest(key)
    except UnstableKeyError:
        return None
