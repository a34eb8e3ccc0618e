"""Cancellation paths of the shared-stream manager (httpcore ``test_cancellations`` style).

Each test parks something forever (an advance, a subscriber, a confirmation), cancels or
stops around it, and checks that it ends within a bound and leaves no bookkeeping behind.
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import pytest

from shared_stream import AckTimeout, SharedStreamManager
from shared_stream.testing import BlockingProducer, InMemoryProducer, SubscriberHarness
from triggers.base import BaseEventTrigger, TriggerEvent, classpath_of

KEY = ("cancel", "s")
GRACE_S = 0.2


class AckTrigger(BaseEventTrigger):
    producers: ClassVar[list[InMemoryProducer]] = []
    factory_calls: ClassVar[int] = 0

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {}

    async def run(self):
        yield TriggerEvent({})

    def shared_stream_key(self):
        return KEY

    @classmethod
    def create_shared_stream_producer(cls, kwargs):
        cls.factory_calls += 1
        return cls.producers.pop(0)

    async def filter_shared_stream(self, shared_stream):
        async for raw in shared_stream:
            yield TriggerEvent(raw)


@pytest.fixture(autouse=True)
def _registry():
    AckTrigger.producers.clear()
    AckTrigger.factory_calls = 0


def start(tg, mgr, trigger_id, **kwargs) -> SubscriberHarness:
    harness = SubscriberHarness(mgr, AckTrigger(), trigger_id=trigger_id, **kwargs)
    tg.start_soon(harness.run)
    return harness


def assert_clean(mgr: SharedStreamManager) -> None:
    assert mgr.pending_confirmations == 0
    assert mgr.group_keys == ()
    assert "live=0" in repr(mgr)


async def test_last_unsubscribe_during_a_blocked_advance_is_bounded():
    with anyio.fail_after(5):
        producer = BlockingProducer()
        AckTrigger.producers.append(producer)
        async with (
            SharedStreamManager(stop_grace_period=GRACE_S) as mgr,
            anyio.create_task_group() as tg,
        ):
            harness = start(tg, mgr, 1, unsubscribe_on_exit=False)
            await producer.put({"n": 1}, "p1")
            await producer.wait_blocked()  # never released
            started = anyio.current_time()
            await mgr.unsubscribe(1, KEY)
            assert anyio.current_time() - started < GRACE_S + 1.0
            assert producer.cancelled_advances == 1
            assert producer.aclose_count == 1
            assert producer.batches == []
            await harness.wait_finished()
            assert_clean(mgr)


async def test_stop_all_during_a_blocked_advance_is_bounded():
    with anyio.fail_after(5):
        producer = BlockingProducer()
        AckTrigger.producers.append(producer)
        async with (
            SharedStreamManager(stop_grace_period=GRACE_S) as mgr,
            anyio.create_task_group() as tg,
        ):
            start(tg, mgr, 1)
            await producer.put({"n": 1}, "p1")
            await producer.wait_blocked()
            await mgr.stop_all()
            assert producer.cancelled_advances == 1
            assert producer.aclose_count == 1
            assert_clean(mgr)


async def test_unsubscribe_with_a_pending_confirmation_still_counts_it():
    with anyio.fail_after(5):
        producer = InMemoryProducer()
        AckTrigger.producers.append(producer)
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            leaving = start(tg, mgr, 1, auto_confirm=False)
            staying = start(tg, mgr, 2)
            await producer.put({"n": 1}, "p1")
            await leaving.wait_for_events(1)
            await staying.wait_for_events(1)
            await mgr.unsubscribe(1, KEY)  # its trigger event is still being persisted
            await leaving.wait_finished()
            await anyio.wait_all_tasks_blocked()
            assert producer.attempted_batches == []
            assert mgr.pending_confirmations == 1
            leaving.confirm_all()
            await producer.wait_for_advanced(1)
            outcome = producer.advanced[0].outcome
            assert (outcome.acked, outcome.failed, outcome.is_clean) == (2, 0, True)
            assert mgr.pending_confirmations == 0
            tg.cancel_scope.cancel()
        assert_clean(mgr)


async def test_last_unsubscribe_with_a_pending_confirmation_abandons_the_event():
    with anyio.fail_after(5):
        producer = InMemoryProducer()
        AckTrigger.producers.append(producer)
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            harness = start(tg, mgr, 1, auto_confirm=False, unsubscribe_on_exit=False)
            await producer.put({"n": 1}, "p1")
            await harness.wait_for_events(1)
            await mgr.unsubscribe(1, KEY)
            assert producer.aclose_count == 1
            harness.confirm_all()  # arrives after the group stopped: ignored
            assert producer.attempted_batches == []
            assert_clean(mgr)


async def test_cancelled_subscriber_task_unsubscribes_and_stops_the_group():
    with anyio.fail_after(5):
        producer = InMemoryProducer()
        AckTrigger.producers.append(producer)
        async with SharedStreamManager() as mgr:
            harness = SubscriberHarness(mgr, AckTrigger(), trigger_id=1)
            async with anyio.create_task_group() as tg:
                tg.start_soon(harness.run)
                await producer.put({"n": 1}, "p1")
                await producer.wait_for_advanced(1)  # waiting in the raw stream now
                tg.cancel_scope.cancel()  # its finally unsubscribes from a cancelled scope
            assert harness.finished
            await producer.wait_closed()  # the group drained and closed in its own task
            assert producer.aclose_count == 1
            assert_clean(mgr)


async def test_cancelling_run_closes_the_producer_once():
    with anyio.fail_after(5):
        producer = BlockingProducer()
        AckTrigger.producers.append(producer)
        mgr = SharedStreamManager()
        async with anyio.create_task_group() as tg:
            await tg.start(mgr.run)
            mgr.subscribe(trigger_id=1, trigger=AckTrigger(), key=KEY)
            await producer.put({"n": 1}, "p1")
            await producer.wait_opened()
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert producer.aclose_count == 1


async def test_stop_during_the_cohort_grace_period_never_opens_the_producer():
    with anyio.fail_after(5):
        producer = InMemoryProducer()
        AckTrigger.producers.append(producer)
        async with SharedStreamManager(cohort_grace_period=60.0) as mgr:
            mgr.subscribe(trigger_id=1, trigger=AckTrigger(), key=KEY)
            await anyio.wait_all_tasks_blocked()
            await mgr.unsubscribe(1, KEY)
            assert AckTrigger.factory_calls == 0
            assert producer.open_count == producer.aclose_count == 0
            assert_clean(mgr)


async def test_group_timer_fails_a_stalled_subscriber_on_the_real_clock():
    with anyio.fail_after(5):
        producer = InMemoryProducer()
        AckTrigger.producers.append(producer)
        async with SharedStreamManager(ack_timeout=0.05) as mgr, anyio.create_task_group() as tg:
            stalled = start(tg, mgr, 1, auto_confirm=False)
            await producer.put({"n": 1}, "p1")
            await stalled.wait_finished()  # the group's timer fired without any help
            assert isinstance(stalled.error, AckTimeout)
            await producer.wait_for_advanced(1)
            assert producer.advanced[0].outcome.failed == 1
        assert_clean(mgr)


async def test_outer_cancellation_right_after_subscribe_does_not_hang():
    with anyio.fail_after(5):
        AckTrigger.producers.append(InMemoryProducer())
        with anyio.CancelScope() as outer:
            async with SharedStreamManager(stop_grace_period=GRACE_S) as mgr:
                mgr.subscribe(trigger_id=1, trigger=AckTrigger(), key=KEY)
                outer.cancel()  # the group's task is cancelled before it ever runs
                await anyio.sleep_forever()
        assert outer.cancelled_caught
        assert mgr.group_keys == ()


async def test_drain_advances_are_shielded_from_cancellation_within_the_grace_period():
    with anyio.fail_after(5):
        producer = BlockingProducer()
        AckTrigger.producers.append(producer)
        mgr = SharedStreamManager(stop_grace_period=4.0)
        cancelled = anyio.Event()

        async def release_after_cancellation() -> None:
            await cancelled.wait()
            await anyio.wait_all_tasks_blocked()  # the cancellation reached the group
            producer.release()

        async with anyio.create_task_group() as top:
            top.start_soon(release_after_cancellation)
            async with anyio.create_task_group() as tg:
                await tg.start(mgr.run)
                harness = start(tg, mgr, 1, unsubscribe_on_exit=False)
                await producer.put({"n": 1}, "p1")
                await producer.wait_blocked()
                await producer.put({"n": 2}, "p2")
                await harness.wait_for_events(2)  # p2 resolved, waiting behind p1
                tg.start_soon(mgr.stop_all)
                await anyio.wait_all_tasks_blocked()
                producer.release()  # p1 completes; p2 is the drain's final advance
                await producer.wait_for(lambda: len(producer.attempted_batches) == 2)
                cancelled.set()
                tg.cancel_scope.cancel()  # hard stop while the final advance is blocked
        assert [[p for p, _ in b] for b in producer.batches] == [["p1"], ["p2"]]
        assert producer.cancelled_advances == 0
        assert producer.aclose_count == 1
