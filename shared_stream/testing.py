"""Test doubles for shared streams: a fake clock and in-memory producers.

- ``InMemoryFeed``: an async-iterable FIFO, a fake upstream for ``open_shared_stream``.
- ``FakeClock``: pass it as ``SharedStreamManager(clock=...)``; move it with ``advance()``,
  then ``await manager.check_timeouts()``.
- ``InMemoryProducer``: a real ``SharedStreamProducer`` fed by ``await producer.put(raw,
  payload)``; records every advance batch, with an optional lane function and failure
  injection for ``advance`` / ``open_stream``.
- ``BlockingProducer``: an ``InMemoryProducer`` whose ``advance`` blocks until released
  (for cancellation and "one advance in flight" tests).
- ``SubscriberHarness``: drives a trigger's ``filter_shared_stream`` against a manager the
  way the triggerer does (subscribe, bind, confirm, unsubscribe).

Everything here runs on the event loop thread.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from shared_stream.producer import AdvanceItem, SharedStreamProducer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Hashable, Sequence

    from shared_stream.manager import SharedStreamManager
    from triggers.base import BaseEventTrigger, TriggerEvent


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot go back ({seconds!r}s)")
        self.now += seconds

    def __repr__(self) -> str:
        return f"<FakeClock now={self.now!r}>"


class _Condition:
    """Wake waiters when a predicate over the producer's records becomes true."""

    def __init__(self) -> None:
        self._waiters: list[tuple[Callable[[], bool], anyio.Event]] = []

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        if predicate():
            return
        entry = (predicate, anyio.Event())
        self._waiters.append(entry)
        try:
            await entry[1].wait()
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)

    def notify(self) -> None:
        if not self._waiters:  # the usual case of a feed: called for every item put
            return
        ready = [(p, e) for p, e in self._waiters if p()]
        for pair in ready:
            self._waiters.remove(pair)
            pair[1].set()


class InMemoryFeed:
    """An unbounded FIFO read as an async iterator: a fake upstream for fast-mode tests.

    ``put`` appends an item; an ``Exception`` item is raised to the reader instead of
    yielded (a failing upstream); ``finish()`` ends the iteration once drained. Several
    readers may iterate it one after another (a group restarted after a failure).
    """

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._finished = False
        self._changed = _Condition()

    def put(self, item: Any) -> None:
        self._items.append(item)
        self._changed.notify()

    def finish(self) -> None:
        self._finished = True
        self._changed.notify()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while True:
            await self._changed.wait_for(lambda: bool(self._items) or self._finished)
            if not self._items:
                return
            item = self._items.popleft()
            if isinstance(item, Exception):
                raise item
            yield item

    def __repr__(self) -> str:
        return f"<InMemoryFeed queued={len(self._items)} finished={self._finished}>"


class InMemoryProducer(SharedStreamProducer):
    """Yields what ``put`` feeds it; records advance batches and lifecycle calls.

    ``lane(broker_payload)`` picks the advance lane (one lane by default). ``fail_open`` is
    raised by ``open_stream``; ``fail_advance`` by every ``advance`` call (after recording
    the attempt in ``attempted_batches``).
    """

    def __init__(
        self,
        *,
        lane: Callable[[Any], Hashable] | None = None,
        fail_open: Exception | None = None,
        fail_advance: Exception | None = None,
    ) -> None:
        self._lane = lane
        self.fail_open = fail_open
        self.fail_advance = fail_advance
        self.feed = InMemoryFeed()
        self.batches: list[tuple[AdvanceItem, ...]] = []  # completed advances, in order
        self.advanced_count = 0  # items of ``batches``, kept as they complete
        self.attempted_batches: list[tuple[AdvanceItem, ...]] = []  # every advance call
        self.open_count = 0
        self.aclose_count = 0
        self.fence_count = 0
        self.advancing = 0
        self.max_concurrent_advances = 0
        self._changed = _Condition()

    # -- feeding --------------------------------------------------------------------------

    async def put(self, raw: Any, broker_payload: Any = None) -> None:
        """Make ``(raw, broker_payload)`` the next event ``open_stream`` yields."""
        self.feed.put((raw, broker_payload))
        await anyio.lowlevel.checkpoint()

    def finish(self) -> None:
        """End ``open_stream`` after the events already put (the poll returns)."""
        self.feed.finish()

    # -- the producer ---------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        self.open_count += 1
        self._changed.notify()
        if self.fail_open is not None:
            raise self.fail_open
        async for item in self.feed:
            yield item

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return None if self._lane is None else self._lane(broker_payload)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.attempted_batches.append(tuple(batch))
        self.advancing += 1
        self.max_concurrent_advances = max(self.max_concurrent_advances, self.advancing)
        try:
            self._changed.notify()
            if self.fail_advance is not None:
                raise self.fail_advance
            await self._hold(batch)
            self.batches.append(tuple(batch))
            self.advanced_count += len(batch)
        finally:
            self.advancing -= 1
            self._changed.notify()

    async def _hold(self, batch: Sequence[AdvanceItem]) -> None:
        """Hook for subclasses: where an advance may block."""

    async def aclose(self) -> None:
        self.aclose_count += 1
        self._changed.notify()

    def fence(self) -> None:
        self.fence_count += 1
        self._changed.notify()

    # -- observing ------------------------------------------------------------------------

    @property
    def advanced(self) -> list[AdvanceItem]:
        """Every item of every completed advance, in advance order."""
        return [item for batch in self.batches for item in batch]

    @property
    def advanced_payloads(self) -> list[Any]:
        return [item.broker_payload for item in self.advanced]

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds (checked whenever this producer's state changes)."""
        await self._changed.wait_for(predicate)

    async def wait_for_advanced(self, count: int) -> None:
        """Wait until ``count`` items in total were advanced (checked in O(1) at every
        state change: a bench waits on this while thousands of batches complete)."""
        await self.wait_for(lambda: self.advanced_count >= count)

    async def wait_opened(self) -> None:
        await self.wait_for(lambda: self.open_count > 0)

    async def wait_closed(self) -> None:
        await self.wait_for(lambda: self.aclose_count > 0)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} opened={self.open_count} batches={len(self.batches)} "
            f"advancing={self.advancing} closed={self.aclose_count}>"
        )


