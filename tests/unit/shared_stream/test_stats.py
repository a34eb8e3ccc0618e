"""``SharedStreamManager.stats()``: each counter and gauge moves for its own reason only."""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import pytest

from shared_stream import (
    AckTimeout,
    GroupStats,
    SharedStreamManager,
    SubscriberOverflow,
    reject_shared_stream_event,
)
from shared_stream.bookkeeping import AckLedger
from shared_stream.keys import broker_kind, stream_key_digest
from shared_stream.stats import (
    REPORTED_LANES,
    busiest_lanes,
    merge,
    merge_by_key,
    retired,
)
from shared_stream.testing import (
    BlockingProducer,
    FakeClock,
    InMemoryFeed,
    InMemoryProducer,
    SubscriberHarness,
)
from triggers.base import BaseEventTrigger, TriggerEvent, classpath_of


class FeedTrigger(BaseEventTrigger):
    """Fast mode: raw events come from the feed registered under ``source``."""

    feeds: ClassVar[dict[str, InMemoryFeed]] = {}

    def __init__(self, *, source: str) -> None:
        super().__init__()
        self.source = source

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {"source": self.source}

    async def run(self):
        yield TriggerEvent({})

    def shared_stream_key(self):
        return (type(self).__name__, self.source)

    @classmethod
    async def open_shared_stream(cls, kwargs):
        async for item in cls.feeds[kwargs["source"]]:
            yield item

    async def filter_shared_stream(self, shared_stream):
        async for raw in shared_stream:
            if raw.get("reject"):
                reject_shared_stream_event()
                continue
            for _ in range(raw.get("copies", 1)):
                yield TriggerEvent(raw)


class ProducerTrigger(FeedTrigger):
    """Ack mode: the factory hands out the producer registered under ``source``."""

    producers: ClassVar[dict[str, InMemoryProducer]] = {}

    @classmethod
    def create_shared_stream_producer(cls, kwargs):
        return cls.producers[kwargs["source"]]


@pytest.fixture(autouse=True)
def _registries():
    FeedTrigger.feeds.clear()
    ProducerTrigger.producers.clear()


def start(tg, manager, trigger, trigger_id, **kwargs) -> SubscriberHarness:
    harness = SubscriberHarness(manager, trigger, trigger_id=trigger_id, **kwargs)
    tg.start_soon(harness.run)
    return harness


def only(manager: SharedStreamManager) -> GroupStats:
    (stats,) = manager.stats()
    return stats


class OddKeyTrigger(FeedTrigger):
    """A key holding an object whose text differs between processes: no digest."""

    token = object()

    def shared_stream_key(self):
        return (type(self).__name__, self.token)


async def test_a_snapshot_carries_the_digest_trigger_rows_store_for_its_key():
    with anyio.fail_after(5):
        FeedTrigger.feeds["d"] = InMemoryFeed()
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            start(tg, mgr, FeedTrigger(source="d"), 1)
            start(tg, mgr, OddKeyTrigger(source="d"), 2)
            await anyio.wait_all_tasks_blocked()
            stable, odd = sorted(mgr.stats(), key=lambda s: s.key.startswith("('Odd"))
            assert stable.digest == stream_key_digest(("FeedTrigger", "d"))
            assert odd.digest is None
            tg.cancel_scope.cancel()


# -- the pure ledger's read-only questions ------------------------------------------------


def test_ledger_outstanding_by_lane_counts_waiting_and_in_flight_events():
    ledger = AckLedger(ack_timeout_s=60)
    ledger.subscribe(1)
    for n, lane in enumerate("aba"):
        ledger.broadcast(f"p{n}", lane=lane, now=float(n))
    assert ledger.outstanding_by_lane() == {"a": 2, "b": 1}
    ledger.deliver(1, 1)
    (batch,) = ledger.pull(1)  # p0 resolved: lane a's head goes in flight
    assert batch.seqs == (1,)
    assert ledger.outstanding_by_lane() == {"a": 2, "b": 1}  # in flight is not advanced yet
    assert ledger.advance_done(batch) == ()
    assert ledger.outstanding_by_lane() == {"a": 1, "b": 1}


