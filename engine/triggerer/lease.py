"""The triggerer's lease on what it owns: how long it may act without asking the database.

A triggerer owns its trigger rows (and the upstreams of their shared-stream groups) through
its ``job`` row: another triggerer takes the rows over only once that row's heartbeat is
older than the health-check threshold, and in the same transaction ends the job row
(``claiming.claim_round``). The job id is the ownership epoch: a triggerer that lost its
rows never gets them back under the same id.

So a heartbeat sent at ``t`` and committed proves that nobody takes the rows over before
``t + threshold``: the triggerer *holds its lease* until ``t + threshold - margin`` (the
margin covers the time an advance takes once started, and clock skew between hosts). Every
``producer.advance`` (commit, delete, ack) asks ``holds()`` first, with no round trip, and
waits while it does not hold (a slow heartbeat may still get through).
The persister checks the job row itself, in the transaction that stores the events
(``watcher_events.store_watcher_events``'s owner guard).

A lease with no heartbeat through for the whole threshold (the process was stopped, its loop
blocked, or the database unreachable that long: another triggerer may own the rows now) or
that the database says is gone (the heartbeat found the job row ended,
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
from engine.triggerer.outbox import FiredEvent

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from engine.triggerer.outbox import OutboxItem

__all__ = ("Lease", "LeaseLost", "carried_over", "lease_margin_s")

logger = logging.getLogger("engine.triggerer.triggerer")

#: at most this much of the threshold is kept back (see ``lease_margin_s``)
MAX_MARGIN_S: Final = 1.0


def lease_margin_s(threshold_s: float) -> float:
    """What the lease keeps back from the takeover threshold: a tenth of it, at most 1 s."""
    return min(MAX_MARGIN_S, threshold_s / 10)


class Lease:
    """Held until ``bound_s`` after the start of the last heartbeat that got through; lost
    once ``threshold_s`` passed since then (a takeover is possible from that moment) or when
    the database says so."""

    def __init__(self, *, threshold_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold_s = threshold_s
        margin = lease_margin_s(threshold_s)
        self.bound_s = threshold_s - margin
        self.tick_s = min(0.1, margin / 2)
        self._clock = clock
        self._last_sent = clock()
        self._lost: str | None = None
        self._wake = anyio.Event()

    def __repr__(self) -> str:
        since = self._clock() - self._last_sent
        return f"<Lease since_heartbeat={since:.3f}s lost={self._lost!r}>"

    @property
    def lost(self) -> str | None:
        """Why the lease was lost, or None."""
        return self._lost

    def holds(self) -> bool:
        """Whether the triggerer may act as the owner now (advance a broker, store events).

        False for a while before the lease is lost (from ``bound_s`` to ``threshold_s``
        without a heartbeat): advances wait, and go on if a heartbeat gets through."""
        return self._lost is None and self._clock() - self._last_sent <= self.bound_s

    def renewed(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (this lease's clock) found the job row running."""
        if self._lost is None:
            self._last_sent = max(self._last_sent, sent_at)

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
            since = self._clock() - self._last_sent
            if self._lost is None and since > self.threshold_s:
                self._lost = (
                    f"no heartbeat got through for {since:.1f}s (another triggerer may take "
                    f"its rows over after {self.threshold_s:.1f}s)"
                )
        fence(self._lost)
        raise LeaseLost(self._lost)


def carried_over(taken: Sequence[OutboxItem], *, job_id: int | None) -> list[OutboxItem]:
    """Of what a life that lost its lease fired and did not store (``taken``), what no broker
    will deliver again: the events of triggers outside ack mode (a flag file it deleted, a
    deferred task's trigger). The next life stores them under its own job. The events of
    ack-mode shared streams are left to their broker, which redelivers them to whoever owns
    the stream now (stored once: their dedup keys); failures are dropped (reports only)."""
    carried: list[OutboxItem] = [i for i in taken if isinstance(i, FiredEvent) and i.seq is None]
    logger.warning(
        "Triggerer carries %d event(s) it fired and did not store over to its new job; "
        "%d other outcome(s) are left to their brokers' redelivery",
        len(carried),
        len(taken) - len(carried),
        extra={"action": "triggerer_carry_over", "job_id": job_id},
    )
    return carried
