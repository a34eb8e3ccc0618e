"""One subscriber's view of a shared stream: a bounded queue read as an async iterator.

The iterator is what ``filter_shared_stream`` consumes. Its group fills the queue
(``fan_out``) and ends the stream (``fail``, ``close``). In ack mode the stream moves its
subscriber's *cursor* (``Cursor``: the event it yielded last, and whether that one is
still being processed) as it yields events, one attribute write each, and reports to its
group, and only its group, now and then (``GroupPort.catch_up``) and before it waits for
the next event (``GroupPort.moved_past``): the group's ack ledger reads the cursor and
counts what the subscriber moved past. This module never sees the ledger.

The stream records itself in a context variable each time it is pulled, so that
``reject_shared_stream_event()``, called from the filter body (same task, same context as
the pull), finds the subscriber and asks its group to reject the event being processed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

logger = logging.getLogger(__name__)


# An ack-mode stream reports its moves at least this often while it never waits, so its
# group advances what every subscriber moved past even when no queue ever runs dry.
CATCH_UP_EVERY: Final = 64


class Cursor(Protocol):
    """Where an ack-mode subscriber is; the stream writes ``position`` and ``in_window``,
    its group's ledger reads them (``bookkeeping.AckLedger.subscribe`` makes it)."""

    position: int  # seq of the last event yielded (or broadcast before subscribing)
    in_window: bool  # the event at ``position`` is still being processed

    @property
    def counted(self) -> int:
        """The last event the ledger counted for this subscriber (read-only here)."""
        ...


class GroupPort(Protocol):
    """What an ack-mode stream reports to its group (``SharedStreamGroup``)."""

    #: The ledger counts what the subscriber moved past (its cursor moved without a
    #: call). Its result, the effects to carry out, goes back to ``carry_out`` when not
    #: empty: the group's ledger answers without a wrapper call.
    catch_up: Callable[[int], Sequence[Any]]

    def carry_out(self, effects: Sequence[Any]) -> None:
        """Carry out what ``catch_up`` returned."""

    def moved_past(self, trigger_id: int) -> None:
        """The filter asked for the next event and none is queued: it is done with the
        current one, and the stream waits."""

    def reject_current(self, trigger_id: int) -> bool:
        """Reject the event being processed; False when the group has no window open."""


class CurrentRejector(Protocol):
    """What ``reject_shared_stream_event()`` refuses: the subscriber stream's current raw
    event, or (``route_rejections``) one item of it."""

    @property
    def trigger_id(self) -> int | None: ...

    def reject_current(self) -> bool: ...


_current_stream: ContextVar[CurrentRejector | None] = ContextVar(
    "shared_stream_subscriber", default=None
)