def test_ledger_oldest_unresolved_at_skips_resolved_events():
    ledger = AckLedger(ack_timeout_s=60)
    assert ledger.oldest_unresolved_at() is None
    ledger.subscribe(1)
    ledger.broadcast("p1", lane="a", now=10.0)
    ledger.broadcast("p2", lane="b", now=12.0)
    assert ledger.oldest_unresolved_at() == 10.0
    ledger.deliver(1, 1)
    ledger.pull(1)
    assert ledger.oldest_unresolved_at() == 12.0
    ledger.deliver(1, 2)
    ledger.pull(1)
    assert ledger.oldest_unresolved_at() is None


# -- fast mode ----------------------------------------------------------------------------


async def test_fast_group_counts_polls_deliveries_high_water_and_overflow():
    with anyio.fail_after(5):
        feed = FeedTrigger.feeds["s"] = InMemoryFeed()
        async with (
            SharedStreamManager(max_subscriber_queue=3) as mgr,
            anyio.create_task_group() as tg,
        ):
            slow = start(tg, mgr, FeedTrigger(source="s"), 1)
            quick = start(tg, mgr, FeedTrigger(source="s"), 2)
            assert only(mgr) == GroupStats(key="('FeedTrigger', 's')", mode="fast", subscribers=2)
            slow.pause()
            feed.put({"n": 0})
            await slow.wait_for_events(1)
            await quick.wait_for_events(1)
            stats = only(mgr)
            assert (stats.events_polled, stats.deliveries, stats.overflows) == (1, 2, 0)
            for n in range(1, 4):  # slow's queue reaches 3 (the limit), nobody overflows
                feed.put({"n": n})
            await quick.wait_for_events(4)
            stats = only(mgr)
            assert (stats.queue_high_water, stats.overflows, stats.subscribers) == (3, 0, 2)
            feed.put({"n": 4})  # slow's queue is full: it overflows
            await quick.wait_for_events(5)
            slow.resume()
            await slow.wait_finished()
            assert isinstance(slow.error, SubscriberOverflow)
            stats = only(mgr)
            assert stats.overflows == 1 and stats.ack_timeouts == 0
            assert (stats.events_polled, stats.deliveries, stats.subscribers) == (5, 9, 1)
            assert stats.queue_high_water == 3
            assert stats.outstanding_by_lane == {} and stats.oldest_unresolved_age_s is None
            assert stats.advances == 0
            tg.cancel_scope.cancel()
        assert mgr.stats() == []  # no live group left


# -- ack mode -----------------------------------------------------------------------------


async def test_ack_group_reports_outstanding_per_lane_and_oldest_age():
    with anyio.fail_after(5):
        clock = FakeClock(100.0)
        producer = ProducerTrigger.producers["s"] = InMemoryProducer(lane=lambda p: p[0])
        async with (
            SharedStreamManager(ack_timeout=60.0, clock=clock) as mgr,
            anyio.create_task_group() as tg,
        ):
            sub = start(tg, mgr, ProducerTrigger(source="s"), 1, auto_confirm=False)
            await producer.put({"n": 1}, "a1")
            clock.advance(2.0)
            await producer.put({"n": 2}, "b1")
            await producer.put({"n": 3}, "a2")
            await sub.wait_for_events(3)
            await anyio.wait_all_tasks_blocked()
            clock.advance(3.0)
            stats = only(mgr)
            assert stats.mode == "ack"
            assert stats.outstanding_by_lane == {"'a'": 2, "'b'": 1}
            assert stats.oldest_unresolved_age_s == pytest.approx(5.0)
            sub.confirm_all()
            await producer.wait_for_advanced(3)
            await anyio.wait_all_tasks_blocked()
            stats = only(mgr)
            assert stats.outstanding_by_lane == {} and stats.oldest_unresolved_age_s is None
            assert (stats.advances, stats.advanced_events) == (2, 3)  # lane a, then lane b
            tg.cancel_scope.cancel()


