"""When the triggerer claims: the loop of claim rounds and what it waits for between them.

A full round (``Triggerer.sync_once``: ownership checksum, dead triggerers, timeouts, claim,
start) runs at start, then at once while the last one filled its capacity, on a nudge from
this process, on a shutdown, and every ``claim_idle_interval_s`` in any case. Between
rounds, a cheap probe (one indexed read: does a row wait that a round would take?) runs
every ``new_trigger_poll_s`` and at once when the ``RowsSignal`` says another process wrote
rows; a probe that finds one ends the wait. A failed round is retried after a backoff that
only a nudge or a shutdown shortens.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from engine.exceptions import SluiceError
from engine.retry import Backoff

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import TaskStatus

__all__ = ("ClaimLoop",)

# The triggerer's own lines: they keep its logger name, which operators (and tests) filter on.
logger = logging.getLogger("engine.triggerer.triggerer")


class ClaimLoop:
    """Runs ``sync_once`` (one round; True when it filled its capacity: more rows may wait)
    until ``stop()``. ``probe`` says whether a row waits that a round would take (it may
    raise ``SluiceError``); ``claims`` counts the rows claimed so far."""

    def __init__(
        self,
        *,
        sync_once: Callable[[], Awaitable[bool]],
        probe: Callable[[], Awaitable[bool]],
        claims: Callable[[], int],
        idle_interval_s: float,
        poll_s: float,
    ) -> None:
        self._sync_once = sync_once
        self._probe = probe
        self._claims = claims
        self._idle_interval_s = idle_interval_s
        self._poll_s = poll_s
        self._stopping = False
        self._wake = anyio.Event()  # set by a nudge, a stop or a new-rows signal
        self._nudged = False  # the wake asks for a full round, not just a probe

    def __repr__(self) -> str:
        return f"<ClaimLoop nudged={self._nudged} stopping={self._stopping}>"

    def nudge(self) -> None:
        """A full round now: new trigger rows were written in this process."""
        self._nudged = True
        self._wake.set()

    def signal(self) -> None:
        """``RowsSignal``'s callback: probe now (unlike ``nudge``, not a full round)."""
        self._wake.set()

    def stop(self) -> None:
        """End the loop: at once when it waits, else after the round it runs."""
        self._stopping = True
        self._wake.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Claim rounds until ``stop()`` (``task_status`` is started after the first)."""
        first, backoff = True, Backoff(self._poll_s)
        probe, probed = True, False
        while True:
            retry_in = None
            claims_before = self._claims()
            try:
                more = await self._sync_once()
            except SluiceError as exc:
                retry_in, more = backoff.failed(), False
                logger.warning(
                    "Claim loop failed (%d in a row), retrying in %.2fs: %s",
                    backoff.failures,
                    retry_in,
                    exc,
                    extra={"action": "claim", "failures": backoff.failures},
                )
            else:
                if failures := backoff.succeeded():
                    logger.info(
                        "Claim loop works again after %d failure(s)",
                        failures,
                        extra={"action": "claim_recovered"},
                    )
            if first:
                task_status.started()
                first = False
            if retry_in is not None:
                await self._wait_for_retry(retry_in)
                self._reset_wake()
            elif not more:
                # A probe that found rows this round did not take (a group another triggerer
                # will take) is not repeated before the next full round: no busy loop.
                claimed = self._claims() > claims_before
                probe = not (probed and not claimed)
                if claimed:
                    # Rows of a burst may still be arriving (written in several commits):
                    # probe again at once rather than after a poll interval.
                    self._wake.set()
                probed = await self._wait_for_work(probe=probe)
                self._reset_wake()
            if self._stopping:
                return

    async def _wait_for_work(self, *, probe: bool = True) -> bool:
        """Until the next full round (``claim_idle_interval_s``), a nudge from this process,
        or a new unassigned row this triggerer would take: with capacity to spare, another
        process deferred a task or added a watcher; even when full, a watcher joins a group
        this triggerer holds. That check is one indexed probe, run at once when the
        ``RowsSignal`` says another process wrote rows (PostgreSQL NOTIFY, a SQLite
        commit), and every ``new_trigger_poll_s`` in any case; so a new trigger starts
        without waiting for a poll, and without a full round (ownership checksum, dead
        triggerers, timeouts) more often than once per idle interval. True when the probe
        ended the wait."""
        with anyio.move_on_after(self._idle_interval_s):
            while True:
                with anyio.move_on_after(self._poll_s):
                    await self._wake.wait()
                if self._wake.is_set():
                    if self._nudged or self._stopping:
                        return False
                    self._wake = anyio.Event()  # a signal: probe, and coalesce those after
                if not probe:
                    continue
                try:
                    if await self._probe():
                        return True
                except SluiceError:
                    return False  # the full round reports it
        return False

    async def _wait_for_retry(self, retry_in_s: float) -> None:
        """After a failed round: until the retry, a nudge or a shutdown (new-rows signals,
        e.g. this process's own SQLite commits, do not shorten a backoff)."""
        with anyio.move_on_after(retry_in_s):
            while not (self._nudged or self._stopping):
                await self._wake.wait()
                if not (self._nudged or self._stopping):
                    self._wake = anyio.Event()

    def _reset_wake(self) -> None:
        """Before a round: wakes from now on ask for the next one."""
        self._wake = anyio.Event()
        self._nudged = False
