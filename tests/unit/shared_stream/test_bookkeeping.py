"""Table tests of the pure ack-mode state machine (``shared_stream.bookkeeping``)."""

from __future__ import annotations

import ast
import inspect

import pytest

from shared_stream import bookkeeping, lanes
from shared_stream.bookkeeping import (
    AbandonEvents,
    AckLedger,
    AdvanceBatch,
    ExpireDeparted,
    FailReason,
    FailSubscriber,
    ReleaseBindings,
)
from shared_stream.producer import AdvanceItem, AdvanceOutcome

TIMEOUT_S = 10.0


def ledger_with(*trigger_ids: int) -> AckLedger:
    ledger = AckLedger(ack_timeout_s=TIMEOUT_S)
    for trigger_id in trigger_ids:
        ledger.subscribe(trigger_id)
    return ledger


def broadcast(ledger: AckLedger, payload: object, *, lane: object = None, now: float = 0.0):
    seq, effects = ledger.broadcast(payload, lane=lane, now=now)
    return seq, list(effects)


def take(ledger: AckLedger, trigger_id: int, seq: int) -> list:
    """The subscriber pulls: it moves past its current event and receives ``seq``."""
    effects = list(ledger.pull(trigger_id))
    ledger.deliver(trigger_id, seq)
    return effects


def batches(effects) -> list[AdvanceBatch]:
    return [e for e in effects if isinstance(e, AdvanceBatch)]


def only_batch(effects) -> AdvanceBatch:
    (batch,) = batches(effects)
    return batch


def outcomes(batch: AdvanceBatch) -> list[tuple[object, tuple[int, int, int]]]:
    return [(p, (o.acked, o.failed, o.rejected)) for p, o in batch.items]


# -- the module's shape -------------------------------------------------------------------


# The pure core: the ledger and the event lanes it drives.
PURE_CORE = (bookkeeping, lanes)


@pytest.mark.parametrize("module", PURE_CORE, ids=lambda m: m.__name__)
def test_the_pure_core_imports_no_async_library_nor_clock(module):
    tree = ast.parse(inspect.getsource(module))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported.isdisjoint({"asyncio", "anyio", "aiokafka", "trio", "time"}), imported


@pytest.mark.parametrize("module", PURE_CORE, ids=lambda m: m.__name__)
def test_the_pure_core_never_awaits(module):
    tree = ast.parse(inspect.getsource(module))
    forbidden = (ast.Await, ast.AsyncFunctionDef, ast.AsyncFor, ast.AsyncWith)
    assert not [node for node in ast.walk(tree) if isinstance(node, forbidden)]


def test_the_ledger_opens_with_a_theory_of_operation():
    assert "Theory of operation" in (
        ast.get_docstring(ast.parse(inspect.getsource(bookkeeping))) or ""
    )


@pytest.mark.parametrize(
    ("acked", "failed", "rejected", "clean"),
    [(1, 0, 0, True), (3, 0, 0, True), (0, 0, 0, False), (2, 1, 0, False), (2, 0, 1, False)],
)
def test_outcome_is_clean_only_when_every_subscriber_accepted(acked, failed, rejected, clean):
    assert AdvanceOutcome(acked, failed, rejected).is_clean is clean


def test_advance_item_unpacks_as_payload_and_outcome():
    payload, outcome = AdvanceItem("p", AdvanceOutcome(1, 0))
    assert (payload, outcome.rejected) == ("p", 0)


# -- persistence gating -------------------------------------------------------------------


def test_event_advances_only_after_moving_past_and_confirmation():
    ledger = ledger_with(1)
    seq, effects = broadcast(ledger, "p1")
    assert effects == []
    assert take(ledger, 1, seq) == []
    binding = ledger.bind(1)
    assert binding is not None
    assert list(ledger.pull(1)) == []  # moved past, but the trigger event is not persisted
    batch = only_batch(ledger.confirm_persisted([binding]))
    assert outcomes(batch) == [("p1", (1, 0, 0))]
    assert batch.items[0].outcome.is_clean
    assert batch.seqs == (seq,)


def test_confirmation_before_moving_past_waits_for_the_pull():
    ledger = ledger_with(1)
    seq, _ = broadcast(ledger, "p1")
    take(ledger, 1, seq)
    binding = ledger.bind(1)
    assert list(ledger.confirm_persisted([binding])) == []
    assert outcomes(only_batch(ledger.pull(1))) == [("p1", (1, 0, 0))]


