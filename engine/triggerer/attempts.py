"""The attempts of one trigger's task: open its event source, fire its events, report its
failures, restart a failed watcher.

An attempt opens the event source (the trigger's own ``run()``, or for an event trigger
with a ``shared_stream_key()`` its ``filter_shared_stream()`` over a subscription to the
shared stream) and puts every ``TriggerEvent`` it yields into the outbox as a
``FiredEvent``, with its dedup key and its shared-stream sequence number. A ``TASK``
trigger ends after its first event; a ``WATCHER`` keeps running. Whatever goes wrong in an
attempt is a ``TriggerFailed`` in the outbox and a log line (an ERROR; for an unreachable
upstream one WARNING, then DEBUG lines while it stays down); a failed watcher restarts from
a fresh instance after a backoff (``failures``). After every attempt (event, failure or
cancellation) the source is closed, the subscription dropped and ``trigger.cleanup()``
awaited, shielded and bounded (``cleanup``).

``TriggerAttempts.run_trigger`` is the body of every trigger's task (``runtime`` spawns
and tracks the tasks): one frame of ours above the trigger's ``run()``, the attempt inline,
which the loop watchdog recognises (``trigger_in_frame``).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio

from engine.states import TriggerKind
from engine.triggerer.failures import Failure, rebuild, report
from engine.triggerer.outbox import FiredEvent
from shared_stream.keys import broker_kind
from triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent, classpath_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
    from types import FrameType

    from engine.triggerer.cleanup import Cleanups
    from engine.triggerer.failures import RestartPolicy
    from engine.triggerer.handles import TriggerHandle
    from engine.triggerer.outbox import Outbox

    DedupHook = Callable[[TriggerEvent], str | None]  # a trigger's bound dedup_key

__all__ = ("SharedStreamSubscriptions", "TriggerAttempts", "trigger_in_frame")

# These lines are about a trigger's task: they keep the runtime's logger name, which
# operators (and tests) filter on.
logger = logging.getLogger("engine.triggerer.runtime")

_DEFAULT_DEDUP_HOOK: Final = BaseEventTrigger.dedup_key


class SharedStreamSubscriptions(Protocol):
    """The part of ``SharedStreamManager`` the runner uses."""

    def subscribe(
        self, *, trigger_id: int, trigger: BaseEventTrigger, key: Hashable
    ) -> AsyncIterator[Any]: ...

    def bind_pending_event(self, *, trigger_id: int, key: Hashable) -> int | None: ...

    async def unsubscribe(
        self, trigger_id: int, key: Hashable, *, failed: bool = False
    ) -> None: ...


class TriggerAttempts:
    """Runs the attempts of each trigger's task and reports their outcomes to an outbox."""

    def __init__(
        self,
        *,
        outbox: Outbox,
        shared_streams: SharedStreamSubscriptions | None,
        cleanups: Cleanups,
        restarts: RestartPolicy,
        clock: Callable[[], float],
    ) -> None:
        self._outbox = outbox
        self._shared_streams = shared_streams
        self._cleanups = cleanups
        self._restarts = restarts
        self._clock = clock
        # Totals for the metrics endpoint (plain ints: fired is on the fan-out hot path).
        self.fired = 0  # trigger events put in the outbox
        self.failed = 0  # trigger failures put in the outbox

    def __repr__(self) -> str:
        return f"<TriggerAttempts fired={self.fired} failed={self.failed}>"

    async def run_trigger(self, handle: TriggerHandle) -> None:
        """The body of one trigger's task (``trigger_in_frame`` finds it by its code)."""
        trigger_id = handle.trigger_id
        if handle.previous is not None:
            await handle.wait_for_previous()
        previous: Failure | None = None  # the last failure of the current streak
        while True:
            started = self._clock()
            trigger = handle.trigger
            trigger.trigger_id = trigger_id
            dedup = _dedup_hook(trigger)
            key: Hashable | None = None
            source: Any = None
            failure: Failure | None = None
            try:
                key = self._shared_stream_key(trigger)
                source = self._open_source(trigger_id, trigger, key)
                if inspect.iscoroutine(source):
                    failure = Failure.returned(await source)
                else:
                    async for item in source:
                        failure = self._take(handle, item, key, dedup)
                        if failure is not None or handle.kind is TriggerKind.TASK:
                            break
                    else:
                        failure = Failure.exhausted(is_task=handle.kind is TriggerKind.TASK)
            except Exception as exc:  # noqa: BLE001 - the user-code boundary: a reported failure
                failure = Failure.from_exception(exc)
            finally:
                unsubscribe = self._unsubscribe(trigger_id, key, failed=failure is not None)
                await self._cleanups.end_attempt(handle, trigger, source, unsubscribe)
            if failure is None:
                return
            if failure.unavailable:  # name what it could not reach, for `sluice dags why`
                failure = replace(failure, broker=broker_kind(key, type(trigger)))
            previous = self._restarts.count(previous, failure, ran_s=self._clock() - started)
            if not await self._after_failure(handle, previous):
                return

    def _shared_stream_key(self, trigger: BaseTrigger) -> Hashable | None:
        if self._shared_streams is None or not isinstance(trigger, BaseEventTrigger):
            return None
        return trigger.shared_stream_key()

    def _open_source(self, trigger_id: int, trigger: BaseTrigger, key: Hashable | None) -> object:
        """The trigger's own ``run()``, or its filter over a subscription to the stream."""
        if key is None:
            return trigger.run()
        assert self._shared_streams is not None
        assert isinstance(trigger, BaseEventTrigger)
        stream = self._shared_streams.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)
        return trigger.filter_shared_stream(stream)

    def _unsubscribe(
        self, trigger_id: int, key: Hashable | None, *, failed: bool
    ) -> Callable[[], Awaitable[None]] | None:
        if key is None:
            return None
        assert self._shared_streams is not None
        return partial(self._shared_streams.unsubscribe, trigger_id, key, failed=failed)

    def _take(
        self, handle: TriggerHandle, item: object, key: Hashable | None, dedup: DedupHook | None
    ) -> Failure | None:
        """Fire ``item`` if it is a ``TriggerEvent``; the failure it is otherwise.

        The event's dedup key is computed here, once, and travels on its ``FiredEvent``;
        ``dedup`` is the trigger's ``dedup_key`` hook (None: the event's own key stands).
        """
        if not isinstance(item, TriggerEvent):
            return Failure.not_an_event(item)
        # Before binding: a hook that raises fails the trigger with nothing bound to it.
        dedup_key = item.dedup_key if dedup is None else dedup(item)
        if dedup is not None and dedup_key is not None and not isinstance(dedup_key, str):
            if inspect.iscoroutine(dedup_key):
                dedup_key.close()  # never awaited: say so instead of a RuntimeWarning
            return Failure.bad_dedup_key(dedup_key)
        seq: int | None = None
        if key is not None:
            assert self._shared_streams is not None
            seq = self._shared_streams.bind_pending_event(trigger_id=handle.trigger_id, key=key)
        self._outbox.put_nowait(
            FiredEvent(handle.trigger_id, item, seq, self._clock(), handle.watcher, dedup_key)
        )
        self.fired += 1
        level = logging.INFO if handle.kind is TriggerKind.TASK else logging.DEBUG
        if logger.isEnabledFor(level):  # no log record built per watcher event otherwise
            logger.log(
                level,
                "Trigger %s fired: %r",
                handle.trigger_id,
                item,
                extra={"action": "trigger_fired", "trigger_id": handle.trigger_id, "seq": seq},
            )
        return None

    # -- after a failure: report, and restart a watcher ----------------------------------

    async def _after_failure(self, handle: TriggerHandle, failure: Failure) -> bool:
        """Report ``failure``; for a watcher wait its backoff and rebuild it (False: end)."""
        if handle.kind is TriggerKind.TASK:
            self.report(handle.trigger_id, handle.kind, failure)
            return False
        self.report(
            handle.trigger_id,
            handle.kind,
            failure,
            restart_in_s=failure.backoff_s,
            max_backoff_s=self._restarts.max_s,
        )
        if handle.stopping:  # stopped while it cleaned up
            return False
        await anyio.sleep(failure.backoff_s)
        return self._recreate(handle, quiet=failure.unavailable)

    def _recreate(self, handle: TriggerHandle, *, quiet: bool = False) -> bool:
        """Replace the failed watcher with a fresh instance built from its kwargs.

        ``quiet``: a retry against an unavailable upstream, logged at DEBUG (the failure's
        warning already said it would retry).
        """
        old = handle.trigger
        try:
            handle.trigger = rebuild(old)
        except Exception as exc:  # noqa: BLE001 - user code: becomes a reported failure
            self.report(handle.trigger_id, handle.kind, Failure.from_exception(exc).not_rebuilt())
            return False
        logger.log(
            logging.DEBUG if quiet else logging.INFO,
            "Restarting watcher trigger %s (%s)",
            handle.trigger_id,
            classpath_of(old),
            extra={"action": "trigger_restart", "trigger_id": handle.trigger_id},
        )
        return True

    def report(
        self,
        trigger_id: int,
        kind: TriggerKind,
        failure: Failure,
        *,
        restart_in_s: float | None = None,
        max_backoff_s: float | None = None,
    ) -> None:
        """Put ``failure`` in the outbox (with the restart a watcher waits for, if any)."""
        self._outbox.put_nowait(
            report(
                trigger_id, kind, failure, restart_in_s=restart_in_s, max_backoff_s=max_backoff_s
            )
        )
        self.failed += 1


