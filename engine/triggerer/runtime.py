"""The trigger runtime: run a trigger or a group subscriber, thousands in one loop, no database.

Theory of operation. ``start(spec)`` spawns one asyncio task per trigger and keeps its
``TriggerHandle`` by trigger id until the task ends; ``stop(trigger_id)`` cancels it; ``run()``
hosts the tasks until ``aclose()``. A task runs *attempts* (``attempts``): each opens the
trigger's event source, puts what it yields into the outbox and reports what goes wrong; a
failed watcher restarts from a fresh instance after a backoff.

Why plain asyncio tasks, not ``TaskGroup.start_soon`` (STYLE.md: "no bare
asyncio.create_task"): a triggerer holds 100,000 idle triggers, and ``start_soon`` costs
about 2.7 KB per task on top of the task itself, as much as everything else an idle
``TimeDeltaTrigger`` needs (``bench/triggerer_bench.py``, 100,000 idle triggers: 6.8 KiB of
RSS per trigger with ``start_soon``, 4.0 KiB with plain tasks). So the idle path is one frame
of ours (``TriggerAttempts.run_trigger``, the attempt inline) above the trigger's ``run()``,
and the state per trigger is one slotted ``TriggerHandle``.

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
import logging
import time
from typing import TYPE_CHECKING, Final

import anyio

from engine.logs import LOG_FIELDS
from engine.states import TriggerKind
from engine.triggerer.attempts import SharedStreamSubscriptions, TriggerAttempts
from engine.triggerer.cleanup import Cleanups, call_on_kill
from engine.triggerer.failures import (
    EXITED_WITHOUT_EVENT,
    RETURNED_EVENT,
    WATCHER_EXITED,
    Failure,
    RestartPolicy,
)
from engine.triggerer.handles import TriggerHandle, TriggerSpec
from triggers.base import BaseTrigger, classpath_of
from triggers.temporal import DateTimeTrigger, utcnow

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskStatus

    from engine.triggerer.outbox import Outbox

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

DEFAULT_CLEANUP_TIMEOUT_S: Final = 10.0
DEFAULT_RESTART_BACKOFF_S: Final = (1.0, 60.0)
DEFAULT_HEALTHY_RUN_S: Final = 60.0
# How long aclose() waits, past its grace, for run() to unwind after cancelling everything;
# also the pace at which run() cancels again the tasks that are still running as it ends.
STOP_SLACK_S: Final = 1.0
_DATETIME_RUN: Final = DateTimeTrigger.run
_BASE_CLEANUP: Final = BaseTrigger.cleanup


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
        self._outbox = outbox
        self._cleanups = Cleanups(cleanup_timeout_s)
        self._attempts = TriggerAttempts(
            outbox=outbox,
            shared_streams=shared_streams,
            cleanups=self._cleanups,
            restarts=RestartPolicy(restart_backoff_s, healthy_run_s),
            clock=clock,
        )
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
        handle.task = task = loop.create_task(
            self._attempts.run_trigger(handle), name=name, context=context
        )
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
        self._attempts.report(trigger_id, kind, Failure(reason, traceback))

    @property
    def events_fired(self) -> int:
        """Trigger events put in the outbox since the runner was created."""
        return self._attempts.fired

    @property
    def failures_reported(self) -> int:
        """Trigger failures put in the outbox since the runner was created."""
        return self._attempts.failed

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
