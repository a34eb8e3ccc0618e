"""What one trigger's task does: attempts, events, failures, watcher restarts, cleanup.

Theory of operation. The task body (``TriggerTasks.run_trigger``) runs *attempts*: an
attempt sets ``trigger.trigger_id``, opens the event source (``trigger.run()``, or for an
event trigger with a ``shared_stream_key()`` its ``filter_shared_stream()`` over a
subscription to the shared stream), and puts every ``TriggerEvent`` it yields into the
outbox as a ``FiredEvent``. A ``TASK`` trigger ends after its first event; a ``WATCHER``
trigger keeps running. Every way an attempt can go wrong ends in a ``TriggerFailed`` in the
outbox and an ERROR log line carrying the trigger id; a failed watcher is restarted after a
backoff (doubling from the initial to the maximum backoff, back to the start after a run of
``healthy_run_s``) from a fresh instance rebuilt from ``trigger.serialize()``.

After every attempt, whatever happened (event, failure, cancellation), the event source is
closed, the shared-stream subscription dropped and ``trigger.cleanup()`` awaited, each
shielded and bounded by ``cleanup_timeout_s`` (and, once the runner closes, by its grace).
While it cleans up, a task is not cancelled (``TriggerHandle.cancel`` only marks it
stopping; it ends after the cleanup).

Cleanup failures are logged at ERROR with the trigger id and are *not* put in the outbox:
every ``TriggerFailed`` of a ``TASK`` trigger fails its deferred task, and a cleanup that
raised (or timed out) after the event fired must neither fail the task nor keep the event
from being persisted; after a cancellation nothing at all is reported. The same holds for
an exception raised while closing the event source (its ``finally`` blocks).

Memory: 100,000 of these wait at once, so the idle path is one frame of ours
(``run_trigger``, with the attempt inline) above the trigger's ``run()``, and the per-trigger
state is one slotted ``TriggerHandle``. Restarts and failures take the slow path.
"""

from __future__ import annotations

import inspect
import logging
import traceback
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio

from engine.triggerer.outbox import FiredEvent, TriggerFailed, TriggerKind
from triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent, classpath_of
from triggers.exceptions import TriggerContractError

if TYPE_CHECKING:
    import asyncio
    from collections.abc import AsyncIterator, Callable, Hashable, Iterator

    from engine.triggerer.outbox import Outbox

    DedupHook = Callable[[TriggerEvent], str | None]  # a trigger's bound dedup_key

# The runtime's records keep the public module's logger name (operators filter on it).
logger = logging.getLogger("engine.triggerer.runtime")

EXITED_WITHOUT_EVENT: Final = "Trigger exited without sending an event"
WATCHER_EXITED: Final = "watcher trigger exited; event triggers must keep running"
RETURNED_EVENT: Final = (
    "run() returned a TriggerEvent instead of yielding it; "
    "make run() an async generator (use `yield`)"
)
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


@dataclass(slots=True)
class _Failure:
    reason: str
    traceback: str | None = None
    in_row: int = 1  # failures of this watcher in a row, this one included
    repeats: bool = False  # the one before it failed with the same reason

    @classmethod
    def from_exception(cls, exc: BaseException) -> _Failure:
        return cls(repr(exc), "".join(traceback.format_exception(exc)))

    @classmethod
    def returned(cls, result: object) -> _Failure:
        if isinstance(result, TriggerEvent):
            return cls(RETURNED_EVENT)
        return cls(
            f"run() returned {type(result).__name__} instead of yielding TriggerEvents; "
            "make run() an async generator (use `yield`)"
        )


