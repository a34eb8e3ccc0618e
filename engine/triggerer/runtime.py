"""The trigger runtime: run a trigger or a group subscriber, thousands in one loop, no database.

Theory of operation. ``start(spec)`` spawns one asyncio task per trigger and keeps its
``TriggerHandle`` by trigger id until the task ends; ``stop(trigger_id)`` cancels it; ``run()``
hosts the tasks until ``aclose()``. A task runs *attempts*: an attempt opens the event source
(the trigger's own ``run()``, or for an event trigger with a ``shared_stream_key()`` its
``filter_shared_stream()`` over a subscription to the shared stream) and puts every
``TriggerEvent`` it yields into the outbox as a ``FiredEvent``, with its dedup key and its
shared-stream sequence number. A ``TASK`` trigger ends after its first event; a ``WATCHER``
keeps running. Whatever goes wrong in an attempt is a ``TriggerFailed`` in the outbox and a
log line (an ERROR; for an unreachable upstream one WARNING, then DEBUG lines while it stays
down); a failed watcher restarts from a fresh instance after a backoff (``failures``).
After every attempt (event, failure or cancellation) the source is closed, the subscription
dropped and ``trigger.cleanup()`` awaited, shielded and bounded (``cleanup``).

Why plain asyncio tasks, not ``TaskGroup.start_soon`` (STYLE.md: "no bare
asyncio.create_task"): a triggerer holds 100,000 idle triggers, and ``start_soon`` costs
about 2.7 KB per task on top of the task itself, as much as everything else an idle
``TimeDeltaTrigger`` needs (``bench/triggerer_bench.py``, 100,000 idle triggers: 6.8 KiB of
RSS per trigger with ``start_soon``, 4.0 KiB with plain tasks). So the idle path is one frame
of ours (``_run_trigger``, the attempt inline) above the trigger's ``run()``, and the state
per trigger is one slotted ``TriggerHandle``.

The runner keeps these tasks structured by hand: it counts every task it spawned, ``run()``
does not return before all of them ended (cancelling them when it is cancelled or closed,
again every ``STOP_SLACK_S`` for a trigger that swallowed it), and a task that ends with an
exception (a bug of the runtime: user code is wrapped at one boundary) is logged, stops every
other trigger and is raised by ``run()`` in an ``ExceptionGroup``, as a task group would.

Cancellation is native (``Task.cancel()``, as Airflow's triggerer does): a trigger's own
anyio cancel scopes work inside it as usual, but a *shielded* scope inside ``run()`` does not
hold off ``stop()``; keep such work in ``cleanup()``, which the runner shields. A task that
is cleaning up is not cancelled (``TriggerHandle.cancel`` only marks it stopping): it ends
once its bounded cleanup did. Cancellation is never reported as a failure, never swallowed.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol

import anyio

from engine.logs import LOG_FIELDS
from engine.states import TriggerKind
from engine.triggerer.cleanup import Cleanups, call_on_kill
from engine.triggerer.failures import (
    EXITED_WITHOUT_EVENT,
    RETURNED_EVENT,
    WATCHER_EXITED,
    Failure,
    RestartPolicy,
    rebuild,
    report,
)
from engine.triggerer.handles import TriggerHandle, TriggerSpec
from engine.triggerer.outbox import FiredEvent
from triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent, classpath_of
from triggers.temporal import DateTimeTrigger, utcnow

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
    from types import FrameType

    from anyio.abc import TaskStatus

    from engine.triggerer.outbox import Outbox

    DedupHook = Callable[[TriggerEvent], str | None]  # a trigger's bound dedup_key

__all__ = (
    "EXITED_WITHOUT_EVENT",
    "RETURNED_EVENT",
    "WATCHER_EXITED",
    "SharedStreamSubscriptions",
    "TriggerKind",
    "TriggerRunner",
    "TriggerSpec",
    "trigger_in_frame",
)

logger = logging.getLogger(__name__)

DEFAULT_CLEANUP_TIMEOUT_S: Final = 10.0
DEFAULT_RESTART_BACKOFF_S: Final = (1.0, 60.0)
DEFAULT_HEALTHY_RUN_S: Final = 60.0
# How long aclose() waits, past its grace, for run() to unwind after cancelling everything;
# also the pace at which run() cancels again the tasks that are still running as it ends.
STOP_SLACK_S: Final = 1.0
_DEFAULT_DEDUP_HOOK: Final = BaseEventTrigger.dedup_key
_DATETIME_RUN: Final = DateTimeTrigger.run
_BASE_CLEANUP: Final = BaseTrigger.cleanup


class SharedStreamSubscriptions(Protocol):
    """The part of ``SharedStreamManager`` the runner uses."""

    def subscribe(
        self, *, trigger_id: int, trigger: BaseEventTrigger, key: Hashable
    ) -> AsyncIterator[Any]: ...

    def bind_pending_event(self, *, trigger_id: int, key: Hashable) -> int | None: ...

    async def unsubscribe(
        self, trigger_id: int, key: Hashable, *, failed: bool = False
    ) -> None: ...


class TriggerRunner:
    """Runs each trigger in its own task and reports their outcomes to an outbox."""

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
        self._restarts = RestartPolicy(restart_backoff_s, healthy_run_s)
        self._outbox = outbox
        self._shared_streams = shared_streams
        self._cleanups = Cleanups(cleanup_timeout_s)
        self._clock = clock
        self._handles: dict[int, TriggerHandle] = {}
        self._live = 0  # tasks spawned and not ended yet (stopped ones cleaning up included)
        self._crashes: list[BaseException] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # set while run() runs
        self._wake: anyio.Event | None = None  # set by aclose() or a crash: run() returns
        self._finished: anyio.Event | None = None
        self._all_ended: anyio.Event | None = None  # created by whoever waits for _live == 0
        self._closing = False
        # Every done callback runs in this one (empty) context: no context copy per task.
        self._callback_context = contextvars.Context()
        self._on_task_end = self._task_ended  # one bound method shared by every handle
        # Totals for the metrics endpoint (plain ints: fired is on the fan-out hot path).
        self._fired = 0
        self._failed = 0

    # -- service -------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Host the trigger tasks until ``aclose()`` (or until cancelled).

        On the way out it cancels every task and waits until all of them ended. A task that
        crashed is raised from here, in an ``ExceptionGroup``.
        """
        if self._wake is not None or self._closing:
            raise RuntimeError("TriggerRunner.run() can only be called once")
        self._wake = anyio.Event()
        self._finished = anyio.Event()
        self._loop = asyncio.get_running_loop()
        try:
            task_status.started()
            await self._wake.wait()
        finally:
            self._loop = None
            with anyio.CancelScope(shield=True):
                await self._stop_all()
            self._finished.set()
            if self._crashes:
                raise BaseExceptionGroup("trigger runner tasks crashed", self._crashes)

    async def aclose(self, *, grace_s: float) -> None:
        """Stop every trigger: cancel them, wait up to ``grace_s`` for their cleanups, return.

        Cleanups still running at the end of the grace are cancelled. Safe to call from a
        cancelled task (it shields itself) and more than once.
        """
        self._closing = True
        self._cleanups.close_by(anyio.current_time() + grace_s)
        count = len(self._handles)
        self._cancel_waiting()
        for handle in self._handles.values():
            handle.cancel()
        logger.info(
            "Stopping %d triggers (grace %.1fs)",
            count,
            grace_s,
            extra={"action": "runner_stopping", "count": count},
        )
        with anyio.move_on_after(grace_s + STOP_SLACK_S, shield=True):
            with anyio.move_on_after(grace_s):
                await self._wait_all_ended()
            if self._wake is not None:
                self._wake.set()
            if self._finished is not None:
                await self._finished.wait()
        self._log_stragglers()

    async def _stop_all(self) -> None:
        """Cancel every task and wait until all ended.

        Tasks still running after ``STOP_SLACK_S`` are cancelled again, and so on: a trigger
        that swallowed a cancellation gets another one (anyio's cancel scopes do the same at
        every checkpoint).
        """
        self._cancel_waiting()
        while self._live:
            for handle in list(self._handles.values()):
                for live in handle.live_chain():
                    live.cancel()
            with anyio.move_on_after(STOP_SLACK_S):
                await self._wait_all_ended()

    async def _wait_all_ended(self) -> None:
        if self._live:
            if self._all_ended is None:
                self._all_ended = anyio.Event()
            await self._all_ended.wait()

    def _log_stragglers(self) -> None:
        if self._live:
            logger.error(
                "%d triggers did not stop during shutdown (ids %s); they ignore cancellation",
                self._live,
                sorted(self._handles)[:20],
                extra={"action": "runner_stop_incomplete", "count": self._live},
            )

    # -- control -------------------------------------------------------------------------

    def start(self, spec: TriggerSpec) -> None:
        """Start running ``spec.trigger`` unless it already runs (idempotent per trigger id).

        A trigger that was stopped and is still cleaning up starts again once that cleanup
        ended, so there is never more than one live attempt per trigger id.
        """
        if self._closing:  # also once run() ended: a claim round may end after aclose()
            logger.debug(
                "Not starting trigger %s: the runner is shutting down",
                spec.trigger_id,
                extra={"action": "trigger_start_refused", "trigger_id": spec.trigger_id},
            )
            return
        loop = self._loop
        if loop is None:
            raise RuntimeError("TriggerRunner.start() called while run() is not running")
        previous = self._handles.get(spec.trigger_id)
        if previous is not None:
            if not previous.stopping:
                return
            if previous.done is None:
                previous.done = anyio.Event()
        handle = TriggerHandle(spec, previous, self._on_task_end)
        self._handles[spec.trigger_id] = handle
        delay_s = None if previous is not None else _idle_delay_s(spec.trigger)
        if delay_s is not None:
            # Only a timer until its moment (call_later keeps the caller's context for it).
            spec.trigger.trigger_id = spec.trigger_id
            handle.timer = loop.call_later(delay_s, self._spawn, handle)
            return
        self._spawn(handle)

    def _spawn(self, handle: TriggerHandle) -> None:
        """Start the trigger's task (at ``start``, or when its idle timer is due)."""
        loop = self._loop
        assert loop is not None  # timers are cancelled before run() returns
        handle.timer = None
        name = f"trigger {handle.trigger_id} {classpath_of(handle.trigger)}"
        # Every line logged by the trigger's task carries its id (and what it serves): the
        # handle is the context's log fields, read only when a line is logged.
        context = contextvars.copy_context()
        context.run(LOG_FIELDS.set, handle)
        handle.task = task = loop.create_task(self._run_trigger(handle), name=name, context=context)
        task.add_done_callback(handle, context=self._callback_context)
        self._live += 1

    def _cancel_waiting(self) -> None:
        """Cancel the timers of the triggers that have no task yet, and forget them."""
        waiting = [t for t, handle in self._handles.items() if handle.is_waiting]
        for trigger_id in waiting:
            self._handles.pop(trigger_id).cancel()

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
            call_on_kill(handle.trigger, trigger_id)
        if handle.is_waiting:  # no task yet: nothing runs, nothing to clean up
            del self._handles[trigger_id]
        handle.cancel()

    def report_failure(
        self, trigger_id: int, kind: TriggerKind, reason: str, *, traceback: str | None = None
    ) -> None:
        """Report a failure found outside the runner (e.g. the trigger could not be loaded)."""
        self._report(trigger_id, kind, Failure(reason, traceback))

    @property
    def events_fired(self) -> int:
        """Trigger events put in the outbox since the runner was created."""
        return self._fired

    @property
    def failures_reported(self) -> int:
        """Trigger failures put in the outbox since the runner was created."""
        return self._failed

    def running_ids(self) -> frozenset[int]:
        """Ids of the triggers that have a task (including ones stopping)."""
        return frozenset(self._handles)

    def id_checksum(self) -> tuple[int, int]:
        """(count, sum) of the ids of ``running_ids()``, without building that set."""
        return len(self._handles), sum(self._handles)

    def __len__(self) -> int:
        return len(self._handles)

    def __contains__(self, trigger_id: object) -> bool:
        return trigger_id in self._handles

    def __repr__(self) -> str:
        if self._closing:
            state = "closing" if self._loop is not None else "closed"
        else:
            state = "running" if self._loop is not None else "idle"
        return (
            f"<TriggerRunner {state} triggers={len(self._handles)} tasks={self._live} "
            f"outbox={len(self._outbox)} cleanups={len(self._cleanups)}>"
        )

    # -- one trigger's task: attempts ----------------------------------------------------

    async def _run_trigger(self, handle: TriggerHandle) -> None:
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
        self._fired += 1
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
            self._report(handle.trigger_id, handle.kind, failure)
            return False
        self._report(
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
            self._report(handle.trigger_id, handle.kind, Failure.from_exception(exc).not_rebuilt())
            return False
        logger.log(
            logging.DEBUG if quiet else logging.INFO,
            "Restarting watcher trigger %s (%s)",
            handle.trigger_id,
            classpath_of(old),
            extra={"action": "trigger_restart", "trigger_id": handle.trigger_id},
        )
        return True

    def _report(
        self,
        trigger_id: int,
        kind: TriggerKind,
        failure: Failure,
        *,
        restart_in_s: float | None = None,
        max_backoff_s: float | None = None,
    ) -> None:
        self._outbox.put_nowait(
            report(
                trigger_id, kind, failure, restart_in_s=restart_in_s, max_backoff_s=max_backoff_s
            )
        )
        self._failed += 1

    # -- task bookkeeping ----------------------------------------------------------------

    def _task_ended(self, handle: TriggerHandle, task: asyncio.Task[None]) -> None:
        """Done callback of every trigger task (through its handle)."""
        handle.task = None
        self._live -= 1
        trigger_id = handle.trigger_id
        if self._handles.get(trigger_id) is handle:
            # Stopped while it waited for a stopped predecessor to clean up: the predecessor
            # is still this trigger's live task (one live attempt per id, and aclose sees it).
            predecessor = next(handle.live_chain(), None)
            if predecessor is None:
                del self._handles[trigger_id]
            else:
                self._handles[trigger_id] = predecessor
        if handle.done is not None:
            handle.done.set()
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._crashed(handle, exc)
        if self._live == 0 and self._all_ended is not None:
            self._all_ended.set()
            self._all_ended = None

    def _crashed(self, handle: TriggerHandle, exc: BaseException) -> None:
        logger.error(
            "The task of trigger %s crashed (a bug of the runner, not of the trigger); "
            "stopping every trigger",
            handle.trigger_id,
            exc_info=exc,
            extra={"action": "runner_task_crashed", "trigger_id": handle.trigger_id},
        )
        self._crashes.append(exc)
        if self._wake is not None:
            self._wake.set()


_TASK_BODY_CODE: Final = TriggerRunner._run_trigger.__code__


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


def _idle_delay_s(trigger: BaseTrigger) -> float | None:
    """Seconds a trigger only waits before it does anything, if it is a plain time trigger.

    A ``DateTimeTrigger`` (or a subclass that keeps its ``run`` and ``cleanup``) does nothing
    but wait for its moment: it gets a timer on the loop instead of a task sleeping in its
    ``run()`` (task, coroutine frames, future and context: most of the 2.8 KiB an idle
    trigger took), and its task starts when the timer is due; ``run()`` then re-checks the
    moment against the wall clock, as it does after any wake-up. None: start it now.
    """
    cls = type(trigger)
    if cls.run is not _DATETIME_RUN or cls.cleanup is not _BASE_CLEANUP:
        return None
    assert isinstance(trigger, DateTimeTrigger)
    delay_s = (trigger.moment - utcnow()).total_seconds()
    return delay_s if delay_s > 0 else None


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