def test_every_binding_of_an_event_must_be_confirmed():
    ledger = ledger_with(1)
    seq, _ = broadcast(ledger, "p1")
    take(ledger, 1, seq)
    first, second = ledger.bind(1), ledger.bind(1)
    ledger.pull(1)
    assert list(ledger.confirm_persisted([first])) == []
    assert only_batch(ledger.confirm_persisted([second, 999])).seqs == (seq,)


def test_every_subscriber_of_the_snapshot_must_resolve():
    ledger = ledger_with(1, 2)
    seq, _ = broadcast(ledger, "p1")
    take(ledger, 1, seq)
    assert list(ledger.pull(1)) == []
    take(ledger, 2, seq)
    assert outcomes(only_batch(ledger.pull(2))) == [("p1", (2, 0, 0))]


def test_zero_subscriber_broadcast_advances_at_once_and_is_not_clean():
    ledger = ledger_with()
    _, effects = broadcast(ledger, "p1")
    batch = only_batch(effects)
    assert outcomes(batch) == [("p1", (0, 0, 0))]
    assert not batch.items[0].outcome.is_clean


def test_snapshot_is_frozen_at_broadcast():
    ledger = ledger_with(1)
    first, _ = broadcast(ledger, "p1")
    ledger.subscribe(2)  # joins after p1: not in its snapshot
    second, _ = broadcast(ledger, "p2")
    with pytest.raises(ValueError, match="out of order"):
        ledger.deliver(2, first)
    take(ledger, 2, second)
    take(ledger, 1, first)
    assert outcomes(only_batch(ledger.pull(1))) == [("p1", (1, 0, 0))]


def test_bind_outside_a_window_returns_none():
    ledger = ledger_with(1)
    assert ledger.bind(1) is None  # nothing delivered yet
    assert ledger.bind(42) is None  # unknown subscriber


# -- reject --------------------------------------------------------------------------------


def test_reject_resolves_at_once_and_releases_bindings():
    ledger = ledger_with(1)
    seq, _ = broadcast(ledger, "p1")
    take(ledger, 1, seq)
    binding = ledger.bind(1)
    assert ledger.is_in_window(1)
    effects = list(ledger.reject(1))
    assert ReleaseBindings((binding,)) in effects
    assert outcomes(only_batch(effects)) == [("p1", (0, 0, 1))]
    assert not ledger.is_in_window(1)
    assert ledger.bind(1) is None  # nothing left to gate in this window
    assert list(ledger.reject(1)) == []  # second reject: no effect
    assert list(ledger.pull(1)) == []  # moving past a rejected event resolves nothing more


def test_reject_outside_a_window_does_nothing():
    ledger = ledger_with(1)
    assert list(ledger.reject(1)) == []
    seq, _ = broadcast(ledger, "p1")
    take(ledger, 1, seq)
    ledger.pull(1)  # moved past: the window is closed
    assert list(ledger.reject(1)) == []


# -- unsubscribe and failures -------------------------------------------------------------


def test_unsubscribe_resolves_current_event_and_fails_undelivered_ones():
    ledger = ledger_with(1, 2)
    first, _ = broadcast(ledger, "p1")
    second, _ = broadcast(ledger, "p2")
    take(ledger, 2, first)
    take(ledger, 2, second)
    ledger.pull(2)
    take(ledger, 1, first)
    effects = list(ledger.unsubscribe(1))
    assert outcomes(only_batch(effects)) == [("p1", (2, 0, 0)), ("p2", (1, 1, 0))]
    assert list(ledger.unsubscribe(1)) == []


def test_unsubscribe_after_a_failure_fails_the_current_event_too():
    """A filter that raised did not finish its event: failed (redelivered / dead-lettered),
    never advanced as clean; an event still awaiting confirmation fails as well."""
    ledger = ledger_with(1, 2)
    first, _ = broadcast(ledger, "p1")
    second, _ = broadcast(ledger, "p2")
    take(ledger, 1, first)
    ledger.bind(1)
    ledger.pull(1)  # moved on to p2 while p1's trigger event is not confirmed yet
    for seq in (first, second):
        take(ledger, 2, seq)
    ledger.pull(2)
    effects = list(ledger.unsubscribe(1, failed=True))
    assert outcomes(only_batch(effects)) == [("p1", (1, 1, 0)), ("p2", (1, 1, 0))]
    assert ledger.outstanding_binding_seqs == ()


