"""The events of one ack-mode group not advanced yet, by lane: the ledger's event side.

Pure and synchronous, as ``bookkeeping`` (whose ``AckLedger`` drives it): no ``await``, no
clock, no I/O. Each broadcast event gets a seq and the size of its fan-out snapshot; each
subscriber of that snapshot resolves it once (acked, failed or rejected: ``resolve``), and
it is resolved when they all have. Events queue per lane in broadcast order; a lane whose
oldest event is resolved is *ready*, and ``dispatch`` hands its resolved prefix out as one
``AdvanceBatch``, at most one batch in flight (``advance_done`` releases the next).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from shared_stream.effects import AdvanceBatch
from shared_stream.producer import AdvanceItem, AdvanceOutcome

if TYPE_CHECKING:
    from collections.abc import Hashable, Sequence

    from shared_stream.effects import Effect

__all__ = ("ACKED", "FAILED", "NO_EFFECTS", "REJECTED", "Event", "EventLanes")

NO_EFFECTS: Final[tuple[Effect, ...]] = ()
#: How one subscriber resolved an event (``EventLanes.resolve``).
ACKED: Final = 0
FAILED: Final = 1
REJECTED: Final = 2
# Outcomes are immutable: one object per (acked, failed, rejected) is shared by every
# event advanced with those counts (a frozen dataclass costs ~1 us to build, per event).
_OUTCOMES: Final[dict[tuple[int, int, int], AdvanceOutcome]] = {}
_OUTCOMES_MAX: Final = 4096


def _outcome(counts: tuple[int, int, int]) -> AdvanceOutcome:
    if len(_OUTCOMES) >= _OUTCOMES_MAX:
        _OUTCOMES.clear()
    outcome = _OUTCOMES[counts] = AdvanceOutcome(*counts)
    return outcome


@dataclass(slots=True, eq=False)
class Event:
    """One broadcast event: its broker payload, lane, broadcast time and snapshot counts.

    ``unresolved`` starts at ``snapshot`` and counts down; once it is 0 the event was acked
    by ``snapshot - failed - rejected`` subscribers (an ack is not counted otherwise)."""

    seq: int
    payload: Any
    lane: Hashable
    broadcast_at: float
    snapshot: int
    unresolved: int
    failed: int = 0
    rejected: int = 0


class EventLanes:
    """Events broadcast and neither dispatched nor abandoned, per lane, and the batch in
    flight. ``events`` (seq -> event) and ``last_seq`` are read by the ledger."""

    def __init__(self) -> None:
        self._seqs = itertools.count(1)
        self.last_seq = 0
        self.events: dict[int, Event] = {}
        self._queues: dict[Hashable, deque[Event]] = {}
        self._ready: dict[Hashable, None] = {}  # lanes whose head is resolved (ordered set)
        self.in_flight: AdvanceBatch | None = None

    def add(self, payload: Any, *, lane: Hashable, at: float, snapshot: int) -> tuple[int, bool]:
        """A broadcast to ``snapshot`` subscribers; its seq, and True when nobody has to
        resolve it (an empty snapshot: ``dispatch`` may follow)."""
        seq = next(self._seqs)
        self.last_seq = seq
        event = Event(seq, payload, lane, at, snapshot, snapshot)
        self.events[seq] = event
        queue = self._queues.get(lane)
        if queue is None:
            queue = self._queues[lane] = deque()
        queue.append(event)
        if event.unresolved:
            return seq, False
        if len(queue) == 1:
            self._ready[lane] = None
        return seq, True

    def resolve(self, seq: int, how: int) -> bool:
        """Count one subscriber's resolution of event ``seq`` (``ACKED``, ``FAILED`` or
        ``REJECTED``); True when it made its lane's head ready."""
        event = self.events[seq]
        if how == FAILED:
            event.failed += 1
        elif how == REJECTED:
            event.rejected += 1
        # acked: nothing to count (``snapshot - failed - rejected``)
        event.unresolved -= 1
        return event.unresolved == 0 and self.resolved(event)

    def resolved(self, event: Event) -> bool:
        """``event`` has no unresolved subscriber left; True when it is its lane's oldest
        (the lane is ready). The ledger calls it itself when it counts acks in bulk."""
        if self._queues[event.lane][0] is event:
            self._ready[event.lane] = None
            return True
        return False

    def fail_after(self, after: int) -> None:
        """One subscriber fails every event broadcast after ``after`` (never delivered)."""
        for seq in range(after + 1, self.last_seq + 1):
            self.resolve(seq, FAILED)

    def dispatch(self) -> Sequence[Effect]:
        """The next ready lane's resolved prefix as an ``AdvanceBatch``, unless one is in
        flight or no lane is ready."""
        if self.in_flight is not None or not self._ready:
            return NO_EFFECTS
        lane = next(iter(self._ready))
        del self._ready[lane]
        queue = self._queues[lane]
        items: list[AdvanceItem] = []
        seqs: list[int] = []
        outcomes = _OUTCOMES
        while queue and queue[0].unresolved == 0:
            event = queue.popleft()
            del self.events[event.seq]
            failed, rejected = event.failed, event.rejected
            counts = (event.snapshot - failed - rejected, failed, rejected)
            outcome = outcomes.get(counts)
            if outcome is None:
                outcome = _outcome(counts)
            items.append(AdvanceItem(event.payload, outcome))
            seqs.append(event.seq)
        if not queue:
            del self._queues[lane]
        batch = self.in_flight = AdvanceBatch(lane, tuple(items), tuple(seqs))
        return (batch,)

    def advance_done(self, batch: AdvanceBatch) -> Sequence[Effect]:
        """``batch`` was advanced: dispatch the next ready batch, if any."""
        if batch is not self.in_flight:
            raise ValueError(f"{batch!r} is not the advance in flight ({self.in_flight!r})")
        self.in_flight = None
        return self.dispatch()

    def abandon(self, *, drain: bool) -> tuple[int, ...]:
        """Drop the unresolved events (the broker redelivers them); their seqs, in order.
        ``drain`` keeps each lane's resolved prefix to dispatch; without it nothing more is
        dispatched (the batch in flight is forgotten)."""
        abandoned: list[int] = []
        for lane, queue in list(self._queues.items()):
            keep = 0
            if drain:
                while keep < len(queue) and queue[keep].unresolved == 0:
                    keep += 1
            while len(queue) > keep:
                abandoned.append(queue.pop().seq)
            if not queue:
                del self._queues[lane]
        for seq in abandoned:
            del self.events[seq]
        if not drain:
            self._ready.clear()
            self.in_flight = None
        return tuple(sorted(abandoned))

    def is_empty(self) -> bool:
        """True when nothing is in flight nor left to advance."""
        return self.in_flight is None and not self._queues

    def outstanding_by_lane(self) -> dict[Hashable, int]:
        """Events not advanced yet (waiting, or in the advance in flight), per lane."""
        counts = {lane: len(queue) for lane, queue in self._queues.items()}
        flight = self.in_flight
        if flight is not None:
            counts[flight.lane] = counts.get(flight.lane, 0) + len(flight.seqs)
        return counts

    def __repr__(self) -> str:
        flight = self.in_flight
        in_flight = "none" if flight is None else f"lane={flight.lane!r}x{len(flight.seqs)}"
        return (
            f"<EventLanes outstanding={len(self.events)} lanes={len(self._queues)} "
            f"ready={len(self._ready)} in_flight={in_flight} last_seq={self.last_seq}>"
        )
