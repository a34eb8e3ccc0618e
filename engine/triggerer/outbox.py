"""The outbox: the one queue every trigger outcome goes through on its way to the database.

Triggers put items without ever blocking (``put_nowait`` appends to a deque); the single
persister takes them in FIFO batches with ``get_batch``, which returns at once when items
are waiting (the persister writes its next batch as soon as the previous write finished, so
batches grow by themselves under load) and otherwise sleeps on an event that the next
``put_nowait`` sets. The outbox is unbounded on purpose: a trigger that fired must not be
blocked or dropped because the database is slow; the shared-stream subscriber queues and
the triggerer's capacity bound how much can pile up.

Not thread-safe: call every method from the event loop thread.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel

from engine.states import TriggerKind

if TYPE_CHECKING:
    from triggers.base import TriggerEvent

__all__ = (
    "DEFAULT_BATCH_SIZE",
    "FiredEvent",
    "Outbox",
    "OutboxItem",
    "TriggerFailed",
    "TriggerKind",
)

DEFAULT_BATCH_SIZE: Final = 1000


@dataclass(slots=True)
class FiredEvent:
    """A trigger yielded ``event``.

    ``seq`` is the shared-stream sequence number the event was bound to (None for a trigger
    that runs its own ``run()``): the persister confirms it back to the shared-stream
    manager once the event is committed. ``fired_at`` is ``time.monotonic()`` at firing.
    ``watcher`` is the (asset id, watcher name) a watcher trigger was claimed for: its event
    is stored for that asset even if the watcher moved to a new trigger row meanwhile (its
    kwargs were edited) and this row is already gone. ``dedup_key`` is the key the trigger
    gave the event (``BaseEventTrigger.dedup_key``), computed as the event was taken: the
    watcher's asset event is stored once per key, and always when it is None.

    Read-only by contract, not ``frozen``: one is built for every event a trigger fires, on
    the event loop, and a frozen dataclass's ``__init__`` costs several times a plain one's.
    """

    trigger_id: int
    event: TriggerEvent
    seq: int | None
    fired_at: float
    watcher: tuple[int, str] | None = None
    dedup_key: str | None = None


@dataclass(frozen=True, slots=True)
class TriggerFailed:
    """A trigger failed; ``reason`` and ``traceback`` say how.

    For a ``TASK`` trigger (``will_restart=False``) the persister fails the deferred task
    (``next_method="__fail__"``). For a ``WATCHER`` trigger ``will_restart`` says whether
    the runner restarts it after a backoff (it is False only when the trigger could not be
    re-created from its kwargs).
    """

    trigger_id: int
    kind: TriggerKind
    reason: str
    traceback: str | None
    will_restart: bool
    #: The upstream it could not reach (``Failure.unavailable``): what it reads
    #: (``shared_stream.keys.broker_kind``) and the address its error named; None for a
    #: failure of another kind (the trigger row forgets an earlier unreachable upstream).
    unreachable_broker: str | None = None
    unreachable_address: str | None = None


OutboxItem = FiredEvent | TriggerFailed


class Outbox:
    """FIFO of trigger outcomes: many non-blocking producers, batch-reading consumer(s)."""

    __slots__ = ("_closed", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[OutboxItem] = deque()
        # Created by a waiting get_batch (anyio events need a running loop), set and
        # dropped by the next put_nowait or close: at most one event per wait.
        self._waiter: anyio.Event | None = None
        self._closed = False

    def put_nowait(self, item: OutboxItem) -> None:
        """Append ``item``; never blocks. Items put after ``close()`` are still delivered."""
        self._items.append(item)
        self._wake()

    async def get_batch(self, max_items: int = DEFAULT_BATCH_SIZE) -> list[OutboxItem]:
        """Wait until at least one item is queued, then return up to ``max_items`` (FIFO).

        Returns at once when items are waiting. After ``close()`` it returns what is left,
        then ``[]`` once the outbox is empty.
        """
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        while not self._items:
            if self._closed:
                return []
            if self._waiter is None:
                self._waiter = anyio.Event()
            await self._waiter.wait()
        await anyio.lowlevel.checkpoint_if_cancelled()
        items = self._items
        if len(items) <= max_items:
            self._items = deque()
            return list(items)
        return [items.popleft() for _ in range(max_items)]

    def take_all(self) -> list[OutboxItem]:
        """Everything queued, at once (the outbox is being abandoned)."""
        items, self._items = list(self._items), deque()
        return items

    def close(self) -> None:
        """No more waiting: ``get_batch`` drains what is left, then returns ``[]``."""
        self._closed = True
        self._wake()

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.set()

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Outbox {state} queued={len(self._items)} waiting={self._waiter is not None}>"
