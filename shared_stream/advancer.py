"""The advance side of an ack-mode group: the batch waiting to be sent, and the sending.

The ledger dispatches at most one ``AdvanceBatch`` at a time (the next only after
``advance_done``). ``AdvanceSlot`` holds it, with its dispatch time, until the group's
advance task takes it; ``send_advance`` awaits ``producer.advance`` for it (while the group
drains, shielded and bounded by the drain deadline). Nothing here reads or changes the
ledger: the group does, before and after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable

    from shared_stream.effects import AdvanceBatch
    from shared_stream.producer import SharedStreamProducer


class AdvanceSlot:
    """The dispatched batch not yet taken by the advance task (at most one)."""

    __slots__ = ("_batch", "_clock", "_since", "_wakeup")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._batch: AdvanceBatch | None = None
        self._since = 0.0  # clock() when _batch was dispatched
        self._wakeup = anyio.Event()

    def put(self, batch: AdvanceBatch) -> None:
        """The ledger dispatched ``batch``: hold it and wake the advance task."""
        self._batch = batch
        self._since = self._clock()
        self._wakeup.set()

    def clear(self) -> None:
        """Drop the batch not taken yet (the group failed: nothing more is advanced)."""
        self._batch = None

    def wake(self) -> None:
        """Wake the advance task without a batch (the group stops: it may be done)."""
        self._wakeup.set()

    def take(self) -> tuple[AdvanceBatch, float] | None:
        """The held batch and its dispatch time, emptying the slot; None when empty."""
        batch = self._batch
        if batch is None:
            return None
        self._batch = None
        return batch, self._since

    async def wait(self) -> None:
        """Wait for the next ``put`` or ``wake`` (call it right after ``take`` found none)."""
        self._wakeup = anyio.Event()
        await self._wakeup.wait()

    def __repr__(self) -> str:
        return f"<AdvanceSlot batch={self._batch!r}>"


async def send_advance(
    producer: SharedStreamProducer, batch: AdvanceBatch, *, drain_deadline: float | None
) -> bool:
    """Await ``producer.advance(batch.items)``; False when the drain deadline came first.

    ``drain_deadline`` (the group is stopping): the call is shielded from the group's
    cancellation and bounded by that ``anyio.current_time()`` deadline instead.
    """
    if drain_deadline is None:
        await producer.advance(batch.items)
        return True
    with anyio.CancelScope(deadline=drain_deadline, shield=True) as scope:
        await producer.advance(batch.items)
    return not scope.cancelled_caught