async def test_advances_count_batches_their_sizes_and_latency():
    with anyio.fail_after(5):
        clock = FakeClock()
        producer = ProducerTrigger.producers["s"] = BlockingProducer()
        async with (
            SharedStreamManager(ack_timeout=60.0, clock=clock) as mgr,
            anyio.create_task_group() as tg,
        ):
            sub = start(tg, mgr, ProducerTrigger(source="s"), 1, auto_confirm=False)
            for n in range(3):
                await producer.put({"n": n}, f"p{n}")
            await sub.wait_for_events(3)
            await anyio.wait_all_tasks_blocked()
            sub.confirm_all()  # all three resolve at once: one batch of 3
            await producer.wait_blocked()
            assert only(mgr).outstanding_by_lane == {"None": 3}  # in flight, not advanced
            clock.advance(2.5)
            producer.release()
            await producer.wait_for_advanced(3)
            await anyio.wait_all_tasks_blocked()
            stats = only(mgr)
            assert (stats.advances, stats.advanced_events, stats.last_advance_batch) == (1, 3, 3)
            assert stats.advance_latency_sum_s == pytest.approx(2.5)
            assert stats.outstanding_by_lane == {}
            await producer.put({"n": 3}, "p3")
            await sub.wait_for_events(4)
            await anyio.wait_all_tasks_blocked()
            sub.confirm_all()
            await producer.wait_blocked()
            clock.advance(0.5)
            producer.release()
            await producer.wait_for_advanced(4)
            await anyio.wait_all_tasks_blocked()
            stats = only(mgr)
            assert (stats.advances, stats.advanced_events, stats.last_advance_batch) == (2, 4, 1)
            assert stats.advance_latency_sum_s == pytest.approx(3.0)
            assert (stats.overflows, stats.ack_timeouts, stats.rejects) == (0, 0, 0)
            tg.cancel_scope.cancel()


async def test_ack_timeout_is_counted_once_per_failed_subscriber():
    with anyio.fail_after(5):
        clock = FakeClock(100.0)
        producer = ProducerTrigger.producers["s"] = InMemoryProducer()
        async with (
            SharedStreamManager(ack_timeout=10.0, clock=clock) as mgr,
            anyio.create_task_group() as tg,
        ):
            stalled = start(tg, mgr, ProducerTrigger(source="s"), 1, auto_confirm=False)
            healthy = start(tg, mgr, ProducerTrigger(source="s"), 2)
            await producer.put({"n": 1}, "p1")
            await stalled.wait_for_events(1)
            await healthy.wait_for_events(1)
            await anyio.wait_all_tasks_blocked()
            clock.advance(9.9)
            await mgr.check_timeouts()
            stats = only(mgr)
            assert stats.ack_timeouts == 0
            assert stats.oldest_unresolved_age_s == pytest.approx(9.9)
            clock.advance(0.1)
            await mgr.check_timeouts()
            await stalled.wait_finished()
            assert isinstance(stalled.error, AckTimeout)
            await producer.wait_for_advanced(1)
            stats = only(mgr)
            assert (stats.ack_timeouts, stats.overflows, stats.subscribers) == (1, 0, 1)
            tg.cancel_scope.cancel()


async def test_rejects_are_counted_and_outside_a_window_are_not():
    with anyio.fail_after(5):
        producer = ProducerTrigger.producers["s"] = InMemoryProducer()
        feed = FeedTrigger.feeds["f"] = InMemoryFeed()
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            sub = start(tg, mgr, ProducerTrigger(source="s"), 1)
            fast = start(tg, mgr, FeedTrigger(source="f"), 2)
            await producer.put({"reject": True}, "p1")
            await producer.put({"n": 2}, "p2")
            await sub.wait_for_events(1)
            feed.put({"reject": True})  # fast mode: the reject is ignored, not counted
            feed.put({"n": 1})
            await fast.wait_for_events(1)
            await producer.wait_for_advanced(1)
            await anyio.wait_all_tasks_blocked()
            by_mode = {s.mode: s for s in mgr.stats()}
            assert by_mode["ack"].rejects == 1 and by_mode["fast"].rejects == 0
            assert [item.outcome.rejected for item in producer.advanced][:1] == [1]
            tg.cancel_scope.cancel()


