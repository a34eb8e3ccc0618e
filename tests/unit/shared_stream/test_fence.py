"""Fencing: a manager whose owner lost its lease never advances a broker again.

``may_advance`` is asked right before every ``producer.advance``: refused, the group ends
and nothing is advanced (the broker redelivers). ``fence()`` calls every producer's
``fence()`` synchronously (a Kafka consumer leaves its group at once), ends every group,
and refuses new subscriptions.
"""

from __future__ import annotations

import anyio
import pytest

from shared_stream import SharedStreamManager
from shared_stream.exceptions import ManagerNotRunning, SharedStreamFenced
from shared_stream.testing import InMemoryProducer, SubscriberHarness
from tests.unit.shared_stream.test_cancellation import KEY, AckTrigger


@pytest.fixture(autouse=True)
def _registry():
    AckTrigger.producers.clear()


async def test_an_advance_waits_while_the_lease_is_not_held() -> None:
    holds = True
    with anyio.fail_after(5):
        producer = InMemoryProducer()
        AckTrigger.producers.append(producer)
        async with SharedStreamManager(may_advance=lambda: holds) as mgr:
            harness = SubscriberHarness(mgr, AckTrigger(), trigger_id=1)
            async with anyio.create_task_group() as tg:
                tg.start_soon(harness.run)
                await producer.put({"n": 1}, "p1")
                await producer.wait_for_advanced(1)  # held: advanced as usual
                holds = False
                await producer.put({"n": 2}, "p2")
                await harness.wait_for_events(2)
                await anyio.sleep(0.2)  # several polls of the lease: none advanced
                assert producer.advanced_payloads == ["p1"]
                holds = True  # a slow heartbeat got through
                await producer.wait_for_advanced(2)
                tg.cancel_scope.cancel()
            assert [b[0].broker_payload for b in producer.attempted_batches] == ["p1", "p2"]


async def test_fence_stops_every_producer_at_once_and_refuses_subscriptions() -> None:
    with anyio.fail_after(5):
        producer = InMemoryProducer()
        AckTrigger.producers.append(producer)
        async with SharedStreamManager() as mgr:
            harness = SubscriberHarness(mgr, AckTrigger(), trigger_id=1, auto_confirm=False)
            async with anyio.create_task_group() as tg:
                tg.start_soon(harness.run)
                await producer.put({"n": 1}, "p1")
                await harness.wait_for_events(1)
                mgr.fence("job 7 is no longer running")
                assert producer.fence_count == 1  # synchronously, before anything else ran
                assert mgr.fenced == "job 7 is no longer running"
                harness.confirm_all()  # stored after all: still never advanced
                await producer.wait_closed()
            assert producer.attempted_batches == []
            assert isinstance(harness.error, SharedStreamFenced)
            with pytest.raises(ManagerNotRunning, match="lost its lease"):
                mgr.subscribe(trigger_id=2, trigger=AckTrigger(), key=KEY)
