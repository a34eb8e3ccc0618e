"""Ack-mode bookkeeping of one shared-stream group: a pure, synchronous state machine.

Theory of operation
-------------------
Every raw event the producer yields is *broadcast*: it gets an event seq (1, 2, 3, ...) and
a fan-out snapshot, the subscribers online at that moment. A subscriber receives every event
broadcast after it subscribed, in order, so its progress is one number, ``position`` (the
seq of the last event delivered to it); events after ``position`` are still in its queue.

While a subscriber processes the event at ``position`` its *binding window* is open: each
trigger event its filter yields is *bound* to that event and gets a binding seq, which the
runtime confirms once the trigger event is persisted. The subscriber *resolves* an event:

- acked: it moved past the event (pulled again, or unsubscribed) and every binding of it
  was confirmed persisted;
- rejected: it called ``reject_shared_stream_event()`` inside the window (at once);
- failed: ack timeout, queue overflow, it unsubscribed before the event was delivered, or
  its filter failed (raised) before it moved past the event.

Where a subscriber is (``position``, and whether its window is open) is kept in its
*cursor*, the record ``subscribe`` returns. A driver moves it with ``deliver``, ``pull``
and ``step``; the subscriber's stream, on the fan-out hot path, moves it itself (one
attribute write per delivery, no call) and reports with ``catch_up`` now and then and
``pull`` before it waits. The ledger *counts* a subscriber's moves lazily: ``counted`` is
the last event whose resolution by that subscriber is counted (or which is pending on its
bindings); events it moved past after that are acked when counted, at ``catch_up``,
``pull`` and ``step``, and before anything that needs that subscriber's exact state
(reject, refuse, unsubscribe, failure, stop). A confirmation of an event not counted yet
leaves it to that count. Questions (``oldest_unresolved_at``, timeouts) read the cursor,
so they are exact whether or not the moves were counted.

An event is resolved when every subscriber of its snapshot resolved it (at once when the
snapshot is empty). Each event belongs to a lane; the resolved prefix of a lane (its oldest
events, up to the first unresolved one) is dispatched as one ``AdvanceBatch``, and at most
one batch is in flight per group: the next is dispatched by ``advance_done``. The events,
their counts and lanes are kept by ``lanes.EventLanes``; this module keeps the subscribers,
their cursors and bindings, and decides who resolved what.

Timeouts are deadlines, not timers: ``check_timeouts(now)`` fails every subscriber whose
oldest unresolved event was broadcast ``ack_timeout_s`` or more before ``now`` (one that
already left, its bindings still unconfirmed, is reported by ``ExpireDeparted``).

``stop()`` freezes the group: subscribers and bindings are dropped, events not yet resolved
are abandoned (the broker redelivers them); resolved prefixes are still dispatched one
batch at a time (drain), unless ``stop(drain=False)`` (the group failed: advance nothing).

Every method is a verb that returns the effects for the driver to carry out; nothing here
awaits, reads a clock or does I/O.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from shared_stream.effects import (
    AbandonEvents,
    AdvanceBatch,
    Effect,
    ExpireDeparted,
    FailReason,
    FailSubscriber,
    ReleaseBindings,
)
from shared_stream.lanes import ACKED, FAILED, NO_EFFECTS, REJECTED, EventLanes

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterable, Iterator, Sequence

__all__ = (
    "AbandonEvents",
    "AckLedger",
    "AdvanceBatch",
    "Effect",
    "ExpireDeparted",
    "FailReason",
    "FailSubscriber",
    "ReleaseBindings",
)


class _Subscriber:
    """One subscriber's cursor and bookkeeping. ``position`` and ``in_window`` are the
    cursor: the subscriber's stream writes them as it yields events (``subscriber.Cursor``),
    or ``deliver`` / ``pull`` / ``step`` do; everything else is the ledger's."""

    __slots__ = ("bound", "counted", "in_window", "position", "trigger_id")

    def __init__(self, trigger_id: int, position: int) -> None:
        self.trigger_id = trigger_id
        self.position = position  # seq of the last event delivered (or broadcast before joining)
        self.in_window = False  # the event at ``position`` is being processed
        # the last event whose resolution by this subscriber is counted (or pending on its
        # bindings); ``counted == position`` while the window is open: it was rejected
        self.counted = position
        # event seq -> its unconfirmed binding seq, or a list of them when there are several
        # (one trigger event per raw event is the usual case: no list per binding)
        self.bound: dict[int, int | list[int]] = {}


