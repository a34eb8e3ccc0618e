"""One subscriber's view of a shared stream: a bounded queue read as an async iterator.

The iterator is what ``filter_shared_stream`` consumes. In ack mode it also drives the
binding window: yielding an event opens it (``AckLedger.deliver``), asking for the next one
closes it (``AckLedger.pull``). It records itself in a context variable each time it is
pulled, so that ``reject_shared_stream_event()``, called from the filter body (same task,
same context as the pull), finds the subscriber and the event being processed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from shared_stream.bookkeeping import AckLedger
    from shared_stream.effects import Effect

logger = logging.getLogger(__name__)


class EffectSink(Protocol):
    """Carries out the effects the ledger returns and counts rejects (the group)."""

    def carry_out(self, effects: Sequence[Effect]) -> None: ...

    def record_reject(self) -> None: ...


_current_stream: ContextVar[SubscriberStream | None] = ContextVar(
    "shared_stream_subscriber", default=None
)


class SubscriberStream:
    """The raw event stream of one subscriber (an ``AsyncIterator`` of raw events).

    The group appends ``(event_seq, raw_event)`` to ``queue`` and sets ``waiter``; the
    stream ends with ``error`` raised (after the queue drains, or at once when the queue
    was cleared) or, once closed, with ``StopAsyncIteration``.
    """

    __slots__ = (
        "_in_window",
        "closed",
        "error",
        "key",
        "ledger",
        "queue",
        "sink",
        "trigger_id",
        "waiter",
    )

    def __init__(
        self, *, trigger_id: int, key: object, ledger: AckLedger | None, sink: EffectSink
    ) -> None:
        self.trigger_id = trigger_id
        self.key = key
        self.ledger = ledger
        self.sink = sink
        self.queue: deque[tuple[int, Any]] = deque()
        # A bare future of the running asyncio loop: created per wait on the fan-out hot
        # path, it costs a fraction of an ``anyio.Event`` (asyncio is the only backend the
        # engine runs on; its brokers' clients are asyncio-only).
        self.waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None
        self.closed = False
        self._in_window = False

    def __aiter__(self) -> SubscriberStream:
        return self

    async def __anext__(self) -> Any:
        if _current_stream.get() is not self:
            _current_stream.set(self)
        if self._in_window:
            self._in_window = False
            effects = self.ledger.pull(self.trigger_id)  # type: ignore[union-attr]
            if effects:
                self.sink.carry_out(effects)
        queue = self.queue
        while not queue:
            if self.error is not None:
                raise self.error
            if self.closed:
                raise StopAsyncIteration
            waiter = self.waiter = asyncio.get_running_loop().create_future()
            await waiter
        seq, raw = queue.popleft()
        if self.ledger is not None:
            self.ledger.deliver(self.trigger_id, seq)
            self._in_window = True
        return raw

    def fail(self, error: BaseException, *, drain: bool) -> None:
        """End the stream with ``error``: at once, or after the queued events (``drain``)."""
        if self.error is None and not self.closed:
            self.error = error
            if not drain:
                self.queue.clear()
            self.wake()

    def close(self) -> None:
        """End the stream (unsubscribed): pending events are dropped."""
        self.closed = True
        self.queue.clear()
        self._in_window = False
        self.wake()

    def reject_current(self) -> bool:
        """Reject the event being processed; False when no ack-mode window is open."""
        ledger = self.ledger
        if ledger is None or not self._in_window or not ledger.is_in_window(self.trigger_id):
            return False
        effects = ledger.reject(self.trigger_id)
        self.sink.record_reject()
        if effects:
            self.sink.carry_out(effects)
        return True

    def wake(self) -> None:
        """Resume the subscriber if it waits for an event."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():  # done: its wait was cancelled
                waiter.set_result(None)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "failed" if self.error is not None else "open"
        return (
            f"<SubscriberStream trigger_id={self.trigger_id!r} key={self.key!r} "
            f"mode={'fast' if self.ledger is None else 'ack'} queued={len(self.queue)} "
            f"in_window={self._in_window} state={state}>"
        )


def forget_current_stream() -> None:
    """Clear the current subscriber of this context (a task started from a subscriber's)."""
    _current_stream.set(None)


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