def test_unsubscribed_subscriber_still_resolves_through_confirmation():
    ledger = ledger_with(1, 2)
    seq, _ = broadcast(ledger, "p1")
    take(ledger, 1, seq)
    binding = ledger.bind(1)
    assert list(ledger.unsubscribe(1)) == []
    take(ledger, 2, seq)
    assert list(ledger.pull(2)) == []
    assert outcomes(only_batch(ledger.confirm_persisted([binding]))) == [("p1", (2, 0, 0))]
    assert ledger.outstanding_binding_seqs == ()


def test_fail_subscriber_fails_everything_it_had_not_resolved():
    ledger = ledger_with(1, 2)
    first, _ = broadcast(ledger, "p1")
    second, _ = broadcast(ledger, "p2")
    take(ledger, 1, first)
    binding = ledger.bind(1)
    effects = list(ledger.fail_subscriber(1, FailReason.OVERFLOW))
    assert FailSubscriber(1, FailReason.OVERFLOW) in effects
    assert ReleaseBindings((binding,)) in effects
    assert batches(effects) == []  # subscriber 2 has not resolved anything yet
    assert ledger.bind(1) is None
    assert list(ledger.confirm_persisted([binding])) == []  # released: ignored
    take(ledger, 2, first)
    first_batch = only_batch(take(ledger, 2, second))
    assert outcomes(first_batch) == [("p1", (1, 1, 0))]
    assert list(ledger.pull(2)) == []  # p2 resolved, behind the advance in flight
    assert outcomes(only_batch(ledger.advance_done(first_batch))) == [("p2", (1, 1, 0))]
    assert list(ledger.fail_subscriber(1, FailReason.OVERFLOW)) == []


# -- ack timeout --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("broadcast_at", "now", "fails"),
    [(0.0, 9.999, False), (0.0, 10.0, True), (0.1, 10.1, True), (5.0, 14.99, False)],
)
def test_ack_timeout_boundary_is_inclusive(broadcast_at, now, fails):
    ledger = ledger_with(1)
    seq, _ = broadcast(ledger, "p1", now=broadcast_at)
    take(ledger, 1, seq)
    assert ledger.next_deadline() == broadcast_at + TIMEOUT_S
    effects = list(ledger.check_timeouts(now))
    assert (FailSubscriber(1, FailReason.ACK_TIMEOUT) in effects) is fails
    if fails:
        assert outcomes(only_batch(effects)) == [("p1", (0, 1, 0))]
        assert ledger.next_deadline() is None


def test_ack_timeout_fails_only_the_stalled_subscriber():
    ledger = ledger_with(1, 2)
    seq, _ = broadcast(ledger, "p1", now=0.0)
    take(ledger, 1, seq)
    ledger.pull(1)  # subscriber 1 resolved it; subscriber 2 never pulled it
    effects = list(ledger.check_timeouts(TIMEOUT_S))
    assert [e for e in effects if isinstance(e, FailSubscriber)] == [
        FailSubscriber(2, FailReason.ACK_TIMEOUT)
    ]
    assert outcomes(only_batch(effects)) == [("p1", (1, 1, 0))]
    assert ledger.subscriber_ids == (1,)


def test_unconfirmed_binding_of_departed_subscriber_times_out():
    ledger = ledger_with(1)
    seq, _ = broadcast(ledger, "p1", now=0.0)
    take(ledger, 1, seq)
    binding = ledger.bind(1)
    ledger.unsubscribe(1)
    assert (ledger.oldest_unresolved_at(), ledger.next_deadline()) == (0.0, TIMEOUT_S)
    assert list(ledger.check_timeouts(9.0)) == []
    effects = list(ledger.check_timeouts(10.0))
    assert not [e for e in effects if isinstance(e, FailSubscriber)]  # no stream to fail
    assert ExpireDeparted(1, events=1) in effects  # ... but the driver counts it
    assert ReleaseBindings((binding,)) in effects
    assert outcomes(only_batch(effects)) == [("p1", (0, 1, 0))]
    assert (ledger.oldest_unresolved_at(), ledger.next_deadline()) == (None, None)


def test_refusing_every_binding_of_an_event_rejects_it_once():
    ledger = ledger_with(1, 2)
    seq, _ = broadcast(ledger, "p1")
    take(ledger, 1, seq)
    take(ledger, 2, seq)
    first, second, other = ledger.bind(1), ledger.bind(1), ledger.bind(2)
    rejected, effects = ledger.refuse_persisted([first, second, 10**9])
    assert rejected == 1  # the second binding of that raw event is moot, the unknown ignored
    assert ReleaseBindings((first, second)) in effects and not batches(effects)
    assert ledger.refuse_persisted([second]) == (0, ())
    rejected, effects = ledger.refuse_persisted([other])
    assert rejected == 1
    assert outcomes(only_batch(effects)) == [("p1", (0, 0, 2))]