async def test_refused_trigger_events_of_one_raw_event_count_one_reject():
    """The store refuses both trigger events a filter derived from one raw event: the ledger
    rejects the raw event once for that subscriber, and so does the counter."""
    with anyio.fail_after(5):
        producer = ProducerTrigger.producers["s"] = InMemoryProducer()
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            sub = start(tg, mgr, ProducerTrigger(source="s"), 1, auto_confirm=False)
            await producer.put({"copies": 2}, "p1")
            await sub.wait_for_events(2)
            assert len(sub.unconfirmed) == 2
            mgr.refuse_persisted([*sub.unconfirmed, 10**9])  # an unknown seq counts nothing
            await producer.wait_for_advanced(1)
            (item,) = producer.advanced
            assert (item.outcome.rejected, item.outcome.acked, item.outcome.failed) == (1, 0, 0)
            assert only(mgr).rejects == 1
            mgr.refuse_persisted(sub.unconfirmed)  # refused again (already released): no-op
            assert only(mgr).rejects == 1
            tg.cancel_scope.cancel()


async def test_a_departed_subscriber_whose_events_are_never_confirmed_counts_an_ack_timeout():
    with anyio.fail_after(5):
        clock = FakeClock(100.0)
        producer = ProducerTrigger.producers["s"] = InMemoryProducer()
        async with (
            SharedStreamManager(ack_timeout=10.0, clock=clock) as mgr,
            anyio.create_task_group() as tg,
        ):
            leaving = start(tg, mgr, ProducerTrigger(source="s"), 1, auto_confirm=False)
            staying = start(tg, mgr, ProducerTrigger(source="s"), 2)
            await producer.put({"n": 1}, "p1")
            await leaving.wait_for_events(1)
            await staying.wait_for_events(1)
            key = leaving.key
            await mgr.unsubscribe(1, key)  # left with a trigger event not confirmed yet
            await leaving.wait_finished()
            assert leaving.error is None and mgr.subscriber_count(key) == 1
            clock.advance(9.9)
            await mgr.check_timeouts()
            assert only(mgr).ack_timeouts == 0
            clock.advance(0.1)
            await mgr.check_timeouts()
            await producer.wait_for_advanced(1)
            (item,) = producer.advanced
            assert (item.outcome.acked, item.outcome.failed) == (1, 1)
            stats = only(mgr)
            assert (stats.ack_timeouts, stats.subscribers, stats.overflows) == (1, 1, 0)
            tg.cancel_scope.cancel()


async def test_the_current_queue_depth_goes_down_as_the_high_water_mark_stays():
    with anyio.fail_after(5):
        feed = FeedTrigger.feeds["s"] = InMemoryFeed()
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            slow = start(tg, mgr, FeedTrigger(source="s"), 1)
            quick = start(tg, mgr, FeedTrigger(source="s"), 2)
            slow.pause()
            for n in range(4):
                feed.put({"n": n})
            await quick.wait_for_events(4)
            await slow.wait_for_events(1)
            await anyio.wait_all_tasks_blocked()
            stats = only(mgr)
            high = stats.queue_high_water  # 4 when the fan-out ran before slow's first pull
            assert stats.queue_depth == 3 and high >= 3  # slow took one event and paused
            slow.resume()
            await slow.wait_for_events(4)
            await anyio.wait_all_tasks_blocked()
            stats = only(mgr)
            assert (stats.queue_depth, stats.queue_high_water) == (0, high)
            tg.cancel_scope.cancel()


# -- one snapshot per key: a draining group next to its replacement -----------------------


async def _drain_next_to_a_replacement(tg, mgr, old, new):
    """Group 1 of key ('ProducerTrigger', 's') drains (its advance blocked) while group 2,
    started for a new subscriber of the same key (a watcher restarted), polls ``new``."""
    ProducerTrigger.producers["s"] = old
    first = start(tg, mgr, ProducerTrigger(source="s"), 1, unsubscribe_on_exit=False)
    await old.put({"n": 1}, "old-1")
    await first.wait_for_events(1)
    await old.wait_blocked()  # resolved: its advance is in flight, blocked
    tg.start_soon(mgr.unsubscribe, 1, first.key)  # waits for the drain
    await first.wait_finished()
    assert mgr.group_keys == ()  # the old group stopped taking subscribers: it drains
    ProducerTrigger.producers["s"] = new
    second = start(tg, mgr, ProducerTrigger(source="s"), 2)
    await new.put({"n": 2}, "new-1")
    await new.put({"n": 3}, "new-2")
    await new.wait_for_advanced(2)
    await anyio.wait_all_tasks_blocked()
    return second


