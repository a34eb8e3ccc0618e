"""When an ack-mode group checks its timeouts: at the ledger's next deadline.

``DeadlineTimer`` sleeps until the deadline the group gives it, or, with none, until the
group pokes it (an event was broadcast, so a deadline may exist now). The ledger holds the
deadlines and decides who timed out; this module only waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_TIMER_SLEEP_S: Final = 3600.0


class DeadlineTimer:
    """Waits for a deadline of ``clock`` (monotonic seconds) or, with none, for ``poke()``."""

    __slots__ = ("_clock", "_idle", "_wakeup")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._wakeup = anyio.Event()
        self._idle = False  # waiting for a poke (there was no deadline)

    def poke(self) -> None:
        """A deadline may exist now: wake the timer if it waits without one.

        A timer sleeping toward a deadline is left alone: a later broadcast never brings
        the next deadline earlier.
        """
        if self._idle:
            self._idle = False
            self._wakeup.set()

    async def wait_until(self, deadline: float | None) -> bool:
        """Sleep until ``deadline`` (at most ``MAX_TIMER_SLEEP_S``) and return True; with
        no deadline, wait for ``poke()`` and return False (nothing is due)."""
        if deadline is None:
            self._wakeup = anyio.Event()
            self._idle = True
            await self._wakeup.wait()
            return False
        delay = min(deadline - self._clock(), MAX_TIMER_SLEEP_S)
        await anyio.sleep(max(delay, 0.0))
        return True

    def __repr__(self) -> str:
        return f"<DeadlineTimer idle={self._idle}>"
