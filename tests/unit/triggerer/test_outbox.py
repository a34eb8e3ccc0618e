from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.states import TriggerKind
from engine.triggerer.outbox import FiredEvent, Outbox, TriggerFailed
from triggers.base import TriggerEvent


def fired(trigger_id: int, payload: object = None) -> FiredEvent:
    return FiredEvent(trigger_id, TriggerEvent(payload), None, 0.0)


async def test_get_batch_is_fifo_and_respects_max_items():
    with anyio.fail_after(5):
        outbox = Outbox()
        items = [fired(i) for i in range(7)]
        for item in items:
            outbox.put_nowait(item)
        assert len(outbox) == 7
        assert await outbox.get_batch(3) == items[:3]
        assert await outbox.get_batch(3) == items[3:6]
        assert await outbox.get_batch(3) == items[6:]
        assert len(outbox) == 0


async def test_get_batch_returns_everything_waiting_in_one_batch():
    with anyio.fail_after(5):
        outbox = Outbox()
        failure = TriggerFailed(2, TriggerKind.TASK, "boom", None, will_restart=False)
        outbox.put_nowait(fired(1))
        outbox.put_nowait(failure)
        assert await outbox.get_batch() == [fired(1), failure]


async def test_get_batch_returns_at_once_when_items_wait():
    # No scheduling point: a task started just before has not run yet when it returns.
    with anyio.fail_after(5):
        outbox = Outbox()
        outbox.put_nowait(fired(1))
        ran: list[bool] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _append(ran))
            batch = await outbox.get_batch()
            assert ran == []
        assert batch == [fired(1)]
        assert ran == [True]


async def _append(target: list[bool]) -> None:
    target.append(True)


async def test_waiting_consumer_wakes_on_put():
    with anyio.fail_after(5):
        outbox = Outbox()
        received: list[object] = []

        async def consume() -> None:
            received.extend(await outbox.get_batch())

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            assert received == []
            assert "waiting=True" in repr(outbox)
            outbox.put_nowait(fired(5))
        assert received == [fired(5)]


async def test_close_wakes_a_waiting_consumer_with_an_empty_batch():
    with anyio.fail_after(5):
        outbox = Outbox()
        batches: list[list[object]] = []

        async def consume() -> None:
            batches.append(list(await outbox.get_batch()))

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            outbox.close()
        assert batches == [[]]
        assert outbox.closed


async def test_close_drains_what_is_left_then_returns_empty():
    with anyio.fail_after(5):
        outbox = Outbox()
        outbox.put_nowait(fired(1))
        outbox.close()
        outbox.put_nowait(fired(2))  # a late event is still delivered, never dropped
        assert await outbox.get_batch(1) == [fired(1)]
        assert await outbox.get_batch() == [fired(2)]
        assert await outbox.get_batch() == []
        assert "closed" in repr(outbox)


async def test_get_batch_rejects_a_non_positive_max():
    outbox = Outbox()
    with pytest.raises(ValueError, match="max_items"):
        await outbox.get_batch(0)


async def test_cancelled_get_batch_leaves_items_for_the_next_call():
    with anyio.fail_after(5):
        outbox = Outbox()
        with anyio.CancelScope() as scope:
            scope.cancel()
            outbox.put_nowait(fired(1))
            await outbox.get_batch()
        assert len(outbox) == 1
        assert await outbox.get_batch() == [fired(1)]


@given(st.lists(st.one_of(st.none(), st.integers(1, 5)), max_size=40))
def test_batches_preserve_order_and_lose_nothing(script: list[int | None]) -> None:
    """None puts the next item; n takes a batch of at most n (when items are queued)."""

    async def play() -> tuple[list[int], list[int]]:
        outbox = Outbox()
        put: list[int] = []
        got: list[int] = []
        for step in script:
            if step is None:
                put.append(len(put))
                outbox.put_nowait(fired(put[-1]))
            elif len(outbox):
                batch = await outbox.get_batch(step)
                assert 1 <= len(batch) <= step
                got.extend(item.trigger_id for item in batch)
        outbox.close()
        while batch := await outbox.get_batch():
            got.extend(item.trigger_id for item in batch)
        return put, got

    put, got = anyio.run(play)
    assert got == put
