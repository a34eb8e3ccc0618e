"""The triggerer's lease on what it owns: how long it may act without asking the database.

A triggerer owns its trigger rows (and the upstreams of their shared-stream groups) through
its ``job`` row: another triggerer takes the rows over only once that row's heartbeat is
older than the health-check threshold, and in the same transaction ends the job row
(``claiming.claim_round``). The job id is the ownership epoch: a triggerer that lost its
rows never gets them back under the same id.

So a heartbeat sent at ``t`` and committed proves that nobody takes the rows over before
``t + threshold``: the triggerer *holds its lease* until ``t + threshold - margin`` (the
margin covers the time a fence takes to act, and clock skew between hosts). Every
``producer.advance`` (commit, delete, ack) asks ``holds()`` first, with no round trip.
The persister checks the job row itself, in the transaction that stores the events
(``watcher_events.store_watcher_events``'s owner guard).

A lease that lapses (the process was stopped, its loop blocked, or no heartbeat got through
for that long) or that the database says is gone (the heartbeat found the job row ended,
the persister's guard refused a batch) is *lost*: ``watch`` fences the shared streams at
once (every consumer leaves its broker's group before anything else of the loop runs) and
raises ``LeaseLost``; the triggerer then drops what it had not stored (the broker redelivers
it to the new owner) and starts again under a new job row.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Final

import anyio

from engine.exceptions import LeaseLost

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ("Lease", "LeaseLost", "lease_margin_s")

logger = logging.getLogger("engine.triggerer.triggerer")

#: at most this much of the threshold is kept back (see ``lease_margin_s``)
MAX_MARGIN_S: Final = 1.0


def lease_margin_s(threshold_s: float) -> float:
    """What the lease keeps back from the takeover threshold: a tenth of it, at most 1 s."""
    return min(MAX_MARGIN_S, threshold_s / 10)


class Lease:
    """Held until ``bound_s`` after the start of the last heartbeat that got through."""

    def __init__(self, *, threshold_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold_s = threshold_s
        margin = lease_margin_s(threshold_s)
        self.bound_s = threshold_s - margin
        self.tick_s = min(0.1, margin / 2)
        self._clock = clock
        self._valid_until = clock() + self.bound_s
        self._lost: str | None = None
        self._wake = anyio.Event()

    def __repr__(self) -> str:
        left = self._valid_until - self._clock()
        return f"<Lease left={left:.3f}s lost={self._lost!r}>"

    @property
    def lost(self) -> str | None:
        """Why the lease was lost, or None."""
        return self._lost

    def holds(self) -> bool:
        """Whether the triggerer may act as the owner now (advance a broker, store events)."""
        return self._lost is None and self._clock() <= self._valid_until

    def renewed(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (this lease's clock) found the job row running."""
        if self._lost is None:
            self._valid_until = max(self._valid_until, sent_at + self.bound_s)

    def lose(self, reason: str) -> None:
        """The database says the job row is no longer this triggerer's."""
        if self._lost is None:
            self._lost = reason
            self._wake.set()

    async def watch(self, fence: Callable[[str], None]) -> None:
        """Until the lease is lost: then call ``fence(reason)`` and raise ``LeaseLost``.

        Wakes every ``tick_s``: after the process was stopped, this short timer is the first
        one due, so the fence runs before any broker client's own timers resume.
        """
        while self._lost is None:
            with anyio.move_on_after(self.tick_s):
                await self._wake.wait()
            now = self._clock()
            if self._lost is None and now > self._valid_until:
                self._lost = (
                    f"no heartbeat got through for {now - self._valid_until + self.bound_s:.1f}s "
                    f"(another triggerer may take its rows over after {self.threshold_s:.1f}s)"
                )
        fence(self._lost)
        raise LeaseLost(self._lost)