class TriggerHandle:
    """Per-trigger state: one per running task, so kept to a few slots."""

    __slots__ = (
        "cleaning",
        "done",
        "kind",
        "on_end",
        "previous",
        "stopping",
        "task",
        "trigger",
        "trigger_id",
        "watcher",
    )

    def __init__(
        self,
        trigger_id: int,
        trigger: BaseTrigger,
        kind: TriggerKind,
        previous: TriggerHandle | None,
        on_end: Callable[[TriggerHandle, asyncio.Task[None]], None],
        watcher: tuple[int, str] | None = None,
    ) -> None:
        self.trigger_id = trigger_id
        self.watcher = watcher  # (asset id, watcher name) of a watcher trigger
        self.kind = kind
        self.trigger = trigger  # replaced by a fresh instance on a watcher restart
        # Set right after spawning, back to None once the task ended and was accounted for.
        self.task: asyncio.Task[None] | None = None
        self.stopping = False
        self.cleaning = False  # in the shielded end of an attempt: not cancelled there
        # Set when this task ended; only created when a successor has to wait for it.
        self.done: anyio.Event | None = None
        # The stopped task of the same trigger id still cleaning up, if any.
        self.previous = previous
        self.on_end = on_end  # the runner's bookkeeping, one bound method for every handle

    def __call__(self, task: asyncio.Task[None]) -> None:
        """The task's done callback: the handle itself, so no closure per task."""
        self.on_end(self, task)

    def cancel(self) -> None:
        """Stop the task: cancel it now, or (while it cleans up) let it end after that.

        Calling it again cancels again, for a trigger that swallowed the cancellation.
        """
        self.stopping = True
        if not self.cleaning and self.task is not None:
            self.task.cancel()

    def live_chain(self) -> Iterator[TriggerHandle]:
        """This handle and the stopped predecessors it waits for, those not ended yet."""
        handle: TriggerHandle | None = self
        while handle is not None:
            if handle.task is not None:
                yield handle
            handle = handle.previous

    def __repr__(self) -> str:
        state = "stopping" if self.stopping else "running"
        return f"<TriggerHandle {self.trigger_id} {self.kind.value} {state}>"


async def _wait_for_previous(handle: TriggerHandle) -> None:
    previous = handle.previous
    while previous is not None:
        if previous.done is not None:
            await previous.done.wait()
        previous = previous.previous
    handle.previous = None


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


def _rebuild(trigger: BaseTrigger) -> BaseTrigger:
    """A fresh instance from ``trigger.serialize()``, imported from nowhere.

    The class is the one the classpath names, found in the trigger's own MRO (a trigger
    may serialize as a base class, as ``TimeDeltaTrigger`` does as ``DateTimeTrigger``).
    """
    classpath, kwargs = trigger.serialize()
    for cls in type(trigger).__mro__:
        if issubclass(cls, BaseTrigger) and classpath_of(cls) == classpath:
            return cls(**kwargs)
    raise TriggerContractError(
        f"{classpath_of(trigger)}.serialize() names {classpath}, which is neither its class "
        "nor one of its bases; return the classpath of the class that rebuilds it"
    )