async def test_a_draining_group_and_its_replacement_are_one_snapshot():
    with anyio.fail_after(5):
        old, new = BlockingProducer(), InMemoryProducer()
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            await _drain_next_to_a_replacement(tg, mgr, old, new)
            stats = only(mgr)  # one entry: the database's primary key is (triggerer, key)
            assert stats.key == "('ProducerTrigger', 's')" and stats.mode == "ack"
            assert (stats.subscribers, stats.events_polled, stats.deliveries) == (1, 3, 3)
            assert stats.outstanding_by_lane == {"None": 1}  # the old group's, in flight
            new_batches = len(new.batches)
            assert (stats.advances, stats.advanced_events) == (new_batches, 2)
            assert stats.last_advance_batch == len(new.batches[-1])  # the newest group's
            old.release_all()
            tg.cancel_scope.cancel()


async def test_counters_of_a_finished_group_stay_while_its_key_has_a_live_group():
    """When the draining group finishes, its counters are kept for the key: no counter of
    the key goes down (Prometheus would see a reset) until no group of the key is left."""
    with anyio.fail_after(5):
        old, new = BlockingProducer(), InMemoryProducer()
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            second = await _drain_next_to_a_replacement(tg, mgr, old, new)
            during = only(mgr)
            old.release()
            await old.wait_closed()  # the old group advanced its event and finished
            await anyio.wait_all_tasks_blocked()
            after = only(mgr)
            assert (after.advances, after.advanced_events) == (during.advances + 1, 3)
            for name in ("events_polled", "deliveries", "rejects", "overflows", "ack_timeouts"):
                assert getattr(after, name) == getattr(during, name), name
            assert after.outstanding_by_lane == {} and after.subscribers == 1
            assert after.last_advance_batch == during.last_advance_batch  # the newest's
            await mgr.unsubscribe(2, second.key)  # the key's last group stops
            await anyio.wait_all_tasks_blocked()
            assert mgr.stats() == []
            ProducerTrigger.producers["s"] = InMemoryProducer()
            start(tg, mgr, ProducerTrigger(source="s"), 3)
            fresh = only(mgr)  # a new series for the key: its totals start again
            assert (fresh.events_polled, fresh.advances, fresh.advanced_events) == (0, 0, 0)
            tg.cancel_scope.cancel()


# -- the merge itself (pure) ----------------------------------------------------------------


def test_merge_adds_counters_and_backlogs_and_keeps_the_newest_mode_and_last_batch():
    older = GroupStats(
        key="k",
        mode="fast",
        subscribers=0,
        queue_high_water=5,
        queue_depth=4,
        outstanding_by_lane={"0": 2},
        oldest_unresolved_age_s=9.0,
        events_polled=7,
        advances=4,
        advanced_events=40,
        last_advance_batch=10,
        advance_latency_sum_s=1.0,
        ack_timeouts=1,
    )
    newer = GroupStats(
        key="k",
        mode="ack",
        subscribers=2,
        queue_high_water=3,
        queue_depth=1,
        outstanding_by_lane={"0": 1, "1": 6},
        oldest_unresolved_age_s=0.0,
        events_polled=1,
        advances=1,
        advanced_events=2,
        last_advance_batch=2,
        advance_latency_sum_s=0.5,
        rejects=3,
    )
    both = merge(older, newer)
    assert (both.mode, both.last_advance_batch) == ("ack", 2)
    assert (both.subscribers, both.queue_high_water, both.queue_depth) == (2, 5, 4)
    assert both.outstanding_by_lane == {"0": 3, "1": 6} and both.outstanding_events == 9
    assert both.oldest_unresolved_age_s == 9.0
    assert (both.events_polled, both.advances, both.advanced_events) == (8, 5, 42)
    assert both.advance_latency_sum_s == 1.5
    assert (both.ack_timeouts, both.rejects) == (1, 3)
    assert merge(retired(older), newer).outstanding_by_lane == newer.outstanding_by_lane
    assert merge_by_key([newer, GroupStats(key="a", mode="fast", subscribers=1)])[0].key == "a"
    with pytest.raises(ValueError, match="cannot merge"):
        merge(older, GroupStats(key="other", mode="ack", subscribers=1))


