"""A key's new group waits for the subscribers its failed predecessor had.

After an upstream failure every sibling watcher restarts, a few milliseconds apart. A
broker that reconnects faster than that would fan its first events out to the first ones
back only; in ack mode the group then advances past them, and the late siblings never see
them. The new group's first poll waits until the whole cohort is back (bounded).
"""

from __future__ import annotations

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