_TASK_BODY_CODE: Final = TriggerAttempts.run_trigger.__code__


def trigger_in_frame(frame: FrameType) -> tuple[int | None, str] | None:
    """(trigger id, classpath) when ``frame`` is the body of a trigger's task, else None.

    For the loop watchdog, which walks the loop thread's stack from its own thread.
    """
    if frame.f_code is not _TASK_BODY_CODE:
        return None
    local = frame.f_locals
    handle = local.get("handle")
    classpath = classpath_of(handle.trigger) if handle is not None else "?"
    trigger_id = local.get("trigger_id")
    return (trigger_id if isinstance(trigger_id, int) else None), classpath


def _dedup_hook(trigger: BaseTrigger) -> DedupHook | None:
    """``trigger.dedup_key``, or None where it would return each event's own key.

    Resolved once per attempt: for an event trigger that neither overrides the hook nor sets
    ``dedup_by_payload`` (and for a deferred task's trigger, which has no hook) the runtime
    takes ``event.dedup_key`` as is, without a call per event on the fan-out path.
    """
    if not isinstance(trigger, BaseEventTrigger):
        return None
    if type(trigger).dedup_key is _DEFAULT_DEDUP_HOOK and not trigger.dedup_by_payload:
        return None
    return trigger.dedup_key