class TriggerTasks:
    """The body of every trigger's task, and what those bodies share (one per runner)."""

    def __init__(
        self,
        *,
        outbox: Outbox,
        shared_streams: SharedStreamSubscriptions | None,
        cleanup_timeout_s: float,
        restart_backoff_s: tuple[float, float],
        healthy_run_s: float,
        clock: Callable[[], float],
    ) -> None:
        initial_s, max_s = restart_backoff_s
        if not 0 <= initial_s <= max_s:
            raise ValueError(f"restart_backoff_s must be (initial, max), got {restart_backoff_s}")
        self._outbox = outbox
        self._shared_streams = shared_streams
        self._cleanup_timeout_s = cleanup_timeout_s
        self._backoff_initial_s = initial_s
        self._backoff_max_s = max_s
        self._healthy_run_s = healthy_run_s
        self._clock = clock
        self._bounded_scopes: set[anyio.CancelScope] = set()
        self._closing_deadline: float | None = None
        # Totals for the metrics endpoint (plain ints: fired is on the fan-out hot path).
        self.fired = 0
        self.failed = 0

    def close_by(self, deadline: float) -> None:
        """Bound every cleanup, running or to come, by ``deadline`` (``anyio.current_time``)."""
        if self._closing_deadline is None or deadline < self._closing_deadline:
            self._closing_deadline = deadline
        for scope in self._bounded_scopes:
            scope.deadline = min(scope.deadline, deadline)

    def __repr__(self) -> str:
        return (
            f"<TriggerTasks cleanups={len(self._bounded_scopes)} "
            f"closing_deadline={self._closing_deadline}>"
        )

    # -- the task body -------------------------------------------------------------------

    async def run_trigger(self, handle: TriggerHandle) -> None:
        """The body of one trigger's task (``LoopWatchdog`` finds this frame by its code)."""
        trigger_id = handle.trigger_id
        if handle.previous is not None:
            await _wait_for_previous(handle)
        backoff_s: float | None = self._backoff_initial_s
        previous: _Failure | None = None  # the last failure of the current streak
        while backoff_s is not None:
            started = self._clock()
            trigger = handle.trigger
            trigger.trigger_id = trigger_id
            dedup = _dedup_hook(trigger)
            key: Hashable | None = None
            source: Any = None
            failure: _Failure | None = None
            try:
                key = self._shared_stream_key(trigger)
                source = self._open_source(trigger_id, trigger, key)
                if inspect.iscoroutine(source):
                    failure = _Failure.returned(await source)
                else:
                    async for item in source:
                        failure = self._take(handle, item, key, dedup)
                        if failure is not None or handle.kind is TriggerKind.TASK:
                            break
                    else:
                        failure = _Failure(
                            EXITED_WITHOUT_EVENT
                            if handle.kind is TriggerKind.TASK
                            else WATCHER_EXITED
                        )
            except Exception as exc:  # noqa: BLE001 - the user-code boundary: a reported failure
                failure = _Failure.from_exception(exc)
            finally:
                await self._end_attempt(handle, trigger, source, key, failed=failure is not None)
            if failure is None:
                return
            if self._clock() - started >= self._healthy_run_s:
                backoff_s, previous = self._backoff_initial_s, None  # a new streak
            failure.in_row = 1 if previous is None else previous.in_row + 1
            failure.repeats = previous is not None and previous.reason == failure.reason
            previous = failure
            backoff_s = await self._after_failure(handle, failure, backoff_s)

    def _shared_stream_key(self, trigger: BaseTrigger) -> Hashable | None:
        if self._shared_streams is None or not isinstance(trigger, BaseEventTrigger):
            return None
        return trigger.shared_stream_key()

    def _open_source(self, trigger_id: int, trigger: BaseTrigger, key: Hashable | None) -> object:
        if key is None:
            return trigger.run()
        assert self._shared_streams is not None
        assert isinstance(trigger, BaseEventTrigger)
        stream = self._shared_streams.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)
        return trigger.filter_shared_stream(stream)

    def _take(
        self, handle: TriggerHandle, item: object, key: Hashable | None, dedup: DedupHook | None
    ) -> _Failure | None:
        """Fire ``item`` if it is a ``TriggerEvent``; the failure it is otherwise.

        ``dedup`` is the trigger's ``dedup_key`` hook (None: the event's own key stands).
        """
        if not isinstance(item, TriggerEvent):
            return _Failure(f"yielded {type(item).__name__} instead of a TriggerEvent")
        # Before binding: a hook that raises fails the trigger with nothing bound to it.
        dedup_key = item.dedup_key if dedup is None else dedup(item)
        if dedup is not None and dedup_key is not None and not isinstance(dedup_key, str):
            if inspect.iscoroutine(dedup_key):
                dedup_key.close()  # never awaited: say so instead of a RuntimeWarning
            return _Failure(
                f"dedup_key() returned {type(dedup_key).__name__}, not a str or None"
                " (it must be a plain def returning a str)"
            )
        seq: int | None = None
        if key is not None:
            assert self._shared_streams is not None
            seq = self._shared_streams.bind_pending_event(trigger_id=handle.trigger_id, key=key)
        self._outbox.put_nowait(
            FiredEvent(handle.trigger_id, item, seq, self._clock(), handle.watcher, dedup_key)
        )
        self.fired += 1
        logger.log(
            logging.INFO if handle.kind is TriggerKind.TASK else logging.DEBUG,
            "Trigger %s fired: %r",
            handle.trigger_id,
            item,
            extra={"action": "trigger_fired", "trigger_id": handle.trigger_id, "seq": seq},
        )
        return None

    # -- after a failure: report, and restart a watcher ----------------------------------

    async def _after_failure(
        self, handle: TriggerHandle, failure: _Failure, backoff_s: float
    ) -> float | None:
        """Report ``failure``; for a watcher wait the backoff and rebuild it.

        Returns the next backoff, or None when the task ends here.
        """
        if handle.kind is TriggerKind.TASK:
            self.report(handle.trigger_id, handle.kind, failure)
            return None
        self.report(handle.trigger_id, handle.kind, failure, restart_in_s=backoff_s)
        if handle.stopping:  # stopped while it cleaned up
            return None
        await anyio.sleep(backoff_s)
        if not self._recreate(handle):
            return None
        return min(backoff_s * 2, self._backoff_max_s)

    def _recreate(self, handle: TriggerHandle) -> bool:
        """Replace the failed watcher with a fresh instance built from its kwargs."""
        old = handle.trigger
        try:
            handle.trigger = _rebuild(old)
        except Exception as exc:  # noqa: BLE001 - user code: becomes a reported failure
            failure = _Failure.from_exception(exc)
            reason = f"could not re-create the trigger to restart it: {failure.reason}"
            self.report(handle.trigger_id, handle.kind, _Failure(reason, failure.traceback))
            return False
        logger.info(
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
        failure: _Failure,
        *,
        restart_in_s: float | None = None,
    ) -> None:
        """Log and put a ``TriggerFailed``; ``restart_in_s`` is the backoff before a restart.

        A watcher that fails again the same way (a broker that stays down) is logged in one
        line with its count: the traceback was in the log at the first failure of the streak.
        """
        will_restart = restart_in_s is not None
        logger.error(
            "Trigger %s (%s) failed%s: %s%s%s",
            trigger_id,
            kind.value,
            f" ({failure.in_row} times in a row)" if failure.in_row > 1 else "",
            failure.reason,
            f"; restarting it in {restart_in_s:.3g}s" if will_restart else "",
            f"\n{failure.traceback}" if failure.traceback and not failure.repeats else "",
            extra={
                "action": "trigger_failed",
                "trigger_id": trigger_id,
                "will_restart": will_restart,
                "backoff_s": restart_in_s,
                "failures_in_row": failure.in_row,
            },
        )
        self._outbox.put_nowait(
            TriggerFailed(trigger_id, kind, failure.reason, failure.traceback, will_restart)
        )
        self.failed += 1

    # -- end of an attempt: shielded, bounded, logged ------------------------------------

    async def _end_attempt(
        self,
        handle: TriggerHandle,
        trigger: BaseTrigger,
        source: object,
        key: Hashable | None,
        *,
        failed: bool = False,
    ) -> None:
        trigger_id = handle.trigger_id
        handle.cleaning = True
        try:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await self._bounded(trigger_id, "closing its event source", aclose)
            elif inspect.iscoroutine(source):
                source.close()  # cancelled before it was awaited: no "never awaited" warning
            if key is not None:
                assert self._shared_streams is not None
                await self._bounded(
                    trigger_id,
                    "unsubscribing from the shared stream",
                    partial(self._shared_streams.unsubscribe, trigger_id, key, failed=failed),
                )
            await self._bounded(trigger_id, "running cleanup()", trigger.cleanup)
        finally:
            handle.cleaning = False

    async def _bounded(self, trigger_id: int, what: str, func: Any, *args: Any) -> None:
        """Await ``func(*args)`` shielded, within the cleanup timeout; log what goes wrong."""
        now = anyio.current_time()
        deadline = now + self._cleanup_timeout_s
        if self._closing_deadline is not None:
            deadline = min(deadline, self._closing_deadline)
        scope = anyio.CancelScope(deadline=deadline, shield=True)
        self._bounded_scopes.add(scope)
        try:
            with scope:
                await func(*args)
        except Exception:
            logger.exception(
                "Trigger %s failed while %s; ignored (an event it fired is still persisted)",
                trigger_id,
                what,
                extra={"action": "trigger_cleanup_failed", "trigger_id": trigger_id},
            )
        finally:
            self._bounded_scopes.discard(scope)
        if scope.cancelled_caught:
            logger.error(
                "Trigger %s did not finish %s within %.2fs; abandoned it. Keep cleanup "
                "short and make it async",
                trigger_id,
                what,
                scope.deadline - now,
                extra={"action": "trigger_cleanup_timeout", "trigger_id": trigger_id},
            )