class BlockingProducer(InMemoryProducer):
    """An ``InMemoryProducer`` whose ``advance`` blocks until ``release()``.

    ``cancelled_advances`` counts advances cancelled while blocked.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.blocked = 0
        self.cancelled_advances = 0
        self._released = 0
        self._release_all = False

    def release(self, count: int = 1) -> None:
        """Let ``count`` more advances through (blocked ones first)."""
        self._released += count
        self._changed.notify()

    def release_all(self) -> None:
        """Stop blocking: every current and future advance goes through."""
        self._release_all = True
        self._changed.notify()

    async def wait_blocked(self) -> None:
        """Wait until an advance is blocked."""
        await self.wait_for(lambda: self.blocked > 0)

    async def _hold(self, batch: Sequence[AdvanceItem]) -> None:
        self.blocked += 1
        self._changed.notify()
        try:
            while True:
                await self.wait_for(lambda: self._release_all or self._released > 0)
                if self._release_all:
                    break
                if self._released > 0:
                    self._released -= 1
                    break
        except anyio.get_cancelled_exc_class():
            self.cancelled_advances += 1
            raise
        finally:
            self.blocked -= 1


class SubscriberHarness:
    """Runs one trigger's ``filter_shared_stream`` against a manager as the triggerer does.

    Subscribes at construction (so the fan-out snapshot is deterministic); ``await run()``
    then pulls the filter, binds every trigger event it yields and (``auto_confirm``)
    confirms it persisted at once. ``pause()`` stops pulling after the current trigger
    event; ``error`` holds what the stream or filter raised; the subscriber unsubscribes when
    ``run`` ends, unless ``unsubscribe_on_exit`` is False.
    """

    def __init__(
        self,
        manager: SharedStreamManager,
        trigger: BaseEventTrigger,
        *,
        trigger_id: int,
        auto_confirm: bool = True,
        unsubscribe_on_exit: bool = True,
    ) -> None:
        self.manager = manager
        self.trigger = trigger
        self.trigger_id = trigger_id
        self.key = trigger.shared_stream_key()
        self.auto_confirm = auto_confirm
        self.unsubscribe_on_exit = unsubscribe_on_exit
        self.stream = manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=self.key)
        self.events: list[TriggerEvent] = []
        self.seqs: list[int | None] = []
        self.unconfirmed: list[int] = []
        self.error: Exception | None = None
        self.finished = False
        self._paused = False
        self._changed = _Condition()

    async def run(self) -> None:
        try:
            async for event in self.trigger.filter_shared_stream(self.stream):
                self._record(event)
                await self._changed.wait_for(lambda: not self._paused)
        except Exception as exc:  # noqa: BLE001 - recorded for the test to inspect
            self.error = exc
        finally:
            self.finished = True
            self._changed.notify()
            if self.unsubscribe_on_exit:
                await self.manager.unsubscribe(self.trigger_id, self.key)

    def _record(self, event: TriggerEvent) -> None:
        seq = self.manager.bind_pending_event(trigger_id=self.trigger_id, key=self.key)
        self.events.append(event)
        self.seqs.append(seq)
        if seq is not None:
            if self.auto_confirm:
                self.manager.confirm_persisted([seq])
            else:
                self.unconfirmed.append(seq)
        self._changed.notify()

    def confirm_all(self) -> None:
        """Confirm every trigger event recorded so far (``auto_confirm=False``)."""
        seqs, self.unconfirmed = self.unconfirmed, []
        self.manager.confirm_persisted(seqs)

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._changed.notify()

    @property
    def payloads(self) -> list[Any]:
        return [event.payload for event in self.events]

    async def wait_for_events(self, count: int) -> None:
        await self._changed.wait_for(lambda: len(self.events) >= count or self.finished)
        if len(self.events) < count:
            raise AssertionError(f"{self!r} ended before {count} events: {self.error!r}")

    async def wait_finished(self) -> None:
        await self._changed.wait_for(lambda: self.finished)

    def __repr__(self) -> str:
        return (
            f"<SubscriberHarness trigger_id={self.trigger_id!r} events={len(self.events)} "
            f"paused={self._paused} finished={self.finished} error={self.error!r}>"
        )
