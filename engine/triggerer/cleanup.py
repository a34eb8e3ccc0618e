"""The end of a trigger's attempt, and its ``on_kill``: user code on the way out, contained.

Theory of operation. After every attempt, whatever happened (event, failure, cancellation),
``Cleanups.end_attempt`` closes the event source, drops the shared-stream subscription and
awaits ``trigger.cleanup()``, each shielded and bounded by the cleanup timeout (and, once
the runner closes, by its grace: ``close_by``). While it cleans up, a task is not cancelled
(``TriggerHandle.cancel`` only marks it stopping; it ends after the cleanup).

What goes wrong here is logged at ERROR with the trigger id and *not* put in the outbox:
every ``TriggerFailed`` of a ``TASK`` trigger fails its deferred task, and a cleanup that
raised (or timed out) after the event fired must neither fail the task nor keep the event
from being persisted; after a cancellation nothing at all is reported. The same holds for
an exception raised while closing the event source (its ``finally`` blocks), and for
``on_kill()``, which ``stop(kill=True)`` calls synchronously.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING

import anyio

from triggers.base import classpath_of

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from engine.triggerer.handles import TriggerHandle
    from triggers.base import BaseTrigger

__all__ = ("Cleanups", "call_on_kill")

# These lines are about a trigger's task: they keep the runtime's logger name, which
# operators (and tests) filter on.
logger = logging.getLogger("engine.triggerer.runtime")


class Cleanups:
    """The shielded, bounded end of every attempt of one runner."""

    __slots__ = ("_closing_by", "_scopes", "_timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._scopes: set[anyio.CancelScope] = set()
        self._closing_by: float | None = None  # the runner's grace ends (anyio.current_time)

    def close_by(self, deadline: float) -> None:
        """Bound every cleanup, running or to come, by ``deadline`` (``anyio.current_time``)."""
        if self._closing_by is None or deadline < self._closing_by:
            self._closing_by = deadline
        for scope in self._scopes:
            scope.deadline = min(scope.deadline, deadline)

    async def end_attempt(
        self,
        handle: TriggerHandle,
        trigger: BaseTrigger,
        source: object,
        unsubscribe: Callable[[], Awaitable[None]] | None,
    ) -> None:
        """Close ``source``, ``unsubscribe`` (a subscriber's), await ``trigger.cleanup()``."""
        trigger_id = handle.trigger_id
        handle.cleaning = True
        try:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await self._bounded(trigger_id, "closing its event source", aclose)
            elif inspect.iscoroutine(source):
                source.close()  # cancelled before it was awaited: no "never awaited" warning
            if unsubscribe is not None:
                await self._bounded(trigger_id, "unsubscribing from the shared stream", unsubscribe)
            await self._bounded(trigger_id, "running cleanup()", trigger.cleanup)
        finally:
            handle.cleaning = False

    async def _bounded(
        self, trigger_id: int, what: str, func: Callable[[], Awaitable[object]]
    ) -> None:
        """Await ``func()`` shielded, within the cleanup timeout; log what goes wrong."""
        now = anyio.current_time()
        deadline = now + self._timeout_s
        if self._closing_by is not None:
            deadline = min(deadline, self._closing_by)
        scope = anyio.CancelScope(deadline=deadline, shield=True)
        self._scopes.add(scope)
        try:
            with scope:
                await func()
        except Exception:
            logger.exception(
                "Trigger %s failed while %s; ignored (an event it fired is still persisted)",
                trigger_id,
                what,
                extra={"action": "trigger_cleanup_failed", "trigger_id": trigger_id},
            )
        finally:
            self._scopes.discard(scope)
        if scope.cancelled_caught:
            logger.error(
                "Trigger %s did not finish %s within %.2fs; abandoned it. Keep cleanup "
                "short and make it async",
                trigger_id,
                what,
                scope.deadline - now,
                extra={"action": "trigger_cleanup_timeout", "trigger_id": trigger_id},
            )

    def __len__(self) -> int:
        """Steps running now."""
        return len(self._scopes)

    def __repr__(self) -> str:
        return f"<Cleanups running={len(self._scopes)} closing_by={self._closing_by}>"


def call_on_kill(trigger: BaseTrigger, trigger_id: int) -> None:
    """Call the trigger's (synchronous) ``on_kill``; a failure is logged, never raised.

    An ``async def on_kill`` would only create a coroutine here (``stop`` cannot await):
    it is closed unrun and reported as an error rather than silently skipped.
    """
    extra = {"action": "trigger_on_kill_failed", "trigger_id": trigger_id}
    on_kill: Callable[[], object] = trigger.on_kill  # a user's may be (wrongly) async
    try:
        result = on_kill()
    except Exception:
        logger.exception("Trigger %s on_kill() raised; stopping it anyway", trigger_id, extra=extra)
        return
    if inspect.iscoroutine(result):
        result.close()
        logger.error(
            "Trigger %s (%s): on_kill() is an async def, so it did not run; make it a plain "
            "def (release async resources in cleanup(), which is awaited); stopping it anyway",
            trigger_id,
            classpath_of(trigger),
            extra=extra,
        )