# -- lanes and the single advance in flight -----------------------------------------------


def test_unresolved_event_of_one_lane_does_not_hold_back_another_lane():
    ledger = ledger_with(1)
    slow, _ = broadcast(ledger, "a1", lane="a")
    fast, _ = broadcast(ledger, "b1", lane="b")
    take(ledger, 1, slow)
    binding = ledger.bind(1)  # a1 waits for persistence
    take(ledger, 1, fast)
    batch = only_batch(ledger.pull(1))
    assert (batch.lane, batch.seqs) == ("b", (fast,))
    ledger.advance_done(batch)
    assert only_batch(ledger.confirm_persisted([binding])).lane == "a"


def test_resolved_events_accumulate_while_an_advance_is_in_flight():
    ledger = ledger_with(1)
    seqs = [broadcast(ledger, f"p{i}")[0] for i in range(4)]
    take(ledger, 1, seqs[0])
    first = only_batch(take(ledger, 1, seqs[1]))
    assert first.seqs == (seqs[0],)
    assert ledger.has_advance_in_flight()
    assert take(ledger, 1, seqs[2]) == []  # p1 resolved, but one advance is in flight
    assert take(ledger, 1, seqs[3]) == []
    second = only_batch(ledger.advance_done(first))
    assert second.seqs == (seqs[1], seqs[2])
    with pytest.raises(ValueError, match="not the advance in flight"):
        ledger.advance_done(first)


def test_lane_prefix_stops_at_the_first_unresolved_event():
    ledger = ledger_with(1, 2)
    seqs = [broadcast(ledger, f"p{i}")[0] for i in range(3)]
    for seq in seqs:
        take(ledger, 1, seq)
    ledger.pull(1)
    take(ledger, 2, seqs[0])
    batch = only_batch(take(ledger, 2, seqs[1]))
    assert batch.seqs == (seqs[0],)
    assert ledger.outstanding_event_seqs == (seqs[1], seqs[2])


# -- stop ---------------------------------------------------------------------------------


def test_stop_drains_resolved_prefixes_and_abandons_the_rest():
    ledger = ledger_with(1)
    seqs = [broadcast(ledger, f"p{i}", lane=i % 2)[0] for i in range(4)]
    take(ledger, 1, seqs[0])
    first = only_batch(take(ledger, 1, seqs[1]))  # p0 in flight
    take(ledger, 1, seqs[2])  # p1 resolved (lane 1)
    binding = ledger.bind(1)  # p2 waits for persistence
    effects = list(ledger.stop())
    assert AbandonEvents((seqs[2], seqs[3])) in effects
    assert ReleaseBindings((binding,)) in effects
    assert not ledger.is_drained()
    second = only_batch(ledger.advance_done(first))
    assert second.seqs == (seqs[1],)
    assert list(ledger.advance_done(second)) == []
    assert ledger.is_drained()
    assert ledger.outstanding_event_seqs == ()
    assert list(ledger.confirm_persisted([binding])) == []
    assert list(ledger.stop()) == []


def test_stop_without_drain_abandons_everything():
    ledger = ledger_with(1)
    seqs = [broadcast(ledger, f"p{i}")[0] for i in range(3)]
    take(ledger, 1, seqs[0])
    only_batch(take(ledger, 1, seqs[1]))
    take(ledger, 1, seqs[2])  # p1 resolved, waiting behind the in-flight p0
    effects = list(ledger.stop(drain=False))
    assert AbandonEvents((seqs[1], seqs[2])) in effects
    assert batches(effects) == []
    assert ledger.is_drained()
    with pytest.raises(RuntimeError):
        broadcast(ledger, "late")
    with pytest.raises(RuntimeError):
        ledger.subscribe(9)


def test_repr_shows_state():
    ledger = ledger_with(1, 2)
    broadcast(ledger, "p1")
    text = repr(ledger)
    assert "subscribers=2" in text
    assert "outstanding=1" in text
    assert "in_flight=none" in text


def test_duplicate_subscribe_and_bad_timeout_are_rejected():
    ledger = ledger_with(1)
    with pytest.raises(ValueError, match="already subscribed"):
        ledger.subscribe(1)
    with pytest.raises(ValueError, match="positive"):
        AckLedger(ack_timeout_s=0)
