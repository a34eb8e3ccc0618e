from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from engine.triggerer import watchdog as watchdog_module
from engine.triggerer.outbox import FiredEvent, Outbox
from engine.triggerer.runtime import TriggerKind, TriggerRunner, TriggerSpec
from engine.triggerer.watchdog import LoopBlocked, LoopWatchdog
from triggers.base import BaseTrigger, TriggerEvent, classpath_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

THRESHOLD_S = 0.15
BLOCK_S = 0.45


class BlockingTrigger(BaseTrigger):
    """Makes the mistake the watchdog is for: a blocking call inside ``run()``."""

    def __init__(self, block_s: float) -> None:
        super().__init__()
        self.block_s = block_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {"block_s": self.block_s}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await anyio.lowlevel.checkpoint()
        time.sleep(self.block_s)  # noqa: ASYNC251 - the blocking call under test
        yield TriggerEvent("done")


def blocked_records(caplog: pytest.LogCaptureFixture) -> list[Any]:
    return [r for r in caplog.records if getattr(r, "action", None) == "loop_blocked"]


async def test_a_blocking_trigger_is_named_in_the_warning(caplog):
    caplog.set_level(logging.WARNING, logger="engine.triggerer.watchdog")
    seen: list[LoopBlocked] = []
    watchdog = LoopWatchdog(THRESHOLD_S, on_block=seen.append)
    outbox = Outbox()
    runner = TriggerRunner(outbox=outbox)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(watchdog.run)
            await tg.start(runner.run)
            runner.start(TriggerSpec(42, BlockingTrigger(BLOCK_S), TriggerKind.TASK))
            [item] = await outbox.get_batch()
            assert isinstance(item, FiredEvent)
            await runner.aclose(grace_s=1.0)
            tg.cancel_scope.cancel()
    [record] = blocked_records(caplog)
    assert record.levelno == logging.WARNING
    assert record.trigger_id == 42
    assert record.culprit == classpath_of(BlockingTrigger)
    assert record.count == 1
    assert THRESHOLD_S <= record.blocked_s < BLOCK_S + 0.1
    assert "trigger 42" in record.getMessage()
    assert "triggers must not make blocking calls" in record.getMessage()
    here = record.where.split("; other threads running")[0]  # busy threads, if any, follow
    assert here.startswith("tests/unit/triggerer/test_watchdog.py:") and here.endswith(" in run")
    assert watchdog.blocked_count == 1
    assert [(b.trigger_id, b.count) for b in seen] == [(42, 1)]


async def test_a_block_outside_any_trigger_names_the_running_task(caplog):
    caplog.set_level(logging.WARNING, logger="engine.triggerer.watchdog")
    watchdog = LoopWatchdog(THRESHOLD_S)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(watchdog.run)

            async def engine_chore() -> None:
                time.sleep(BLOCK_S)  # noqa: ASYNC251 - the blocking call under test

            tg.start_soon(engine_chore, name="engine chore")
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    [record] = blocked_records(caplog)
    assert record.trigger_id is None
    assert "engine chore" in record.culprit
    # says what was on the stack, and blames no trigger: none was running
    here = record.where.split("; other threads running")[0]
    assert here.startswith("tests/unit/triggerer/test_watchdog.py:")
    assert here.endswith(" in engine_chore")
    assert record.where in record.getMessage()
    assert "no trigger on the stack" in record.getMessage()
    assert "triggers must not" not in record.getMessage()


async def test_a_block_in_a_shared_stream_poll_advises_its_producer(caplog):
    records = await _watch_a_block(
        caplog, lambda: time.sleep(4 * THRESHOLD_S), name="shared-stream-poll[('Kafka', 'g')]"
    )
    [record] = records
    assert record.trigger_id is None
    assert "a shared stream's producer must not make blocking calls" in record.getMessage()
    assert "triggers must not" not in record.getMessage()


def test_a_loop_between_callbacks_names_the_threads_that_ran(monkeypatch):
    """The loop thread shows only the event loop's own code (it waited for the GIL): the
    warning names the other threads running Python code, not the process's main."""
    captured: dict[str, Any] = {}

    def callback() -> None:  # its caller: asyncio's Handle._run, inside _run_once
        captured["loop"] = sys._getframe().f_back

    def crunch() -> None:
        captured["busy"] = sys._getframe()

    async def main() -> None:
        asyncio.get_running_loop().call_soon(callback)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    crunch()
    loop_thread, busy_thread = -1, -2
    frames = {loop_thread: captured["loop"], busy_thread: captured["busy"]}
    monkeypatch.setattr(
        watchdog_module, "sys", SimpleNamespace(_current_frames=lambda: frames, path=sys.path)
    )
    watchdog = LoopWatchdog(THRESHOLD_S)
    watchdog._loop_thread_id = loop_thread
    where = watchdog._where()
    assert where.startswith(
        "the event loop's own code (waiting for the GIL?; other threads running: "
        "-2 at tests/unit/triggerer/test_watchdog.py:"
    )
    assert where.endswith(" in crunch)")


