"""A producer that raises a CancelledError nobody asked for must not end the manager.

aiokafka's ``stop()`` awaits a background task it cancelled itself and re-raises its
``CancelledError``: let out of a group's task, it cancelled the manager's task group, whose
``run()`` then returned in silence; every later subscribe was refused (``ManagerNotRunning``)
while the triggerer ran on (found by the conformance kit's ``broker_restart[kafka]``).
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from shared_stream import SharedStreamManager
from shared_stream.exceptions import SharedStreamTerminated
from shared_stream.testing import InMemoryProducer, SubscriberHarness
from tests.unit.shared_stream.test_cancellation import AckTrigger


class StrayCancelOnClose(InMemoryProducer):
    """``aclose`` awaits a task it cancelled, as aiokafka's ``stop()`` does."""

    async def aclose(self) -> None:
        await super().aclose()
        inner = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        await asyncio.sleep(0)
        inner.cancel()
        await inner  # raises CancelledError here: this task was never cancelled


@pytest.fixture(autouse=True)
def _registry():
    AckTrigger.producers.clear()


async def test_a_stray_cancel_fails_the_group_not_the_manager() -> None:
    with anyio.fail_after(5):
        failing = StrayCancelOnClose(fail_advance=RuntimeError("connection lost"))
        again = InMemoryProducer()
        AckTrigger.producers.extend([failing, again])
        async with anyio.create_task_group() as tg:
            mgr = SharedStreamManager()
            await tg.start(mgr.run)
            first = SubscriberHarness(mgr, AckTrigger(), trigger_id=1)
            tg.start_soon(first.run)
            await failing.put({"n": 1}, "p1")
            await first.wait_finished()  # the group failed
            await anyio.wait_all_tasks_blocked()  # its producer closed (the stray cancel)
            assert failing.aclose_count == 1
            back = SubscriberHarness(mgr, AckTrigger(), trigger_id=1)  # not ManagerNotRunning
            tg.start_soon(back.run)
            await again.put({"n": 2}, "p2")
            await back.wait_for_events(1)
            assert back.payloads == [{"n": 2}]
            await mgr.aclose()
            tg.cancel_scope.cancel()


async def test_a_stray_cancel_while_polling_fails_the_subscribers() -> None:
    class StrayCancelOnOpen(InMemoryProducer):
        async def open_stream(self):  # type: ignore[override]
            inner = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
            await asyncio.sleep(0)
            inner.cancel()
            await inner
            yield  # pragma: no cover - never reached

    with anyio.fail_after(5):
        AckTrigger.producers.append(StrayCancelOnOpen())
        async with anyio.create_task_group() as tg:
            mgr = SharedStreamManager()
            await tg.start(mgr.run)
            harness = SubscriberHarness(mgr, AckTrigger(), trigger_id=1)
            tg.start_soon(harness.run)
            await harness.wait_finished()
            assert isinstance(harness.error, SharedStreamTerminated), harness.error
            assert repr(mgr).count("running=True") == 1
            await mgr.aclose()
            tg.cancel_scope.cancel()
