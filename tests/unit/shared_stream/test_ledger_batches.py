"""Property test of the ack-mode ledger driven in batches, as the fan-out hot path drives it.

The group broadcasts a poll's burst of raw events at once, each subscriber then takes
several events in a row (``AckLedger.step``: moved past the current one and took the next
in one call), binds trigger events to some, rejects some, and the persister confirms the
bindings of a whole commit at once, in any order, with seqs the ledger never handed out.
This drives ``test_properties.LedgerMachine``'s reference model with those batch inputs
(random subscribers, lanes, processing orders, rejections, refusals, confirmations, ack
timeouts), and again with the subscribers moving their cursors as the streams do, the
moves counted later (``CursorLedgerMachine``), and checks, on top of its checks, the
persistence gate directly: an event is advanced only once every subscriber of its
snapshot moved past it and every trigger event bound to it was confirmed stored (or that
subscriber rejected it, failed or timed out); advances come out in lane order,
contiguously, never twice.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.unit.shared_stream.test_properties import ACKED, LedgerMachine

if TYPE_CHECKING:
    from shared_stream.bookkeeping import AdvanceBatch

MAX_BATCH = 8


class BatchLedgerMachine(LedgerMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bound_to: dict[tuple[int, int], set[int]] = {}  # (trigger id, event) -> bindings
        self.stored: set[int] = set()  # bindings confirmed persisted
        self.lane_advanced: dict[int, list[int]] = {}

    # -- checks on top of the model's ------------------------------------------------------

    def check_batch(self, batch: AdvanceBatch) -> None:
        super().check_batch(batch)
        seen = self.lane_advanced.setdefault(batch.lane, [])
        chain = [*seen[-1:], *batch.seqs]
        assert all(a < b for a, b in itertools.pairwise(chain)), "lane order"
        seen.extend(batch.seqs)
        for seq in batch.seqs:
            for tid, status in self.events[seq].status.items():
                if status != ACKED:
                    continue  # rejected or failed: nothing of it is advanced as clean
                model = self.sub(tid) if tid in self.active or tid in self.departed else None
                if model is not None and tid in self.active:
                    assert model.current != seq or model.current is None, (
                        f"event {seq} advanced while trigger {tid} still processes it"
                    )
                    assert seq not in model.queue, f"event {seq} advanced before {tid} took it"
                unstored = self.bound_to.get((tid, seq), set()) - self.stored
                assert not unstored, f"event {seq} advanced before {unstored} were stored"

    def bind_as(self, tid: int) -> None:
        before = set(self.bindings)
        super().bind_as(tid)
        for binding in set(self.bindings) - before:
            self.bound_to.setdefault(self.bindings[binding], set()).add(binding)

    # -- batch inputs ------------------------------------------------------------------------

    @precondition(lambda self: not self.stopped)
    @rule(lanes=st.lists(st.integers(0, 3), min_size=1, max_size=MAX_BATCH))
    def broadcast_batch(self, lanes: list[int]) -> None:
        """One poll's burst: several raw events broadcast back to back, at one instant."""
        for lane in lanes:
            self.broadcast(lane)

    def step_as(self, tid: int) -> None:
        """Take the next queued event; through ``step`` when moving past a current one."""
        model = self.active[tid]
        if model.current is None or not model.queue:
            self.pull_as(tid)
            return
        next_seq = model.queue[0]
        effects = list(self.ledger.step(tid, next_seq))
        self.count_moves(tid)
        if not model.current_rejected and not model.unconfirmed.get(model.current):
            self.set_status(tid, model.current, ACKED)
        model.current, model.current_rejected = model.queue.popleft(), False
        self.apply(effects)

    @precondition(lambda self: any(model.queue for model in self.active.values()))
    @rule(data=st.data())
    def process_batch(self, data: st.DataObject) -> None:
        """Subscribers, in a random order, each take a run of events: per event its filter
        yields 0-2 trigger events (bound), or rejects it, before taking the next."""
        waiting = sorted(tid for tid, model in self.active.items() if model.queue)
        order = data.draw(st.permutations(waiting))
        for tid in order[: data.draw(st.integers(1, len(order)))]:
            for _ in range(data.draw(st.integers(1, MAX_BATCH))):
                if tid not in self.active or not self.active[tid].queue:
                    break
                self.step_as(tid)
                action = data.draw(st.sampled_from(["bind", "bind", "bind2", "none", "reject"]))
                if action == "reject":
                    self.apply(self.reject_as(tid))
                for _ in range({"bind": 1, "bind2": 2}.get(action, 0)):
                    self.bind_as(tid)

    def reject_as(self, tid: int) -> list[object]:
        model = self.active[tid]
        effects = list(self.ledger.reject(tid))
        if model.current is not None and not model.current_rejected:
            self.count_moves(tid)  # the ledger counts its moves first
            self.set_status(tid, model.current, "rejected")
            self.drop_bindings(tid, model.current)
            model.current_rejected = True
        return effects

    @precondition(lambda self: self.bindings)
    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        """The persister commits a batch: a random subset of the live bindings, shuffled,
        with seqs already confirmed or never handed out mixed in (replaces the model's
        one-to-three-seq confirmations: every confirmation is recorded as stored)."""
        live = sorted(self.bindings)
        chosen = data.draw(st.lists(st.sampled_from(live), unique=True, min_size=1))
        noise = data.draw(st.lists(st.sampled_from([10**9, *sorted(self.stored)[:3]])))
        seqs = data.draw(st.permutations([*chosen, *noise]))
        effects = list(self.ledger.confirm_persisted(seqs))
        for binding in chosen:
            self.stored.add(binding)
            self.confirm_in_model(binding)
        self.apply(effects)

    @precondition(lambda self: self.in_flight is not None)
    @rule()
    def drain_advances(self) -> None:
        """The advancer keeps up: every ready batch goes out, one at a time."""
        while self.in_flight is not None:
            self.advance_done()

    def teardown(self) -> None:
        super().teardown()
        for lane, seqs in self.lane_advanced.items():
            assert seqs == sorted(set(seqs)), f"lane {lane} advanced out of order or twice"
            assert seqs == self.lanes[lane][: len(seqs)], f"lane {lane} skipped an event"