async def test_a_loop_that_never_blocks_gets_no_warning(caplog):
    caplog.set_level(logging.WARNING, logger="engine.triggerer.watchdog")
    watchdog = LoopWatchdog(THRESHOLD_S)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(watchdog.run)
            assert "running" in repr(watchdog)
            # The checks happen on the watchdog's thread: no event to wait on, poll the count.
            while watchdog.checks < 8:  # noqa: ASYNC110
                await anyio.sleep(THRESHOLD_S / 8)
            tg.cancel_scope.cancel()
    assert blocked_records(caplog) == []
    assert watchdog.blocked_count == 0
    assert "stopped" in repr(watchdog)


class StallingClock:
    """``time.monotonic`` that jumps ``stall_s`` at the watchdog thread's next read: the
    process was held up that long (CPU quota, descheduled) and, at the resume, the watchdog
    thread ran before the loop could stamp. A stall is not a blocked loop."""

    def __init__(self) -> None:
        self.offset_s = 0.0
        self._stall_s = 0.0
        self.stalled = threading.Event()

    def stall(self, stall_s: float) -> None:
        self._stall_s = stall_s

    def monotonic(self) -> float:
        if self._stall_s and threading.current_thread().name == "sluice-loop-watchdog":
            self.offset_s, self._stall_s = self.offset_s + self._stall_s, 0.0
            self.stalled.set()
        return time.monotonic() + self.offset_s


async def test_a_stalled_process_is_not_reported_as_a_blocked_loop(caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="engine.triggerer.watchdog")
    clock = StallingClock()
    monkeypatch.setattr(
        watchdog_module,
        "time",
        SimpleNamespace(monotonic=clock.monotonic, process_time=time.process_time),
    )
    watchdog = LoopWatchdog(THRESHOLD_S)

    def wait_for_checks(count: int) -> None:  # off the loop: it stays idle meanwhile
        assert clock.stalled.wait(5)
        while watchdog.checks < count:
            time.sleep(THRESHOLD_S / 8)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(watchdog.run)
            clock.stall(1.0)
            await anyio.to_thread.run_sync(wait_for_checks, watchdog.checks + 8)
            tg.cancel_scope.cancel()
    assert blocked_records(caplog) == []
    assert watchdog.blocked_count == 0


def _hold_the_gil(block_s: float) -> None:
    """Busy in one C call (no bytecode boundary): the watchdog thread cannot run meanwhile."""
    n = 1_000_000
    started = time.perf_counter()
    sum(range(n))
    per_call_s = max(time.perf_counter() - started, 1e-6)
    sum(range(int(n * block_s / per_call_s)))


async def _watch_a_block(caplog, block, *, name: str = "blocking chore") -> list[Any]:
    caplog.set_level(logging.WARNING, logger="engine.triggerer.watchdog")
    watchdog = LoopWatchdog(THRESHOLD_S)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(watchdog.run)

            async def chore() -> None:
                block()

            tg.start_soon(chore, name=name)
            await anyio.wait_all_tasks_blocked()
            # The report comes from the watchdog's thread: poll its count, briefly.
            checks = watchdog.checks
            while watchdog.checks < checks + 4:  # noqa: ASYNC110
                await anyio.sleep(THRESHOLD_S / 4)
            tg.cancel_scope.cancel()
    return blocked_records(caplog)


async def test_a_block_that_holds_the_gil_is_reported(caplog):
    """The watchdog wakes late here too, but the process ran: a block, not a stall."""
    records = await _watch_a_block(caplog, lambda: _hold_the_gil(4 * THRESHOLD_S))
    assert len(records) == 1
    assert "blocking chore" in records[0].culprit


async def test_a_block_in_another_selector_is_reported(caplog):
    """``subprocess.run(capture_output=True)`` waits in a selector of its own: a block."""
    command = [sys.executable, "-c", f"import time; time.sleep({3 * THRESHOLD_S})"]
    records = await _watch_a_block(
        caplog,
        lambda: subprocess.run(command, capture_output=True, check=True),
    )
    assert len(records) == 1


def test_threshold_must_be_positive():
    with pytest.raises(ValueError, match="threshold_s"):
        LoopWatchdog(0)