class AckLedger:
    """The ack-mode state of one group. See the module docstring for the model."""

    def __init__(self, *, ack_timeout_s: float, binding_seqs: Iterator[int] | None = None) -> None:
        if ack_timeout_s <= 0:
            raise ValueError(f"ack_timeout_s must be positive, got {ack_timeout_s!r}")
        self.ack_timeout_s = ack_timeout_s
        self._binding_seqs = binding_seqs if binding_seqs is not None else itertools.count(1)
        self._lanes = EventLanes()
        self._events = self._lanes.events  # read on the hot path (``_catch_up``)
        self._subs: dict[int, _Subscriber] = {}
        self._departed: dict[_Subscriber, None] = {}  # unsubscribed, bindings unconfirmed
        self._bindings: dict[int, tuple[_Subscriber, int]] = {}
        self._stopped = False

    # -- inputs ---------------------------------------------------------------------------

    def subscribe(self, trigger_id: int) -> _Subscriber:
        """A subscriber joined; it is in the snapshot of every later broadcast.

        Returns its cursor, for a stream that moves it itself (see the module docstring).
        """
        if self._stopped:
            raise RuntimeError("cannot subscribe to a stopped AckLedger")
        if trigger_id in self._subs:
            raise ValueError(f"trigger {trigger_id!r} is already subscribed")
        sub = self._subs[trigger_id] = _Subscriber(trigger_id, self._lanes.last_seq)
        return sub

    def broadcast(
        self, broker_payload: Any, *, lane: Hashable, now: float
    ) -> tuple[int, Sequence[Effect]]:
        """A raw event is fanned out to the current subscribers; returns its event seq."""
        if self._stopped:
            raise RuntimeError("cannot broadcast on a stopped AckLedger")
        seq, resolved = self._lanes.add(broker_payload, lane=lane, at=now, snapshot=len(self._subs))
        return seq, self._lanes.dispatch() if resolved else NO_EFFECTS

    def deliver(self, trigger_id: int, seq: int) -> None:
        """The subscriber's stream yielded event ``seq``: its binding window opens."""
        sub = self._subs.get(trigger_id)
        if sub is None:
            return
        if sub.in_window or seq != sub.position + 1:
            raise ValueError(
                f"trigger {trigger_id!r} got event {seq} out of order "
                f"(position {sub.position}, window open: {sub.in_window})"
            )
        sub.position = seq
        sub.in_window = True

    def pull(self, trigger_id: int) -> Sequence[Effect]:
        """The subscriber asked for its next raw event: it moved past its current one.

        Everything it moved past is counted now (a stream calls this before it waits)."""
        sub = self._subs.get(trigger_id)
        if sub is None:
            return NO_EFFECTS
        sub.in_window = False
        return self._lanes.dispatch() if self._catch_up(sub) else NO_EFFECTS

    def step(self, trigger_id: int, seq: int) -> Sequence[Effect]:
        """``pull`` then ``deliver(seq)`` in one call: the subscriber moved past its current
        event (if any) and took the next one, ``seq``, already queued."""
        sub = self._subs.get(trigger_id)
        if sub is None:
            return NO_EFFECTS
        if seq != sub.position + 1:
            raise ValueError(
                f"trigger {trigger_id!r} got event {seq} out of order (position {sub.position})"
            )
        sub.position = seq
        sub.in_window = True
        return self._lanes.dispatch() if self._catch_up(sub) else NO_EFFECTS

    def catch_up(self, trigger_id: int) -> Sequence[Effect]:
        """Count what the subscriber's stream moved past since its last report (its cursor
        moved without a call): each such event without a binding is acked."""
        sub = self._subs.get(trigger_id)
        if sub is None:
            return NO_EFFECTS
        return self._lanes.dispatch() if self._catch_up(sub) else NO_EFFECTS

    def bind(self, trigger_id: int) -> int | None:
        """The subscriber's filter yielded a trigger event; returns the binding seq to confirm.

        None when no window is open (nothing to gate): before the first event, after a
        reject, or for an unknown subscriber.
        """
        sub = self._subs.get(trigger_id)
        if sub is None or not sub.in_window or sub.counted >= sub.position:
            return None
        seq = next(self._binding_seqs)
        position = sub.position
        bound = sub.bound
        pending = bound.setdefault(position, seq)
        if pending is not seq:  # its second binding, or later
            if isinstance(pending, list):
                pending.append(seq)
            else:
                bound[position] = [pending, seq]
        self._bindings[seq] = (sub, position)
        return seq

    def confirm_persisted(self, seqs: Iterable[int]) -> Sequence[Effect]:
        """These binding seqs' trigger events are committed; unknown seqs are ignored."""
        confirm = self.confirm_binding
        ready = False
        for seq in seqs:
            if confirm(seq):
                ready = True
        return self._lanes.dispatch() if ready else NO_EFFECTS

    def confirm_binding(self, seq: int) -> bool:
        """``confirm_persisted((seq,))`` without the dispatch: True when this made a lane's
        head ready, and ``dispatch()`` must then be called (once for several confirmations,
        so that one batch takes everything they made ready). An unknown seq is ignored."""
        entry = self._bindings.pop(seq, None)
        if entry is None:
            return False
        sub, event_seq = entry
        bound = sub.bound
        pending = bound[event_seq]
        if type(pending) is list:
            pending.remove(seq)
            if pending:
                return False
        del bound[event_seq]  # its last binding: the one confirmed
        departed = self._departed
        if departed and not bound and sub in departed:
            del departed[sub]
        if event_seq > sub.counted:
            return False  # not counted yet (maybe still processed): acked when it is
        return self._lanes.resolve(event_seq, ACKED)

    def dispatch(self) -> Sequence[Effect]:
        """The next ready batch, unless one is in flight (after ``confirm_binding``)."""
        return self._lanes.dispatch()

    def refuse_persisted(self, seqs: Iterable[int]) -> tuple[int, Sequence[Effect]]:
        """The store refused the trigger events bound under these seqs (e.g. a payload over
        the size limit): each one's raw event resolves as rejected for its subscriber (the
        producer dead-letters it, it is never advanced as clean, nor redelivered forever);
        the subscriber's other bindings to that raw event are moot. Unknown seqs are ignored.

        Returns how many (subscriber, raw event) pairs this rejected, and the effects.
        """
        released: list[Effect] = []
        rejected = 0
        for seq in seqs:
            entry = self._bindings.get(seq)
            if entry is None:
                continue
            sub, event_seq = entry
            self._catch_up(sub)  # then the event is counted, or open in its window
            released.extend(self._release(_seqs_of(sub.bound.pop(event_seq))))
            if sub in self._departed and not sub.bound:
                del self._departed[sub]
            if event_seq > sub.counted:  # open in its window: moving past it counts nothing
                sub.counted = event_seq
            self._lanes.resolve(event_seq, REJECTED)
            rejected += 1
        return rejected, self._with(released, self._lanes.dispatch()) if rejected else NO_EFFECTS

    def reject(self, trigger_id: int) -> Sequence[Effect]:
        """The subscriber refused its current event: resolved as rejected, at once."""
        sub = self._subs.get(trigger_id)
        if sub is None or not sub.in_window or sub.counted >= sub.position:
            return NO_EFFECTS
        self._catch_up(sub)
        sub.counted = sub.position  # moving past it later counts nothing more
        pending = sub.bound.pop(sub.position, None)
        released = () if pending is None else self._release(_seqs_of(pending))
        self._lanes.resolve(sub.position, REJECTED)
        return self._with(released, self._lanes.dispatch())

    def unsubscribe(self, trigger_id: int, *, failed: bool = False) -> Sequence[Effect]:
        """The subscriber left: it moved past its current event, undelivered ones fail.

        ``failed``: it left because its filter raised (or ended) while processing: it did not
        finish its current event, so that event fails too (redelivered or dead-lettered by
        the producer, never advanced as clean), and so do events awaiting confirmation.
        """
        sub = self._subs.pop(trigger_id, None)
        if sub is None:
            return NO_EFFECTS
        if failed:
            return self._with(self._fail_all(sub, undelivered=True), self._lanes.dispatch())
        self._catch_up(sub, through=sub.position)  # it moved past its current event
        sub.in_window = False
        self._lanes.fail_after(sub.position)
        if sub.bound:
            self._departed[sub] = None  # its bindings may still be confirmed (or time out)
        return self._lanes.dispatch()

    def fail_subscriber(self, trigger_id: int, reason: FailReason) -> Sequence[Effect]:
        """Force-fail a subscriber (overflow, timeout): every event it has not resolved fails."""
        sub = self._subs.pop(trigger_id, None)
        if sub is None:
            return NO_EFFECTS
        released = self._fail_all(sub, undelivered=True)
        return self._with((FailSubscriber(trigger_id, reason), *released), self._lanes.dispatch())

    def check_timeouts(self, now: float) -> Sequence[Effect]:
        """Fail every subscriber whose oldest unresolved event is ``ack_timeout_s`` old or more.

        O(subscribers): the driver calls it when ``next_deadline()`` has passed.
        """
        expired = [s for s in self._subs.values() if self._has_expired(s, now)]
        gone = [s for s in self._departed if self._has_expired(s, now)]
        if not expired and not gone:
            return NO_EFFECTS
        effects: list[Effect] = []
        for sub in expired:
            del self._subs[sub.trigger_id]
            effects.append(FailSubscriber(sub.trigger_id, FailReason.ACK_TIMEOUT))
            effects.extend(self._fail_all(sub, undelivered=True))
        for sub in gone:
            del self._departed[sub]
            effects.append(ExpireDeparted(sub.trigger_id, len(sub.bound)))
            effects.extend(self._fail_all(sub, undelivered=False))
        return self._with(tuple(effects), self._lanes.dispatch())

    def advance_done(self, batch: AdvanceBatch) -> Sequence[Effect]:
        """``producer.advance(batch.items)`` returned: dispatch the next ready batch, if any."""
        return self._lanes.advance_done(batch)

    def stop(self, *, drain: bool = True) -> Sequence[Effect]:
        """Freeze the group: abandon unresolved events; ``drain`` keeps resolved prefixes."""
        if self._stopped:
            return NO_EFFECTS
        for sub in self._subs.values():  # what they moved past is resolved: it drains
            self._catch_up(sub)
        self._stopped = True
        released = tuple(self._bindings)
        self._bindings.clear()
        self._subs.clear()
        self._departed.clear()
        abandoned = self._lanes.abandon(drain=drain)
        effects: list[Effect] = []
        if released:
            effects.append(ReleaseBindings(released))
        if abandoned:
            effects.append(AbandonEvents(abandoned))
        return self._with(tuple(effects), self._lanes.dispatch())

    # -- questions ------------------------------------------------------------------------

    def is_drained(self) -> bool:
        """True when stopped and nothing is in flight or left to advance."""
        return self._stopped and self._lanes.is_empty()

    def is_in_window(self, trigger_id: int) -> bool:
        """True while the subscriber processes an event it has not resolved yet."""
        sub = self._subs.get(trigger_id)
        return sub is not None and sub.in_window and sub.counted < sub.position

    def has_advance_in_flight(self) -> bool:
        """True between a dispatched ``AdvanceBatch`` and its ``advance_done``."""
        return self._lanes.in_flight is not None

    def next_deadline(self) -> float | None:
        """When ``check_timeouts`` may next fail someone (None: nothing is unresolved).

        O(subscribers): see ``oldest_unresolved_at``.
        """
        oldest = self.oldest_unresolved_at()
        return None if oldest is None else oldest + self.ack_timeout_s

    @property
    def subscriber_ids(self) -> tuple[int, ...]:
        """Subscribers in the snapshot of new broadcasts."""
        return tuple(self._subs)

    @property
    def outstanding_event_seqs(self) -> tuple[int, ...]:
        """Events broadcast and neither dispatched nor abandoned, in seq order."""
        return tuple(sorted(self._events))

    @property
    def binding_count(self) -> int:
        """How many binding seqs are neither confirmed nor released."""
        return len(self._bindings)

    @property
    def outstanding_binding_seqs(self) -> tuple[int, ...]:
        """Binding seqs not yet confirmed nor released."""
        return tuple(self._bindings)

    def outstanding_by_lane(self) -> dict[Hashable, int]:
        """Events not advanced yet (waiting, or in the advance in flight), per lane.

        O(lanes): what ``sluice streams list`` and the metrics show as backlog per lane.
        """
        return self._lanes.outstanding_by_lane()

    def oldest_unresolved_at(self) -> float | None:
        """When the oldest event some subscriber of its snapshot has not resolved was broadcast.

        None when every outstanding event is resolved. O(subscribers): an unresolved event
        is unresolved for some subscriber (still subscribed, or departed with bindings to
        it), and each subscriber's oldest unresolved event is found in O(1).
        """
        oldest: float | None = None
        for sub in itertools.chain(self._subs.values(), self._departed):
            at = self._oldest_unresolved_at(sub)
            if at is not None and (oldest is None or at < oldest):
                oldest = at
        return oldest

    def __repr__(self) -> str:
        return (
            f"<AckLedger subscribers={len(self._subs)} departed={len(self._departed)} "
            f"bindings={len(self._bindings)} stopped={self._stopped} {self._lanes!r}>"
        )

    # -- internals ------------------------------------------------------------------------

    def _catch_up(self, sub: _Subscriber, through: int | None = None) -> bool:
        """Count the events ``sub`` moved past (up to ``through``, by default all of them):
        each one without a binding is acked, a bound one waits for its confirmations.
        True when this made a lane's head ready (a dispatch must follow)."""
        if through is None:
            through = sub.position - 1 if sub.in_window else sub.position
        seq = sub.counted
        if seq >= through:
            return False
        sub.counted = through
        bound = sub.bound
        events = self._events
        ready = False
        while seq < through:  # each event moved past without a binding is acked
            seq += 1
            if seq in bound:
                continue  # resolves when its last binding is confirmed
            event = events[seq]
            event.unresolved -= 1  # ``EventLanes.resolve(seq, ACKED)``, without a call each
            if not event.unresolved and self._lanes.resolved(event):
                ready = True
        return ready

    def _fail_all(self, sub: _Subscriber, *, undelivered: bool) -> tuple[Effect, ...]:
        """Resolve as failed every event ``sub`` has not resolved; release its bindings.

        What it moved past without a binding is acked first: it did finish those."""
        self._catch_up(sub)
        released: list[int] = []
        lanes = self._lanes
        for event_seq, pending in sub.bound.items():
            lanes.resolve(event_seq, FAILED)
            released.extend(_seqs_of(pending))
        if sub.in_window and sub.counted < sub.position and sub.position not in sub.bound:
            lanes.resolve(sub.position, FAILED)
        if undelivered:
            lanes.fail_after(sub.position)
        sub.bound = {}
        sub.in_window = False
        sub.counted = sub.position
        return self._release(released)

    def _release(self, seqs: Iterable[int]) -> tuple[Effect, ...]:
        released = tuple(seqs)
        for seq in released:
            del self._bindings[seq]
        return (ReleaseBindings(released),) if released else ()

    def _oldest_unresolved_at(self, sub: _Subscriber) -> float | None:
        # from the cursor and the bindings: exact whether or not its moves were counted
        events = self._events
        if sub.bound:
            return events[next(iter(sub.bound))].broadcast_at
        if sub.in_window and sub.counted < sub.position:
            return events[sub.position].broadcast_at
        if sub.position < self._lanes.last_seq:
            return events[sub.position + 1].broadcast_at
        return None

    def _has_expired(self, sub: _Subscriber, now: float) -> bool:
        at = self._oldest_unresolved_at(sub)
        return at is not None and now - at >= self.ack_timeout_s

    @staticmethod
    def _with(first: Sequence[Effect], second: Sequence[Effect]) -> Sequence[Effect]:
        if not first:
            return second
        return (*first, *second) if second else first


def _seqs_of(pending: int | list[int]) -> Sequence[int]:
    """The binding seqs of one ``_Subscriber.bound`` value."""
    return (pending,) if isinstance(pending, int) else pending