BatchLedgerMachine.TestCase.settings = settings(stateful_step_count=40)
test_ack_ledger_in_batches = BatchLedgerMachine.TestCase


class CursorLedgerMachine(BatchLedgerMachine):
    """The same, driven as a subscriber's stream drives the ledger on the hot path: each
    take moves the subscriber's cursor without a call (``subscriber.Cursor``), and the
    ledger counts the moves only when told (``catch_up``, a ``pull`` before a wait) or
    before whatever needs them counted. Checks, on top of the batch checks: nothing is
    advanced that was not counted, confirmations of events not counted yet resolve them
    when they are counted, and timeouts see moves whether or not they were counted."""

    def step_as(self, tid: int) -> None:
        model = self.active[tid]
        if not model.queue:  # the stream waits: it reports first
            self.pull_as(tid)
            return
        if model.current is not None and not model.current_rejected:
            model.uncounted.append(model.current)
        model.current, model.current_rejected = model.queue.popleft(), False
        cursor = self.cursors[tid]
        cursor.position = model.current  # type: ignore[attr-defined]
        cursor.in_window = True  # type: ignore[attr-defined]

    @precondition(lambda self: self.active)
    @rule(data=st.data())
    def catch_up(self, data: st.DataObject) -> None:
        """The stream reports its moves (every ``CATCH_UP_EVERY`` events on the hot path)."""
        tid = data.draw(st.sampled_from(sorted(self.active)))
        effects = list(self.ledger.catch_up(tid))
        self.count_moves(tid)
        self.apply(effects)


CursorLedgerMachine.TestCase.settings = settings(stateful_step_count=50)
test_ack_ledger_driven_by_cursor = CursorLedgerMachine.TestCase
