"""Time triggers: fire at a moment (``DateTimeTrigger``) or after a delay (``TimeDeltaTrigger``).

Both sleep once for the remaining time (measured against the UTC wall clock) and re-check
after waking, so an idle trigger costs one timer, not a poll loop. They are the cheapest and
most numerous triggers a triggerer runs (every deferred ``sleep``), hence ``__slots__``.

``asyncio`` is imported where a trigger waits (``_wake_after``), never at import: a deferrable
sensor's DAG file imports this module in every task process and every parse, which run no
event loop (asyncio is a quarter of a cold task process's DAG-file import).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent, classpath_of

if TYPE_CHECKING:
    import asyncio
    from collections.abc import AsyncIterator


def _wake_after(delay_s: float) -> tuple[asyncio.Future[None], asyncio.TimerHandle]:
    """A future done after ``delay_s``, and its timer (cancel it when done waiting).

    This is ``asyncio.sleep()`` without its coroutine: ``anyio.sleep`` stacks three
    coroutine frames (~650 bytes) on every sleeping trigger. Cancelling the awaiting task
    (``Task.cancel()`` or an anyio cancel scope) cancels the future as it would a sleep.
    """
    import asyncio  # where a trigger waits: the triggerer has it loaded already

    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    return waiter, loop.call_later(delay_s, _set_unless_cancelled, waiter)


def _set_unless_cancelled(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # cancelled while the timer was due
        waiter.set_result(None)


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


class DateTimeTrigger(BaseTrigger):
    """Fires once ``moment`` (a timezone-aware datetime) has passed.

    Yields ``TriggerEvent(moment)`` (the moment in UTC), or ``TaskSuccessEvent()`` when
    ``end_from_trigger`` is set, which ends the deferred task without a worker.
    """

    __slots__ = ("end_from_trigger", "moment")

    def __init__(self, moment: datetime, *, end_from_trigger: bool = False) -> None:
        super().__init__()
        if not isinstance(moment, datetime):
            raise TypeError(
                f"{type(self).__name__} moment must be a datetime, got {type(moment).__name__}"
            )
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise ValueError(
                f"{type(self).__name__} got a naive datetime ({moment.isoformat()}); pass a "
                "timezone-aware one, e.g. datetime(..., tzinfo=timezone.utc)"
            )
        self.moment: datetime = moment.astimezone(UTC)
        self.end_from_trigger: bool = bool(end_from_trigger)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # Always the DateTimeTrigger classpath: a TimeDeltaTrigger is stored as its moment.
        return (
            classpath_of(DateTimeTrigger),
            {"moment": self.moment, "end_from_trigger": self.end_from_trigger},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # One timer per wake-up; re-checked after waking because the loop's monotonic clock
        # and the wall clock can drift apart during a long sleep. No sleep coroutine: every
        # frame counts when 100,000 of these sleep at once (see ``_wake_after``).
        while (remaining_s := (self.moment - utcnow()).total_seconds()) > 0:
            waiter, timer = _wake_after(remaining_s)
            try:
                await waiter
            finally:
                timer.cancel()
        if self.end_from_trigger:
            yield TaskSuccessEvent()
        else:
            yield TriggerEvent(self.moment)


class TimeDeltaTrigger(DateTimeTrigger):
    """Fires once ``delta`` has passed since construction.

    The moment is computed once, here: the trigger serializes as a ``DateTimeTrigger`` with
    that moment, so a trigger moved to another triggerer does not start its delay again.
    """

    __slots__ = ()

    def __init__(self, delta: timedelta, *, end_from_trigger: bool = False) -> None:
        if not isinstance(delta, timedelta):
            raise TypeError(
                f"TimeDeltaTrigger delta must be a timedelta, got {type(delta).__name__}"
            )
        super().__init__(utcnow() + delta, end_from_trigger=end_from_trigger)
