"""An idle time trigger waits on a loop timer, not in a task, and behaves as before."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio

from engine.logs import ContextFields
from engine.triggerer.outbox import FiredEvent, Outbox
from engine.triggerer.runtime import TriggerKind, TriggerRunner, TriggerSpec
from tests.waiting import wait_until
from triggers import DateTimeTrigger, TimeDeltaTrigger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

LATER = timedelta(hours=1)


@asynccontextmanager
async def running() -> AsyncIterator[tuple[TriggerRunner, Outbox]]:
    outbox = Outbox()
    runner = TriggerRunner(outbox=outbox)
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        yield runner, outbox
        await runner.aclose(grace_s=1.0)


def tasks_of(trigger_id: int) -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(f"trigger {trigger_id} ")]


class CleaningTrigger(DateTimeTrigger):
    """A time trigger with a cleanup of its own: it must run (and clean up) in a task."""

    __slots__ = ("cleaned",)

    def __init__(self, moment: datetime) -> None:
        super().__init__(moment)
        self.cleaned = anyio.Event()

    async def cleanup(self) -> None:
        self.cleaned.set()


async def test_an_idle_time_trigger_has_a_timer_and_no_task_until_stopped() -> None:
    with anyio.fail_after(5):
        async with running() as (runner, _outbox):
            trigger = TimeDeltaTrigger(LATER)
            runner.start(TriggerSpec(1, trigger, TriggerKind.TASK))
            await anyio.lowlevel.checkpoint()
            assert 1 in runner and len(runner) == 1 and runner.running_ids() == {1}
            assert trigger.trigger_id == 1
            assert tasks_of(1) == []
            assert "waiting" in repr(runner._handles[1])
            runner.stop(1, kill=True)
            assert 1 not in runner and len(runner) == 0


async def test_a_due_time_trigger_fires_from_its_task_with_its_log_fields(caplog) -> None:
    caplog.handler.addFilter(ContextFields())
    caplog.set_level(logging.INFO, logger="engine.triggerer.runtime")
    with anyio.fail_after(5):
        async with running() as (runner, outbox):
            moment = datetime.now(UTC) + timedelta(milliseconds=30)
            spec = TriggerSpec(7, DateTimeTrigger(moment), TriggerKind.TASK, {"dag_id": "d"})
            runner.start(spec)
            assert tasks_of(7) == []
            [item] = await outbox.get_batch(1)
            assert isinstance(item, FiredEvent) and item.trigger_id == 7
            assert item.event.payload == moment
            await wait_until(lambda: 7 not in runner)
    fired = [r for r in caplog.records if getattr(r, "action", None) == "trigger_fired"]
    assert [(r.trigger_id, r.dag_id) for r in fired] == [(7, "d")]  # type: ignore[attr-defined]


async def test_a_time_trigger_with_its_own_cleanup_runs_in_a_task_and_cleans_up() -> None:
    with anyio.fail_after(5):
        async with running() as (runner, _outbox):
            trigger = CleaningTrigger(datetime.now(UTC) + LATER)
            runner.start(TriggerSpec(3, trigger, TriggerKind.TASK))
            assert tasks_of(3) != []
            await wait_until(lambda: trigger.trigger_id == 3)  # its task set it, and runs
            runner.stop(3)
            await trigger.cleaned.wait()
            await wait_until(lambda: 3 not in runner)


async def test_shutdown_cancels_the_timers_of_idle_triggers() -> None:
    with anyio.fail_after(5):
        async with running() as (runner, _outbox):
            for trigger_id in range(1, 1001):
                runner.start(TriggerSpec(trigger_id, TimeDeltaTrigger(LATER), TriggerKind.TASK))
            handles = list(runner._handles.values())
            assert all(h.is_waiting for h in handles)
            await runner.aclose(grace_s=1.0)
            assert len(runner) == 0
            assert all(h.timer is None and h.stopping for h in handles)


async def test_a_trigger_started_again_after_its_stop_waits_on_a_new_timer() -> None:
    with anyio.fail_after(5):
        async with running() as (runner, _outbox):
            runner.start(TriggerSpec(5, TimeDeltaTrigger(LATER), TriggerKind.TASK))
            first = runner._handles[5]
            runner.stop(5)
            runner.start(TriggerSpec(5, TimeDeltaTrigger(LATER), TriggerKind.TASK))
            second = runner._handles[5]
            assert second is not first and second.is_waiting and not first.is_waiting