def test_busiest_lanes_are_bounded_busiest_first():
    lanes = {f"g{n:03}": n % 7 for n in range(100)}
    top = busiest_lanes(lanes)
    assert len(top) == REPORTED_LANES
    counts = [count for _, count in top]
    assert counts == sorted(counts, reverse=True) and min(counts) >= max(
        count for lane, count in lanes.items() if lane not in dict(top)
    )
    assert busiest_lanes({"b": 1, "a": 1, "c": 2}, limit=2) == [("c", 2), ("a", 1)]


# -- what each group reads, and what it sent the dead-letter way ---------------------------


class PlainKeyTrigger(FeedTrigger):
    """A key that is not a tuple led by a string: reports name the trigger class."""

    def shared_stream_key(self):
        return self.source


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (("kafka", "localhost:9092", "g", ("t",)), "kafka"),
        (("sqs", None, "https://q"), "sqs"),
        (("directory-scan", "/data"), "directory-scan"),
        ((1, "x"), "PlainKeyTrigger"),
        (("", "x"), "PlainKeyTrigger"),
        ((), "PlainKeyTrigger"),
        ("kafka", "PlainKeyTrigger"),  # a bare string is not a tuple led by the kind
        (None, "PlainKeyTrigger"),
    ],
)
def test_broker_kind_is_the_keys_leading_string_else_the_class_name(key, expected):
    assert broker_kind(key, PlainKeyTrigger) == expected


async def test_a_snapshot_names_the_broker_its_group_reads():
    with anyio.fail_after(5):
        FeedTrigger.feeds["b"] = InMemoryFeed()
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            start(tg, mgr, FeedTrigger(source="b"), 1)
            start(tg, mgr, PlainKeyTrigger(source="b"), 2)
            await anyio.wait_all_tasks_blocked()
            assert {s.key: s.broker for s in mgr.stats()} == {
                "('FeedTrigger', 'b')": "FeedTrigger",
                "'b'": "PlainKeyTrigger",
            }
            tg.cancel_scope.cancel()


async def test_rejected_events_count_as_dead_lettered_once_their_advance_returned():
    """A rejected event is counted where the group learns its advance returned (the
    producer has sent it its dead-letter way by then), once per raw event; a clean one and
    one still in flight are not."""
    with anyio.fail_after(5):
        producer = ProducerTrigger.producers["s"] = BlockingProducer()
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            start(tg, mgr, ProducerTrigger(source="s"), 1)
            start(tg, mgr, ProducerTrigger(source="s"), 2)  # both reject it: still one event
            await producer.put({"reject": True}, "p1")
            await producer.wait_blocked()
            stats = only(mgr)
            assert (stats.rejects, stats.dead_lettered) == (2, 0)  # refused, not advanced yet
            producer.release()
            await producer.wait_for_advanced(1)
            await anyio.wait_all_tasks_blocked()
            assert only(mgr).dead_lettered == 1
            await producer.put({"n": 2}, "p2")  # clean: advanced, not dead-lettered
            await producer.wait_blocked()
            producer.release()
            await producer.wait_for_advanced(2)
            await anyio.wait_all_tasks_blocked()
            stats = only(mgr)
            assert (stats.advanced_events, stats.rejects, stats.dead_lettered) == (2, 2, 1)
            tg.cancel_scope.cancel()


def test_merge_sums_dead_lettered_and_keeps_the_newest_broker():
    older = GroupStats(key="k", mode="ack", subscribers=0, broker="kafka", dead_lettered=4)
    newer = GroupStats(key="k", mode="ack", subscribers=1, broker="kafka", dead_lettered=1)
    both = merge(retired(older), newer)
    assert (both.broker, both.dead_lettered) == ("kafka", 5)
    assert merge_by_key([older, newer])[0].dead_lettered == 5
