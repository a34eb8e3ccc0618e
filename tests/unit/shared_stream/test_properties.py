"""Property tests of the ack-mode ledger over random interleavings.

A reference model, written independently of ``AckLedger``, tracks how every subscriber of
every event's snapshot resolved it. Each effect the ledger returns is checked against the
model: an ``AdvanceBatch`` only covers fully resolved events, in lane order, contiguously,
with counts that match and add up to the snapshot size, one batch in flight at a time; at
the end every broadcast event was advanced exactly once or abandoned by the stop.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from shared_stream.bookkeeping import (
    AbandonEvents,
    AckLedger,
    AdvanceBatch,
    ExpireDeparted,
    FailReason,
    FailSubscriber,
    ReleaseBindings,
)

TIMEOUT_S = 10.0
# A few subscribers that each move, rather than many that seldom do: bindings (confirm,
# refuse, departed subscribers) need a subscriber that pulled an event and bound to it.
MAX_SUBSCRIBERS = 3
MIN_EVENTS_BEFORE_STOP = 6
PENDING, ACKED, FAILED, REJECTED = "pending", "acked", "failed", "rejected"


@dataclass
class ModelEvent:
    seq: int
    lane: int
    at: float
    status: dict[int, str]  # trigger id -> resolution, for the snapshot only


@dataclass
class ModelSubscriber:
    queue: deque[int] = field(default_factory=deque)
    current: int | None = None
    current_rejected: bool = False
    unconfirmed: dict[int, set[int]] = field(default_factory=dict)  # event seq -> bindings
    # moved past (not rejected) by a stream moving the cursor itself, not counted by the
    # ledger yet (``AckLedger.catch_up``); the eager drivers leave it empty
    uncounted: list[int] = field(default_factory=list)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = AckLedger(ack_timeout_s=TIMEOUT_S)
        self.now = 0.0
        self.next_tid = 1
        self.active: dict[int, ModelSubscriber] = {}
        self.departed: dict[int, ModelSubscriber] = {}
        self.events: dict[int, ModelEvent] = {}
        self.lanes: dict[int, list[int]] = {}
        self.advanced: dict[int, int] = {}  # lane -> number of its events advanced
        self.advanced_seqs: list[int] = []
        self.abandoned: set[int] = set()
        self.bindings: dict[int, tuple[int, int]] = {}  # binding -> (trigger id, event seq)
        self.cursors: dict[int, object] = {}  # trigger id -> what ``subscribe`` returned
        self.in_flight: AdvanceBatch | None = None
        self.stopped = False

    # -- model helpers --------------------------------------------------------------------

    def sub(self, tid: int) -> ModelSubscriber:
        return self.active.get(tid) or self.departed[tid]

    def set_status(self, tid: int, seq: int, status: str) -> None:
        event = self.events[seq]
        assert event.status[tid] == PENDING, (tid, seq, event.status)
        event.status[tid] = status

    def resolved(self, seq: int) -> bool:
        return PENDING not in self.events[seq].status.values()

    def open_for(self, tid: int, seq: int) -> bool:
        """Not resolved by ``tid`` even once counted: pending, and not moved past without
        a binding left (that one the ledger acks when it counts the moves)."""
        if self.events[seq].status.get(tid) != PENDING:
            return False
        model = self.active.get(tid)
        return model is None or seq not in model.uncounted or bool(model.unconfirmed.get(seq))

    def is_open(self, seq: int) -> bool:
        return any(self.open_for(tid, seq) for tid in self.events[seq].status)

    def count_moves(self, tid: int) -> None:
        """The ledger counted what ``tid`` moved past: each event without a binding left is
        acked; a bound one resolves when its last binding is confirmed."""
        model = self.sub(tid)
        for seq in model.uncounted:
            if not model.unconfirmed.get(seq):
                self.set_status(tid, seq, ACKED)
        model.uncounted.clear()

    def drop_bindings(self, tid: int, seq: int) -> None:
        for binding in self.sub(tid).unconfirmed.pop(seq, set()):
            del self.bindings[binding]

    def fail_all(self, tid: int) -> None:
        self.count_moves(tid)  # what it moved past it did finish
        model = self.sub(tid)
        for seq, event in self.events.items():
            if event.status.get(tid) == PENDING:
                self.set_status(tid, seq, FAILED)
        for seq in list(model.unconfirmed):
            self.drop_bindings(tid, seq)
        model.queue.clear()
        model.current = None
        self.active.pop(tid, None)
        self.departed.pop(tid, None)

    def apply(self, effects) -> None:
        for effect in effects:
            if isinstance(effect, AdvanceBatch):
                self.check_batch(effect)
            elif isinstance(effect, AbandonEvents):
                assert self.stopped
                self.abandoned.update(effect.seqs)
            elif isinstance(effect, ReleaseBindings):
                assert not set(effect.seqs) & set(self.bindings), "released a live binding"

    def check_batch(self, batch: AdvanceBatch) -> None:
        assert self.in_flight is None, "two advances in flight"
        lane = self.lanes[batch.lane]
        start = self.advanced.get(batch.lane, 0)
        assert list(batch.seqs) == lane[start : start + len(batch.seqs)], "not the lane prefix"
        assert batch.seqs, "empty batch"
        for seq, (payload, outcome) in zip(batch.seqs, batch.items, strict=True):
            event = self.events[seq]
            assert payload == ("payload", seq)
            assert self.resolved(seq), f"event {seq} advanced before every subscriber resolved"
            statuses = list(event.status.values())
            assert (outcome.acked, outcome.failed, outcome.rejected) == (
                statuses.count(ACKED),
                statuses.count(FAILED),
                statuses.count(REJECTED),
            )
            assert outcome.acked + outcome.failed + outcome.rejected == len(event.status)
            assert outcome.is_clean == (outcome.acked == len(event.status) > 0)
        end = start + len(batch.seqs)
        if end < len(lane) and lane[end] not in self.abandoned:
            assert not self.resolved(lane[end]), "batch stopped short of the resolved prefix"
        self.advanced[batch.lane] = end
        self.advanced_seqs.extend(batch.seqs)
        self.in_flight = batch

    # -- rules ----------------------------------------------------------------------------

    @initialize(count=st.integers(1, MAX_SUBSCRIBERS))
    def first_subscribers(self, count: int) -> None:
        for _ in range(count):
            self.subscribe()

    @precondition(lambda self: not self.stopped and len(self.active) < MAX_SUBSCRIBERS)
    @rule()
    def subscribe(self) -> None:
        tid = self.next_tid
        self.next_tid += 1
        self.cursors[tid] = self.ledger.subscribe(tid)
        self.active[tid] = ModelSubscriber()

    @precondition(lambda self: not self.stopped)
    @rule(lane=st.integers(0, 2))
    def broadcast(self, lane: int) -> None:
        seq_guess = len(self.events) + 1
        seq, effects = self.ledger.broadcast(("payload", seq_guess), lane=lane, now=self.now)
        assert seq == seq_guess
        self.events[seq] = ModelEvent(seq, lane, self.now, dict.fromkeys(self.active, PENDING))
        self.lanes.setdefault(lane, []).append(seq)
        for model in self.active.values():
            model.queue.append(seq)
        self.apply(effects)

    @precondition(lambda self: self.active)
    @rule(data=st.data())
    def pull(self, data: st.DataObject) -> None:
        self.pull_as(data.draw(st.sampled_from(sorted(self.active))))

    @precondition(lambda self: any(model.queue for model in self.active.values()))
    @rule(data=st.data(), count=st.integers(1, 2))
    def take_and_bind(self, data: st.DataObject, count: int) -> None:
        """The common path: a subscriber takes its next event, its filter yields for it."""
        waiting = sorted(tid for tid, model in self.active.items() if model.queue)
        tid = data.draw(st.sampled_from(waiting))
        self.pull_as(tid)
        for _ in range(count):
            self.bind_as(tid)

    def pull_as(self, tid: int) -> None:
        model = self.active[tid]
        effects = list(self.ledger.pull(tid))
        self.count_moves(tid)
        if model.current is not None and not model.current_rejected:
            if not model.unconfirmed.get(model.current):
                self.set_status(tid, model.current, ACKED)
        model.current, model.current_rejected = None, False
        self.apply(effects)
        if model.queue:
            model.current = model.queue.popleft()
            self.ledger.deliver(tid, model.current)

    @precondition(lambda self: self.active)
    @rule(data=st.data())
    def bind(self, data: st.DataObject) -> None:
        self.bind_as(data.draw(st.sampled_from(sorted(self.active))))

    def bind_as(self, tid: int) -> None:
        model = self.active[tid]
        binding = self.ledger.bind(tid)
        if model.current is None or model.current_rejected:
            assert binding is None
            return
        assert binding is not None and binding not in self.bindings
        self.bindings[binding] = (tid, model.current)
        model.unconfirmed.setdefault(model.current, set()).add(binding)

    @precondition(lambda self: self.bindings)
    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.bindings)), min_size=1, max_size=3))
        chosen = list(dict.fromkeys(chosen))
        effects = list(self.ledger.confirm_persisted([*chosen, 10**9]))
        for binding in chosen:
            self.confirm_in_model(binding)
        self.apply(effects)

    def confirm_in_model(self, binding: int) -> None:
        """The model's side of a confirmed binding: its raw event resolves for that
        subscriber with its last binding, once the ledger counted it (else when it does)."""
        tid, seq = self.bindings.pop(binding)
        model = self.sub(tid)
        model.unconfirmed[seq].discard(binding)
        if model.unconfirmed[seq]:
            return
        del model.unconfirmed[seq]
        if tid in self.departed and not model.unconfirmed:
            del self.departed[tid]
        if not (tid in self.active and (model.current == seq or seq in model.uncounted)):
            self.set_status(tid, seq, ACKED)

    @precondition(lambda self: self.bindings)
    @rule(data=st.data())
    def refuse(self, data: st.DataObject) -> None:
        """The store refused a bound trigger event: its raw event is rejected for that sub."""
        binding = data.draw(st.sampled_from(sorted(self.bindings)))
        tid, seq = self.bindings[binding]
        others = sorted(self.sub(tid).unconfirmed[seq] - {binding})  # moot once it is refused
        rejected, effects = self.ledger.refuse_persisted([binding, *others, 10**9])
        assert rejected == 1, "one raw event of one subscriber is rejected once"
        self.count_moves(tid)
        model = self.sub(tid)
        self.drop_bindings(tid, seq)
        if tid in self.departed and not model.unconfirmed:
            del self.departed[tid]
        if tid in self.active and model.current == seq:
            model.current_rejected = True
        self.set_status(tid, seq, REJECTED)
        self.apply(effects)

    @precondition(lambda self: self.active)
    @rule(data=st.data())
    def reject(self, data: st.DataObject) -> None:
        tid = data.draw(st.sampled_from(sorted(self.active)))
        model = self.active[tid]
        effects = list(self.ledger.reject(tid))
        if model.current is not None and not model.current_rejected:
            self.count_moves(tid)
            self.set_status(tid, model.current, REJECTED)
            self.drop_bindings(tid, model.current)
            model.current_rejected = True
        else:
            assert effects == []
        self.apply(effects)

    @precondition(lambda self: self.active)
    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        tid = data.draw(st.sampled_from(sorted(self.active)))
        self.count_moves(tid)
        model = self.active.pop(tid)
        effects = list(self.ledger.unsubscribe(tid))
        if model.current is not None and not model.current_rejected:
            if not model.unconfirmed.get(model.current):
                self.set_status(tid, model.current, ACKED)
        for seq in model.queue:
            self.set_status(tid, seq, FAILED)
        model.queue.clear()
        model.current = None
        if model.unconfirmed:
            self.departed[tid] = model
        self.apply(effects)

    @precondition(lambda self: self.active)
    @rule(data=st.data())
    def overflow(self, data: st.DataObject) -> None:
        tid = data.draw(st.sampled_from(sorted(self.active)))
        effects = list(self.ledger.fail_subscriber(tid, FailReason.OVERFLOW))
        assert FailSubscriber(tid, FailReason.OVERFLOW) in effects
        self.fail_all(tid)
        self.apply(effects)

    @rule(seconds=st.sampled_from([0.0, 1.0, 4.0, 9.99, 10.0]))
    def check_timeouts(self, seconds: float) -> None:
        self.now += seconds
        effects = list(self.ledger.check_timeouts(self.now))
        if self.stopped:
            assert effects == []
            return
        expired = {
            tid
            for seq, event in self.events.items()
            for tid in event.status
            if self.open_for(tid, seq) and self.now - event.at >= TIMEOUT_S
        }
        failed = {e.trigger_id for e in effects if isinstance(e, FailSubscriber)}
        assert failed == expired & set(self.active)
        gone = {e.trigger_id: e.events for e in effects if isinstance(e, ExpireDeparted)}
        assert set(gone) == expired & set(self.departed), "a departed timeout is reported"
        for tid, events in gone.items():
            assert events == len(self.departed[tid].unconfirmed)
        for tid in expired:
            self.fail_all(tid)
        self.apply(effects)

    @precondition(lambda self: self.in_flight is not None)
    @rule()
    def advance_done(self) -> None:
        batch, self.in_flight = self.in_flight, None
        self.apply(self.ledger.advance_done(batch))

    # Not before a few events: an early stop leaves only timeouts to check for the rest of
    # the run, and bindings (confirm, refuse, departed subscribers) would seldom be reached.
    @precondition(lambda self: not self.stopped and len(self.events) >= MIN_EVENTS_BEFORE_STOP)
    @rule()
    def stop(self) -> None:
        self.stop_and_check()

    def stop_and_check(self) -> None:
        for tid in self.active:  # the stop counts every move first: what they finished drains
            self.count_moves(tid)
        self.stopped = True
        expected: set[int] = set()
        for lane, seqs in self.lanes.items():
            rest = seqs[self.advanced.get(lane, 0) :]
            keep = 0
            while keep < len(rest) and self.resolved(rest[keep]):
                keep += 1
            expected.update(rest[keep:])
        self.bindings.clear()  # the stop releases every binding
        self.apply(self.ledger.stop())
        assert self.abandoned == expected
        for model in [*self.active.values(), *self.departed.values()]:
            model.queue.clear()
            model.current = None
        self.active.clear()
        self.departed.clear()

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def one_advance_in_flight_and_eager_dispatch(self) -> None:
        assert self.ledger.has_advance_in_flight() == (self.in_flight is not None)
        if self.in_flight is not None:
            return
        for lane, seqs in self.lanes.items():
            start = self.advanced.get(lane, 0)
            if start < len(seqs) and seqs[start] not in self.abandoned:
                assert not self.resolved(seqs[start]), f"lane {lane} head resolved but idle"

    @invariant()
    def next_deadline_is_the_oldest_unresolved_broadcast(self) -> None:
        pending = [e.at for e in self.events.values() if self.is_open(e.seq)]
        expected = min(pending) + TIMEOUT_S if pending and not self.stopped else None
        assert self.ledger.next_deadline() == expected

    @invariant()
    def oldest_unresolved_at_is_the_deadline_less_the_ack_timeout(self) -> None:
        oldest, deadline = self.ledger.oldest_unresolved_at(), self.ledger.next_deadline()
        assert (oldest is None) == (deadline is None)
        if oldest is not None:
            assert deadline == oldest + TIMEOUT_S
        pending = [e.at for e in self.events.values() if self.is_open(e.seq)]
        assert oldest == (min(pending) if pending and not self.stopped else None)

    @invariant()
    def each_event_advanced_at_most_once(self) -> None:
        assert len(self.advanced_seqs) == len(set(self.advanced_seqs))
        assert not set(self.advanced_seqs) & self.abandoned

    def teardown(self) -> None:
        if not self.stopped:
            self.stop_and_check()
        while self.in_flight is not None:
            self.advance_done()
        assert self.ledger.is_drained()
        assert sorted([*self.advanced_seqs, *self.abandoned]) == sorted(self.events)
        assert self.ledger.outstanding_event_seqs == ()
        assert self.ledger.outstanding_binding_seqs == ()


LedgerMachine.TestCase.settings = settings(stateful_step_count=40)
test_ack_ledger_properties = LedgerMachine.TestCase
