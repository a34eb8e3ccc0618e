"""``SignalGap``: how the SQLite wake-up turns a storm of WAL writes into few probes.

Every commit of every part writes the WAL, and each claim loop answered each write with a
probe (6 per defer cycle, 6 ms of its 32). The gap signals the first write of a quiet spell
at once and then at most once per gap, and never drops the last write. The clock is the
test's: the gap's sleep ends when the test says so.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel

from engine.jobs.wakeup import SignalGap


class GapClock:
    """A sleep that ends when ``end_gap()`` is called; counts the gaps begun."""

    def __init__(self) -> None:
        self.begun = 0
        self._ends = anyio.Event()

    async def sleep(self, _seconds: float) -> None:
        self.begun += 1
        await self._ends.wait()
        self._ends = anyio.Event()

    def end_gap(self) -> None:
        self._ends.set()


async def test_the_first_write_signals_at_once_and_a_gap_coalesces_the_rest() -> None:
    calls: list[int] = []
    clock = GapClock()
    gap = SignalGap(lambda: calls.append(len(calls)), 0.05, sleep=clock.sleep)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(gap.run)
            await anyio.wait_all_tasks_blocked()
            assert calls == []  # nothing written, nothing signalled

            gap.note()
            await anyio.wait_all_tasks_blocked()
            assert (len(calls), clock.begun) == (1, 1)  # at once, then a gap begins

            for _ in range(5):  # a burst of commits during the gap
                gap.note()
            await anyio.wait_all_tasks_blocked()
            assert len(calls) == 1

            clock.end_gap()  # the burst gets one trailing signal, then another gap
            await anyio.wait_all_tasks_blocked()
            assert (len(calls), clock.begun) == (2, 2)

            clock.end_gap()  # nothing written during that gap: quiet, no signal
            await anyio.wait_all_tasks_blocked()
            assert (len(calls), clock.begun) == (2, 2)

            gap.note()  # after a quiet spell: at once again
            await anyio.wait_all_tasks_blocked()
            assert len(calls) == 3
            tg.cancel_scope.cancel()
