"""Test doubles for people writing and running triggers.

- ``run_trigger_until_event`` / ``collect_events`` drive a trigger's ``run()`` the way the
  triggerer does (close the generator, then ``cleanup()``), bounded in time.
- ``ManualTrigger`` is an event trigger that fires when a test says so:
  ``ManualTrigger.channel("name").fire(payload)``. Useful to drive an engine end to end
  without a real upstream.
- ``ReplayTrigger`` yields a fixed list of ``(payload, dedup_key)`` events, then waits:
  what a test of deduplication (or of a trigger's ``dedup_key`` hook) needs.

Everything here runs on the event loop thread; ``fire`` is not thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, ClassVar, Final

import anyio

from triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent, classpath_of
from triggers.exceptions import TriggerContractError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from anyio.streams.memory import MemoryObjectSendStream

CLEANUP_TIMEOUT_S: Final = 5.0


# ASYNC109: the timeout is the helper's point, it bounds the whole run-and-cleanup sequence.
async def collect_events(
    trigger: BaseTrigger,
    n: int,
    *,
    timeout: float = 5.0,  # noqa: ASYNC109
) -> list[TriggerEvent]:
    """Run ``trigger`` until it yielded ``n`` events; then close ``run()`` and await ``cleanup()``.

    Raises ``TimeoutError`` after ``timeout`` seconds, and ``TriggerContractError`` if
    ``run()`` ends before yielding ``n`` events.
    """
    if n < 1:
        raise ValueError(f"collect_events needs n >= 1, got {n}")
    events: list[TriggerEvent] = []
    run = trigger.run()
    try:
        with anyio.fail_after(timeout):
            async for event in run:
                events.append(event)
                if len(events) == n:
                    return events
        raise TriggerContractError(
            f"{trigger!r}: run() ended after {len(events)} of {n} expected events"
        )
    finally:
        # Like the triggerer: closing and cleanup run even when cancelled, but bounded.
        with anyio.move_on_after(CLEANUP_TIMEOUT_S, shield=True):
            if isinstance(run, AsyncGenerator):
                await run.aclose()
            await trigger.cleanup()


async def run_trigger_until_event(
    trigger: BaseTrigger,
    *,
    timeout: float = 5.0,  # noqa: ASYNC109
) -> TriggerEvent:
    """Run ``trigger`` until its first event; then close ``run()`` and await ``cleanup()``."""
    (event,) = await collect_events(trigger, 1, timeout=timeout)
    return event


class ManualTriggerChannel:
    """Where a test fires events for every ``ManualTrigger`` of one name.

    A payload fired while no trigger of that name is running waits in a backlog and goes to
    the first one that starts; otherwise every running trigger of the name receives it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.backlog: list[tuple[Any, str | None]] = []
        self._subscribers: list[MemoryObjectSendStream[tuple[Any, str | None]]] = []
        self._waiters: list[anyio.Event] = []

    @property
    def subscriber_count(self) -> int:
        """How many triggers of this name are running."""
        return len(self._subscribers)

    def fire(self, payload: Any, *, dedup_key: str | None = None) -> None:
        """Make the running triggers of this name yield ``TriggerEvent(payload)``."""
        TriggerEvent(payload)  # fail here, in the test, on a payload that cannot be stored
        if not self._subscribers:
            self.backlog.append((payload, dedup_key))
            return
        for send in self._subscribers:
            send.send_nowait((payload, dedup_key))

    async def wait_subscribed(self, count: int = 1) -> None:
        """Wait until at least ``count`` triggers of this name are running."""
        while len(self._subscribers) < count:
            waiter = anyio.Event()
            self._waiters.append(waiter)
            await waiter.wait()

    async def events(self) -> AsyncGenerator[TriggerEvent, None]:
        """Subscribe; yield an event per fired payload until closed."""
        send, receive = anyio.create_memory_object_stream[tuple[Any, str | None]](math.inf)
        for item in self.backlog:
            send.send_nowait(item)
        self.backlog.clear()
        self._subscribers.append(send)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.set()
        try:
            async with receive:
                async for payload, dedup_key in receive:
                    yield TriggerEvent(payload, dedup_key=dedup_key)
        finally:
            self._subscribers.remove(send)
            send.close()

    def __repr__(self) -> str:
        return (
            f"<ManualTriggerChannel name={self.name!r} subscribers={len(self._subscribers)} "
            f"backlog={len(self.backlog)}>"
        )


class ReplayTrigger(BaseEventTrigger):
    """Yields ``TriggerEvent(payload, dedup_key=key)`` for each ``(payload, key)`` pair, then
    waits forever (a watcher keeps running). Subclass it to try ``dedup_by_payload`` or a
    ``dedup_key`` hook."""

    def __init__(self, events: tuple[tuple[Any, str | None], ...]) -> None:
        super().__init__()
        self.events = events

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {"events": self.events}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        for payload, key in self.events:
            yield TriggerEvent(payload, dedup_key=key)
        await anyio.sleep(math.inf)


class ManualTrigger(BaseEventTrigger):
    """An event trigger that yields one event per ``ManualTrigger.channel(name).fire(...)``.

    Channels live in a class-level registry; call ``ManualTrigger.reset()`` between tests.
    """

    _channels: ClassVar[dict[str, ManualTriggerChannel]] = {}

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    @classmethod
    def channel(cls, name: str) -> ManualTriggerChannel:
        """The channel of ``name`` (created on first use)."""
        found = cls._channels.get(name)
        if found is None:
            found = cls._channels[name] = ManualTriggerChannel(name)
        return found

    @classmethod
    def reset(cls) -> None:
        """Forget every channel and its backlog."""
        cls._channels.clear()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (classpath_of(self), {"name": self.name})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        events = self.channel(self.name).events()
        async with aclosing(events):
            async for event in events:
                yield event
