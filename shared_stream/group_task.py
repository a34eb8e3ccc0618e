"""The task of one shared-stream group: its poll, and in ack mode its advancer and timer.

``GroupTask.run()`` is what the group's task runs (the manager names it
``shared-stream-poll[<key repr>]``). It polls the upstream and hands each raw event to its
group, which fans it out (``TaskPort``); in ack mode it also runs one advancer task (at most
one ``producer.advance`` in flight, see ``advancer``) and one timer task (ack timeouts by
deadline, see ``timer``), and closes the producer at the end. It owns the cancel scopes the
group's ``begin_stop`` and ``terminate`` end it with, the slot of the batch to advance and
the timer; the group owns everything else (subscribers, ledger, counters) and this module
only awaits I/O.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import anyio
import anyio.lowlevel

from shared_stream.advancer import AdvanceSlot, send_advance
from shared_stream.exceptions import SharedStreamTerminated
from shared_stream.subscriber import forget_current_stream
from shared_stream.timer import DeadlineTimer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Hashable

    from shared_stream.effects import AdvanceBatch
    from shared_stream.producer import SharedStreamProducer
    from shared_stream.settings import GroupSettings
    from shared_stream.stats import GroupCounters
    from triggers.base import BaseEventTrigger

logger = logging.getLogger(__name__)

# The poll yields to the subscribers after this many broadcasts at most (or as soon as a
# queue is half full): bursts are fanned out in batches, each subscriber wakes once per batch.
YIELD_EVERY_EVENTS: Final = 64
# How often an advance that the owner's lease holds back asks again (``may_advance``).
LEASE_POLL_S: Final = 0.05


class TaskPort(Protocol):
    """What a group's task needs of its group (``group.SharedStreamGroup``)."""

    key: Hashable
    trigger_cls: type[BaseEventTrigger]
    kwargs: dict[str, Any]
    settings: GroupSettings
    counters: GroupCounters
    stopping: bool
    terminated: bool
    away: dict[int, float]

    @property
    def mode(self) -> Literal["fast", "ack"]: ...

    def fan_out(self, seq: int, raw: Any) -> bool: ...

    async def wait_for_cohort(self, bound_s: float) -> None: ...

    async def wait_for_returns(self) -> None: ...

    def broadcast(self, item: tuple[Any, Any], producer: SharedStreamProducer) -> bool: ...

    def terminate(self, error: BaseException) -> None: ...

    def check_timeouts(self, now: float) -> None: ...

    def next_deadline(self) -> float | None: ...

    def advanced(self, batch: AdvanceBatch, elapsed_s: float) -> None: ...


