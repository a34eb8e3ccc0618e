"""A shared stream under sustained traffic keeps no per-message state once messages advance.

The issue behind it: an engine's RSS rose ~5 bytes a message over 6M Kafka messages. A map
never pruned, a deque never popped or a stats label set that grows with the traffic would
show here as containers reachable from the manager that grow with the number of messages:
after K and after 2K messages through an ack-mode group (each trigger event confirmed, each
advanced), the total length of every list, dict, set and deque the manager reaches is the
same. The test's own records (the harness's events, the producer double's advance log) and
the event loop are outside the walk.
"""

from __future__ import annotations

import asyncio
import gc
import types
from collections import deque

import anyio

from shared_stream import SharedStreamManager
from shared_stream.testing import InMemoryProducer, SubscriberHarness
from tests.unit.shared_stream.test_manager import AckTrigger, register, start
from triggers.base import BaseEventTrigger

BATCH = 400
#: what the walk does not enter: the test doubles' own records, the loop, code and classes
_OPAQUE = (
    InMemoryProducer,
    SubscriberHarness,
    BaseEventTrigger,
    asyncio.AbstractEventLoop,
    asyncio.Task,
    asyncio.Future,
    types.ModuleType,
    types.FrameType,
    types.CoroutineType,
    types.FunctionType,
    types.CodeType,
    type,
)


def reachable_lengths(root: object) -> int:
    """The summed length of the containers reachable from ``root``."""
    seen: set[int] = {id(root)}
    todo = [root]
    total = 0
    while todo:
        obj = todo.pop()
        if isinstance(obj, (list, dict, set, frozenset, deque)):
            total += len(obj)
        for ref in gc.get_referents(obj):
            if id(ref) in seen or isinstance(ref, _OPAQUE):
                continue
            seen.add(id(ref))
            todo.append(ref)
    return total


async def _pass_messages(producer: InMemoryProducer, harness: SubscriberHarness, n: int) -> None:
    start_at = len(harness.events)
    for i in range(n):
        await producer.put({"n": start_at + i}, f"p{start_at + i}")
    await harness.wait_for_events(start_at + n)
    await producer.wait_for_advanced(start_at + n)
    await anyio.wait_all_tasks_blocked()


async def test_state_reachable_from_the_manager_does_not_grow_with_messages():
    with anyio.fail_after(20):
        producer = register("s", InMemoryProducer())
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            harness = start(tg, mgr, AckTrigger(source="s"), 1)
            await _pass_messages(producer, harness, BATCH)  # warm: first-use allocations
            after_k = reachable_lengths(mgr)
            await _pass_messages(producer, harness, BATCH)
            after_2k = reachable_lengths(mgr)
            await _pass_messages(producer, harness, 2 * BATCH)
            after_4k = reachable_lengths(mgr)
            assert after_k == after_2k == after_4k, (after_k, after_2k, after_4k)
            tg.cancel_scope.cancel()


async def test_the_walk_sees_a_map_that_grows_per_message(monkeypatch):
    """The control: a map the manager keeps per confirmed event makes the total grow."""
    confirm = SharedStreamManager.confirm_persisted

    def leaky_confirm(self, seqs):
        self.__dict__.setdefault("planted", {}).update(dict.fromkeys(seqs))
        return confirm(self, seqs)

    monkeypatch.setattr(SharedStreamManager, "confirm_persisted", leaky_confirm)
    with anyio.fail_after(20):
        producer = register("s", InMemoryProducer())
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            harness = start(tg, mgr, AckTrigger(source="s"), 1)
            await _pass_messages(producer, harness, BATCH)
            after_k = reachable_lengths(mgr)
            await _pass_messages(producer, harness, BATCH)
            assert reachable_lengths(mgr) >= after_k + BATCH
            tg.cancel_scope.cancel()
