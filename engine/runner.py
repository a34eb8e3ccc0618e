"""The trigger runtime: thousands of triggers in one event loop, no database.

Theory of operation. ``run()`` owns one task group; ``start(spec)`` spawns one task per
trigger and keeps its ``TaskHandle`` (whose cancel scope is the task's own, anyio >= 4.14)
in a dict by trigger id until the task ends; ``stop(trigger_id)`` cancels that scope.

A trigger's task runs *attempts*: an attempt sets ``trigger.trigger_id``, opens the event
source (``trigger.run()``, or for an event trigger with a ``shared_stream_key()`` its
``filter_shared_stream()`` over a subscription to the shared stream), and puts every
``TriggerEvent`` it yields into the outbox as a ``FiredEvent``. A ``TASK`` trigger ends
after its first event; a ``WATCHER`` trigger keeps running. Every way an attempt can go
wrong ends in a ``TriggerFailed`` in the outbox and an ERROR log line carrying the trigger
id; a failed watcher is restarted after a backoff (doubling from ``restart_backoff_s[0]``
to ``restart_backoff_s[1]``, back to the start after a run of ``healthy_run_s``) from a
fresh instance rebuilt from ``trigger.serialize()``.

After every attempt, whatever happened (event, failure, cancellation), the runner closes
the event source, unsubscribes from the shared stream and awaits ``trigger.cleanup()``,
each shielded from cancellation and bounded by ``cleanup_timeout_s`` (and, during
``aclose``, by the shutdown grace).

Cleanup failures are logged at ERROR with the trigger id and are *not* put in the outbox:
every ``TriggerFailed`` of a ``TASK`` trigger fails its deferred task, and a cleanup that
raised (or timed out) after the event fired must neither fail the task nor keep the event
from being persisted; after a cancellation nothing at all is reported. The same holds for
an exception raised while closing the event source (its ``finally`` blocks).

Cancellation (``stop``, a takeover, shutdown) is never reported as a failure and never
swallowed. Per-trigger state is kept tiny (one slotted handle and one task with two
coroutine frames of ours; no cancel scope of our own: the task's own one serves) because a
triggerer holds 100,000 idle triggers.
"""

from __future__ import annotations

import inspect
import logging
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio
import anyio.lowlevel

from engine.outbox import FiredEvent, Outbox, TriggerFailed, TriggerKind
from triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent, classpath_of
from triggers.exceptions import TriggerContractError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Hashable

    from anyio import TaskHandle
    from anyio.abc import TaskGroup, TaskStatus

__all__ = (
    "EXITED_WITHOUT_EVENT",
    "RETURNED_EVENT",
    "WATCHER_EXITED",
    "SharedStreamSubscriptions",
    "TriggerKind",
    "TriggerRunner",
    "TriggerSpec",
)

logger = logging.getLogger(__name__)

EXITED_WITHOUT_EVENT: Final = "Trigger exited without sending an event"
WATCHER_EXITED: Final = "watcher trigger exited; event triggers must keep running"
RETURNED_EVENT: Final = (
    "run() returned a TriggerEvent instead of yielding it; "
    "make run() an async generator (use `yield`)"
)
DEFAULT_CLEANUP_TIMEOUT_S: Final = 10.0
DEFAULT_RESTART_BACKOFF_S: Final = (1.0, 60.0)
DEFAULT_HEALTHY_RUN_S: Final = 60.0
# How long aclose() waits, past its grace, for the task group to unwind after cancelling it.
STOP_SLACK_S: Final = 1.0


class SharedStreamSubscriptions(Protocol):
    """The part of ``SharedStreamManager`` the runner uses."""

    def subscribe(
        self, *, trigger_id: int, trigger: BaseEventTrigger, key: Hashable
    ) -> AsyncIterator[Any]: ...

    def bind_pending_event(self, *, trigger_id: int, key: Hashable) -> int | None: ...

    async def unsubscribe(self, trigger_id: int, key: Hashable) -> None: ...


@dataclass(frozen=True, slots=True)
class TriggerSpec:
    """A trigger to run: its row id, a built instance, and what it serves."""

    trigger_id: int
    trigger: BaseTrigger
    kind: TriggerKind