class SubscriberStream:
    """The raw event stream of one subscriber (an ``AsyncIterator`` of raw events).

    The group appends ``(event_seq, raw_event)`` to ``queue`` and sets ``waiter``; the
    stream ends with ``error`` raised (after the queue drains, or at once when the queue
    was cleared) or, once closed, with ``StopAsyncIteration``. ``group`` and ``cursor``
    are None in fast mode: there is nothing to report.
    """

    __slots__ = (
        "closed",
        "cursor",
        "error",
        "group",
        "key",
        "queue",
        "trigger_id",
        "waiter",
    )

    def __init__(
        self,
        *,
        trigger_id: int,
        key: object,
        group: GroupPort | None,
        cursor: Cursor | None = None,
    ) -> None:
        if (group is None) != (cursor is None):
            raise ValueError("an ack-mode stream needs both its group and its cursor")
        self.trigger_id = trigger_id
        self.key = key
        self.group = group
        self.cursor = cursor
        self.queue: deque[tuple[int, Any]] = deque()
        # A bare future of the running asyncio loop: created per wait on the fan-out hot
        # path, it costs a fraction of an ``anyio.Event`` (asyncio is the only backend the
        # engine runs on; its brokers' clients are asyncio-only).
        self.waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None
        self.closed = False

    def __aiter__(self) -> SubscriberStream:
        return self

    async def __anext__(self) -> Any:
        if _current_stream.get() is not self:
            _current_stream.set(self)
        queue = self.queue
        cursor = self.cursor
        if cursor is None:  # fast mode: nothing to report
            while not queue:
                await self._wait()
            return queue.popleft()[1]
        if not queue:
            if cursor.in_window and not self.closed:  # done with its event; waits
                cursor.in_window = False
                group = self.group
                assert group is not None
                group.moved_past(self.trigger_id)
            while not queue:
                await self._wait()
        seq, raw = queue.popleft()
        # the common path: the cursor moves, the ledger counts the moves later
        cursor.position = seq
        cursor.in_window = True
        if seq - cursor.counted > CATCH_UP_EVERY:
            group = self.group
            assert group is not None
            effects = group.catch_up(self.trigger_id)
            if effects:
                group.carry_out(effects)
        return raw

    async def _wait(self) -> None:
        """Wait for the next event; raise when the stream ended (error, closed)."""
        if self.error is not None:
            raise self.error
        if self.closed:
            raise StopAsyncIteration
        waiter = self.waiter = asyncio.get_running_loop().create_future()
        await waiter

    def fail(self, error: BaseException, *, drain: bool) -> None:
        """End the stream with ``error``: at once, or after the queued events (``drain``)."""
        if self.error is None and not self.closed:
            self.error = error
            if not drain:
                self.queue.clear()
            self.wake()

    def close(self) -> None:
        """End the stream (unsubscribed): pending events are dropped. The cursor stays as
        it is: the ledger reads it as the subscriber leaves."""
        self.closed = True
        self.queue.clear()
        self.wake()

    def reject_current(self) -> bool:
        """Reject the event being processed; False when no ack-mode window is open."""
        if self.group is None or self.cursor is None or not self.cursor.in_window:
            return False
        return self.group.reject_current(self.trigger_id)

    def wake(self) -> None:
        """Resume the subscriber if it waits for an event."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():  # done: its wait was cancelled
                waiter.set_result(None)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "failed" if self.error is not None else "open"
        cursor = self.cursor
        window = "-" if cursor is None else f"{cursor.position}:{cursor.in_window}"
        return (
            f"<SubscriberStream trigger_id={self.trigger_id!r} key={self.key!r} "
            f"mode={'fast' if self.group is None else 'ack'} queued={len(self.queue)} "
            f"window={window} state={state}>"
        )


def forget_current_stream() -> None:
    """Clear the current subscriber of this context (a task started from a subscriber's)."""
    _current_stream.set(None)


def route_rejections(target: CurrentRejector) -> None:
    """Until the calling filter pulls its next raw event, ``reject_shared_stream_event()``
    calls ``target.reject_current()`` instead of rejecting the whole raw event: for a raw
    event that bundles items (a batch of broker messages) handed to a filter one by one,
    which refuses one of them alone."""
    _current_stream.set(target)


def reject_shared_stream_event() -> None:
    """Refuse the raw event the calling filter is processing (ack mode only).

    The subscriber resolves the event as *rejected* at once (no persistence wait), so the
    producer can dead-letter / nack it. Outside an ack-mode binding window (fast path, a
    standalone ``run()``, between raw events) this logs a warning and does nothing.
    """
    stream = _current_stream.get()
    if stream is not None and stream.reject_current():
        return
    logger.warning(
        "reject_shared_stream_event() ignored: it is only meaningful inside "
        "filter_shared_stream() while processing a raw event of an ack-mode shared stream "
        "(trigger_id=%s); call it after receiving the event and before pulling the next one",
        None if stream is None else stream.trigger_id,
        extra={
            "action": "shared_stream.reject_ignored",
            "trigger_id": None if stream is None else stream.trigger_id,
        },
    )