class GroupTask:
    """The poll, advancer and timer of one group, and the scopes that end them."""

    def __init__(self, group: TaskPort) -> None:
        self.group = group
        self.producer: SharedStreamProducer | None = None
        self.slot = AdvanceSlot(group.settings.clock)  # the batch the advancer sends next
        self.timer = DeadlineTimer(group.settings.clock)
        self._scope = anyio.CancelScope()  # the whole group (terminate, forced stop)
        self._poll_scope = anyio.CancelScope()
        self._timer_scope = anyio.CancelScope()
        self._drain_deadline = math.inf

    async def run(self) -> None:
        """Poll until stopped or failed, then close the producer."""
        group = self.group
        forget_current_stream()  # inherited from the subscribing task; not ours
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    if group.mode == "ack":
                        tg.start_soon(
                            self._advance_loop, name=f"shared-stream-advance[{group.key!r}]"
                        )
                        tg.start_soon(self._timer_loop, name=f"shared-stream-timer[{group.key!r}]")
                    with self._poll_scope:
                        await self._poll()
            if self._scope.cancelled_caught and not group.terminated:
                logger.warning(
                    "Shared stream group key=%r did not drain within the stop grace period of "
                    "%ss; cancelled it (events not advanced yet are redelivered)",
                    group.key,
                    group.settings.stop_grace_s,
                    extra={"action": "shared_stream.drain_timeout"},
                )
        finally:
            with anyio.CancelScope(shield=True):
                await self._close_producer()

    def stop(self) -> None:
        """Stop polling and timing out; the advancer drains until the stop grace period
        ends, then the whole task is cancelled."""
        self._drain_deadline = anyio.current_time() + self.group.settings.stop_grace_s
        self._scope.deadline = self._drain_deadline
        self._poll_scope.cancel()
        self._timer_scope.cancel()
        self.slot.wake()

    def cancel(self) -> None:
        """End the task now: nothing more is advanced."""
        self.slot.clear()
        self._scope.cancel()

    def fence(self) -> None:
        """The owner lost its lease: the producer stops talking to its broker at once
        (synchronously, before any other task of the loop runs), then the task ends."""
        producer = self.producer
        if producer is not None:
            try:
                producer.fence()
            except Exception:
                logger.exception(
                    "Fencing the producer of shared stream key=%r failed; closing it",
                    self.group.key,
                    extra={"action": "shared_stream.fence_failed"},
                )
        self.cancel()

    async def _poll(self) -> None:
        group = self.group
        try:
            await group.wait_for_cohort(group.settings.cohort_return_s)
            if group.settings.cohort_grace_s > 0:
                await anyio.sleep(group.settings.cohort_grace_s)
            if group.mode == "fast":
                await self._poll_upstream(group.trigger_cls.open_shared_stream(group.kwargs))
            else:
                self.producer = group.trigger_cls.create_shared_stream_producer(group.kwargs)
                await self._poll_upstream(self.producer.open_stream(), self.producer)
        except Exception as exc:  # noqa: BLE001 - user-code boundary: any error ends the group
            if not group.stopping:
                group.terminate(exc)
            else:
                logger.warning(
                    "Shared stream poll key=%r raised while stopping: %r",
                    group.key,
                    exc,
                    extra={"action": "shared_stream.poll_error_on_stop"},
                )
            return
        if group.stopping:
            return
        group.terminate(
            SharedStreamTerminated(
                f"the shared stream poll of key={group.key!r} ended; open_shared_stream() / "
                "open_stream() must yield for the group's whole lifetime (loop forever)"
            )
        )

    async def _poll_upstream(
        self, stream: AsyncIterator[Any], producer: SharedStreamProducer | None = None
    ) -> None:
        """Hand each raw event (ack mode: with its broker payload) to the group; let the
        subscribers run after ``YIELD_EVERY_EVENTS`` or when a queue is half full."""
        group = self.group
        counters, fan_out, broadcast = group.counters, group.fan_out, group.broadcast
        away = group.away  # ack mode: subscribers that failed, expected back
        unyielded = 0
        try:
            async for item in stream:
                if away:  # what they failed is back from the broker: they must see it too
                    await group.wait_for_returns()
                counters.events_polled += 1
                unyielded += 1
                crowded = fan_out(0, item) if producer is None else broadcast(item, producer)
                if crowded or unyielded >= YIELD_EVERY_EVENTS:
                    unyielded = 0
                    await anyio.lowlevel.checkpoint()
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _advance_loop(self) -> None:
        group = self.group
        while True:
            taken = self.slot.take()
            if taken is None:
                if group.stopping:
                    return
                await self.slot.wait()
                continue
            batch, dispatched_at = taken
            assert self.producer is not None
            while not group.settings.may_advance():  # noqa: ASYNC110 - a lease: time, no event
                await anyio.sleep(LEASE_POLL_S)  # (a fenced manager cancels this task)
            drain_deadline = self._drain_deadline if group.stopping else None
            try:
                completed = await send_advance(self.producer, batch, drain_deadline=drain_deadline)
            except Exception as exc:  # noqa: BLE001 - user-code boundary: any error ends the group
                group.terminate(exc)
                return
            if not completed or group.terminated:
                return
            group.advanced(batch, group.settings.clock() - dispatched_at)

    async def _timer_loop(self) -> None:
        group = self.group
        with self._timer_scope:
            while True:
                if await self.timer.wait_until(group.next_deadline()):
                    group.check_timeouts(group.settings.clock())

    async def _close_producer(self) -> None:
        producer = self.producer
        if producer is None:
            return
        with anyio.move_on_after(self.group.settings.stop_grace_s):
            try:
                await producer.aclose()
            except Exception:
                logger.exception(
                    "Closing the producer of shared stream key=%r failed",
                    self.group.key,
                    extra={"action": "shared_stream.aclose_failed"},
                )

    def __repr__(self) -> str:
        return f"<GroupTask key={self.group.key!r} slot={self.slot!r} timer={self.timer!r}>"
