"""A key's new group waits for the subscribers its failed predecessor had.

After an upstream failure every sibling watcher restarts, a few milliseconds apart. A
broker that reconnects faster than that would fan its first events out to the first ones
back only; in ack mode the group then advances past them, and the late siblings never see
them. The new group's first poll waits until the whole cohort is back (bounded).

The same holds within a group: one sibling fails (its filter raised, an ack timeout), the
events it had fail and the broker redelivers them at once. Fanned out while it restarts,
they would reach its siblings only, and be acked by them: that watcher would never see
them. The group fans nothing out until it is back (bounded too).
"""

from __future__ import annotations

import logging

import anyio
import pytest

from shared_stream import SharedStreamManager
from shared_stream.testing import InMemoryProducer, SubscriberHarness
from tests.unit.shared_stream.test_cancellation import AckTrigger


@pytest.fixture(autouse=True)
def _registry():
    AckTrigger.producers.clear()


async def test_the_next_group_waits_for_every_sibling_of_the_failed_one() -> None:
    with anyio.fail_after(5):
        failing = InMemoryProducer(fail_advance=RuntimeError("connection lost"))
        again = InMemoryProducer()
        AckTrigger.producers.extend([failing, again])
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            first = [SubscriberHarness(mgr, AckTrigger(), trigger_id=i) for i in (1, 2, 3)]
            for harness in first:
                tg.start_soon(harness.run)
            await failing.put({"n": 1}, "p1")
            for harness in first:
                await harness.wait_finished()  # every sibling failed with the group
            await again.put({"n": 2}, "p2")  # the upstream has an event the moment it opens
            back = [SubscriberHarness(mgr, AckTrigger(), trigger_id=i) for i in (1, 2)]
            for harness in back:
                tg.start_soon(harness.run)
            await anyio.wait_all_tasks_blocked()  # the third sibling's restart comes later
            late = SubscriberHarness(mgr, AckTrigger(), trigger_id=3)
            tg.start_soon(late.run)
            for harness in [*back, late]:
                await harness.wait_for_events(1)
                assert harness.payloads == [{"n": 2}]
            await again.wait_for_advanced(1)
            tg.cancel_scope.cancel()


def outcomes(producer: InMemoryProducer) -> list[tuple[object, tuple[int, int, int]]]:
    return [(p, (o.acked, o.failed, o.rejected)) for p, o in producer.advanced]


async def test_what_a_failed_sibling_had_waits_for_its_restart() -> None:
    with anyio.fail_after(5):
        producer = InMemoryProducer()
        AckTrigger.producers.append(producer)
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            steady = SubscriberHarness(mgr, AckTrigger(), trigger_id=1)
            failing = SubscriberHarness(
                mgr, AckTrigger(), trigger_id=2, auto_confirm=False, unsubscribe_on_exit=False
            )
            for harness in (steady, failing):
                tg.start_soon(harness.run)
            await producer.put({"n": 1}, "delivery-1")
            await failing.wait_for_events(1)
            await steady.wait_for_events(1)
            await mgr.unsubscribe(2, failing.key, failed=True)  # its filter raised
            await producer.wait_for_advanced(1)
            assert outcomes(producer) == [("delivery-1", (1, 1, 0))]  # redelivered
            await producer.put({"n": 1}, "delivery-2")  # the broker's redelivery, at once
            await anyio.wait_all_tasks_blocked()
            assert steady.payloads == [{"n": 1}]  # held while its sibling is away
            assert producer.advanced_count == 1
            back = SubscriberHarness(mgr, AckTrigger(), trigger_id=2)  # the restart
            tg.start_soon(back.run)
            await back.wait_for_events(1)
            await steady.wait_for_events(2)
            await producer.wait_for_advanced(2)
            assert back.payloads == [{"n": 1}]
            assert outcomes(producer)[1] == ("delivery-2", (2, 0, 0))
            tg.cancel_scope.cancel()


async def sibling_leaves(*, failed: bool, cohort_return: float) -> tuple[float, list[object]]:
    """Two siblings see a first event; the second leaves (``failed``, or cleanly) and never
    comes back; then a second event. How long after the departure the steady sibling got
    it, and the advanced outcomes."""
    with anyio.fail_after(5):
        producer = InMemoryProducer()
        AckTrigger.producers.append(producer)
        async with (
            SharedStreamManager(cohort_return=cohort_return) as mgr,
            anyio.create_task_group() as tg,
        ):
            steady = SubscriberHarness(mgr, AckTrigger(), trigger_id=1)
            leaving = SubscriberHarness(mgr, AckTrigger(), trigger_id=2, unsubscribe_on_exit=False)
            for harness in (steady, leaving):
                tg.start_soon(harness.run)
            await producer.put({"n": 1}, "first")
            await producer.wait_for_advanced(1)
            await mgr.unsubscribe(2, leaving.key, failed=failed)
            left_at = anyio.current_time()
            await producer.put({"n": 2}, "second")
            await steady.wait_for_events(2)
            waited = anyio.current_time() - left_at
            await producer.wait_for_advanced(2)
            tg.cancel_scope.cancel()
    return waited, list(outcomes(producer))


async def test_a_failed_sibling_not_back_in_time_holds_the_others_that_long_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="shared_stream.group")
    waited, advanced = await sibling_leaves(failed=True, cohort_return=0.2)
    assert waited >= 0.2
    assert advanced[1] == ("second", (1, 0, 0))
    assert any(
        getattr(r, "action", None) == "shared_stream.cohort_incomplete"
        and "goes on without trigger(s) [2]" in r.getMessage()
        for r in caplog.records
    )


async def test_a_clean_unsubscribe_holds_nothing() -> None:
    # removed (its DAG was deleted, say): held for it, the helper's 5 s bound would fail
    waited, advanced = await sibling_leaves(failed=False, cohort_return=60.0)
    assert waited < 5 and advanced[1] == ("second", (1, 0, 0))