@dataclass(frozen=True, slots=True)
class _Failure:
    reason: str
    traceback: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> _Failure:
        return cls(repr(exc), "".join(traceback.format_exception(exc)))


class _Handle:
    """Per-trigger state: one per running trigger, so kept to a few slots."""

    __slots__ = ("done", "kind", "previous", "stopping", "task", "trigger", "trigger_id")

    def __init__(self, spec: TriggerSpec, previous: _Handle | None) -> None:
        self.trigger_id = spec.trigger_id
        self.kind = spec.kind
        self.trigger = spec.trigger  # replaced by a fresh instance on a watcher restart
        self.task: TaskHandle[None] | None = None  # set right after spawning
        self.stopping = False
        # Set when this task ends; only created when a successor has to wait for it.
        self.done: anyio.Event | None = None
        # The stopped task of the same trigger id still cleaning up, if any.
        self.previous = previous

    def cancel(self) -> None:
        self.stopping = True
        if self.task is not None:
            self.task.cancel()


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


class TriggerRunner:
    """Runs triggers as tasks of one task group and reports their outcomes to an outbox."""

    def __init__(
        self,
        *,
        outbox: Outbox,
        shared_streams: SharedStreamSubscriptions | None = None,
        cleanup_timeout_s: float = DEFAULT_CLEANUP_TIMEOUT_S,
        restart_backoff_s: tuple[float, float] = DEFAULT_RESTART_BACKOFF_S,
        healthy_run_s: float = DEFAULT_HEALTHY_RUN_S,
        clock: Callable[[], float] = time.monotonic,
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
        self._handles: dict[int, _Handle] = {}
        self._bounded_scopes: set[anyio.CancelScope] = set()
        self._tg: TaskGroup | None = None
        self._stop_requested: anyio.Event | None = None
        self._finished: anyio.Event | None = None
        self._idle: anyio.Event | None = None
        self._closing_deadline: float | None = None

    # -- service -------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host the trigger tasks until ``aclose()`` (or until cancelled)."""
        if self._tg is not None or self._closing_deadline is not None:
            raise RuntimeError("TriggerRunner.run() can only be called once")
        self._stop_requested = anyio.Event()
        self._finished = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await self._stop_requested.wait()
                tg.cancel_scope.cancel()
        finally:
            self._tg = None
            self._finished.set()

    async def aclose(self, *, grace_s: float) -> None:
        """Stop every trigger: cancel them, wait up to ``grace_s`` for their cleanups, return.

        Cleanups still running at the end of the grace are cancelled. Safe to call from a
        cancelled task (it shields itself) and more than once.
        """
        now = anyio.current_time()
        deadline = now + grace_s
        if self._closing_deadline is None or deadline < self._closing_deadline:
            self._closing_deadline = deadline
        for scope in self._bounded_scopes:
            scope.deadline = min(scope.deadline, deadline)
        for handle in self._handles.values():
            handle.cancel()
        logger.info(
            "Stopping %d triggers (grace %.1fs)",
            len(self._handles),
            grace_s,
            extra={"action": "runner_stopping", "count": len(self._handles)},
        )
        with anyio.move_on_after(grace_s + STOP_SLACK_S, shield=True):
            if self._handles:
                if self._idle is None:
                    self._idle = anyio.Event()
                with anyio.move_on_after(grace_s):
                    await self._idle.wait()
            if self._stop_requested is not None:
                self._stop_requested.set()
            if self._finished is not None:
                await self._finished.wait()
        self._log_stragglers()

    def _log_stragglers(self) -> None:
        if self._handles:
            logger.error(
                "%d triggers did not stop during shutdown (ids %s); they ignore cancellation",
                len(self._handles),
                sorted(self._handles)[:20],
                extra={"action": "runner_stop_incomplete", "count": len(self._handles)},
            )

    # -- control -------------------------------------------------------------------------

    def start(self, spec: TriggerSpec) -> None:
        """Start running ``spec.trigger`` unless it already runs (idempotent per trigger id).

        A trigger that was stopped and is still cleaning up starts again once that cleanup
        ended, so there is never more than one live attempt per trigger id.
        """
        tg = self._tg
        if tg is None:
            raise RuntimeError("TriggerRunner.start() called while run() is not running")
        if self._closing_deadline is not None:
            logger.debug(
                "Not starting trigger %s: the runner is shutting down",
                spec.trigger_id,
                extra={"action": "trigger_start_refused", "trigger_id": spec.trigger_id},
            )
            return
        previous = self._handles.get(spec.trigger_id)
        if previous is not None:
            if not previous.stopping:
                return
            if previous.done is None:
                previous.done = anyio.Event()
        handle = _Handle(spec, previous)
        self._handles[spec.trigger_id] = handle
        name = f"trigger {spec.trigger_id} {classpath_of(spec.trigger)}"
        handle.task = tg.start_soon(self._run_trigger, handle, name=name)

    def stop(self, trigger_id: int, *, kill: bool = False) -> None:
        """Cancel the trigger's task; ``kill=True`` (a user asked) calls ``on_kill()`` first.

        ``cleanup()`` still runs (bounded). Unknown or already stopping ids are ignored.
        """
        handle = self._handles.get(trigger_id)
        if handle is None or handle.stopping:
            return
        logger.info(
            "Stopping trigger %s%s",
            trigger_id,
            " (killed)" if kill else "",
            extra={"action": "trigger_stop", "trigger_id": trigger_id, "kill": kill},
        )
        if kill:
            try:
                handle.trigger.on_kill()
            except Exception:
                logger.exception(
                    "Trigger %s on_kill() raised; stopping it anyway",
                    trigger_id,
                    extra={"action": "trigger_on_kill_failed", "trigger_id": trigger_id},
                )
        handle.cancel()

    def report_failure(
        self, trigger_id: int, kind: TriggerKind, reason: str, *, traceback: str | None = None
    ) -> None:
        """Report a failure found outside the runner (e.g. the trigger could not be loaded)."""
        self._report(trigger_id, kind, _Failure(reason, traceback))

    def running_ids(self) -> frozenset[int]:
        """Ids of the triggers that have a task (including ones stopping)."""
        return frozenset(self._handles)

    def __len__(self) -> int:
        return len(self._handles)

    def __contains__(self, trigger_id: object) -> bool:
        return trigger_id in self._handles

    def __repr__(self) -> str:
        if self._closing_deadline is not None:
            state = "closing" if self._tg is not None else "closed"
        else:
            state = "running" if self._tg is not None else "idle"
        return f"<TriggerRunner {state} triggers={len(self._handles)} outbox={len(self._outbox)}>"

    # -- one trigger's task --------------------------------------------------------------

    async def _run_trigger(self, handle: _Handle) -> None:
        """The body of one trigger's task (``LoopWatchdog`` finds this frame by its code)."""
        trigger_id = handle.trigger_id
        try:
            await self._wait_for_previous(handle)
            backoff_s = self._backoff_initial_s
            while True:
                started = self._clock()
                failure = await self._run_attempt(handle)
                if failure is None:
                    return
                if handle.kind is TriggerKind.TASK:
                    self._report(trigger_id, handle.kind, failure)
                    return
                if self._clock() - started >= self._healthy_run_s:
                    backoff_s = self._backoff_initial_s
                self._report(trigger_id, handle.kind, failure, restart_in_s=backoff_s)
                await anyio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, self._backoff_max_s)
                if not self._recreate(handle):
                    return
        finally:
            self._forget(handle)

    @staticmethod
    async def _wait_for_previous(handle: _Handle) -> None:
        # A trigger stopped before its task ran must not get to fire (a generator can yield
        # without ever awaiting, so the first checkpoint would come too late).
        await anyio.lowlevel.checkpoint_if_cancelled()
        previous = handle.previous
        while previous is not None:
            if previous.done is not None:
                await previous.done.wait()
            previous = previous.previous
        handle.previous = None

    def _forget(self, handle: _Handle) -> None:
        if self._handles.get(handle.trigger_id) is handle:
            del self._handles[handle.trigger_id]
        if handle.done is not None:
            handle.done.set()
        if self._idle is not None and not self._handles:
            self._idle.set()

    def _recreate(self, handle: _Handle) -> bool:
        """Replace the failed watcher with a fresh instance built from its kwargs."""
        old = handle.trigger
        try:
            handle.trigger = _rebuild(old)
        except Exception as exc:  # noqa: BLE001 - user code: becomes a reported failure
            failure = _Failure.from_exception(exc)
            reason = f"could not re-create the trigger to restart it: {failure.reason}"
            self._report(handle.trigger_id, handle.kind, _Failure(reason, failure.traceback))
            return False
        logger.info(
            "Restarting watcher trigger %s (%s)",
            handle.trigger_id,
            classpath_of(old),
            extra={"action": "trigger_restart", "trigger_id": handle.trigger_id},
        )
        return True

    async def _run_attempt(self, handle: _Handle) -> _Failure | None:
        """Run one instance to its end; None means a TASK trigger fired."""
        trigger = handle.trigger
        trigger.trigger_id = handle.trigger_id
        key: Hashable | None = None
        source: Any = None
        try:
            key = self._shared_stream_key(trigger)
            source = self._open_source(handle.trigger_id, trigger, key)
            if inspect.iscoroutine(source):
                result = await source
                return _Failure(
                    RETURNED_EVENT
                    if isinstance(result, TriggerEvent)
                    else f"run() returned {type(result).__name__} instead of yielding "
                    "TriggerEvents; make run() an async generator (use `yield`)"
                )
            async for item in source:
                if not isinstance(item, TriggerEvent):
                    return _Failure(f"yielded {type(item).__name__} instead of a TriggerEvent")
                self._fire(handle, item, key)
                if handle.kind is TriggerKind.TASK:
                    return None
            return _Failure(
                EXITED_WITHOUT_EVENT if handle.kind is TriggerKind.TASK else WATCHER_EXITED
            )
        except Exception as exc:  # noqa: BLE001 - the user-code boundary: a reported failure
            return _Failure.from_exception(exc)
        finally:
            await self._end_attempt(handle.trigger_id, trigger, source, key)

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

    def _fire(self, handle: _Handle, event: TriggerEvent, key: Hashable | None) -> None:
        seq: int | None = None
        if key is not None:
            assert self._shared_streams is not None
            seq = self._shared_streams.bind_pending_event(trigger_id=handle.trigger_id, key=key)
        self._outbox.put_nowait(FiredEvent(handle.trigger_id, event, seq, self._clock()))
        logger.log(
            logging.INFO if handle.kind is TriggerKind.TASK else logging.DEBUG,
            "Trigger %s fired: %r",
            handle.trigger_id,
            event,
            extra={"action": "trigger_fired", "trigger_id": handle.trigger_id, "seq": seq},
        )

    def _report(
        self,
        trigger_id: int,
        kind: TriggerKind,
        failure: _Failure,
        *,
        restart_in_s: float | None = None,
    ) -> None:
        """Log and put a ``TriggerFailed``; ``restart_in_s`` is the backoff before a restart."""
        will_restart = restart_in_s is not None
        logger.error(
            "Trigger %s (%s) failed: %s%s%s",
            trigger_id,
            kind.value,
            failure.reason,
            f"; restarting it in {restart_in_s:.3g}s" if will_restart else "",
            f"\n{failure.traceback}" if failure.traceback else "",
            extra={
                "action": "trigger_failed",
                "trigger_id": trigger_id,
                "will_restart": will_restart,
                "backoff_s": restart_in_s,
            },
        )
        self._outbox.put_nowait(
            TriggerFailed(trigger_id, kind, failure.reason, failure.traceback, will_restart)
        )

    # -- end of an attempt: shielded, bounded, logged ------------------------------------

    async def _end_attempt(
        self, trigger_id: int, trigger: BaseTrigger, source: object, key: Hashable | None
    ) -> None:
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
                self._shared_streams.unsubscribe,
                trigger_id,
                key,
            )
        await self._bounded(trigger_id, "running cleanup()", trigger.cleanup)

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
