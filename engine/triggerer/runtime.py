"""The trigger runtime: thousands of triggers in one event loop, no database.

Theory of operation. ``run()`` hosts the triggers; ``start(spec)`` spawns one asyncio task
per trigger and keeps its ``TriggerHandle`` in a dict by trigger id until the task ends;
``stop(trigger_id)`` cancels that task. What a task does (attempts, events, failures,
watcher restarts, bounded cleanup) is in ``engine.triggerer.runtime``.

Why plain asyncio tasks, not ``TaskGroup.start_soon`` (STYLE.md: "no bare
asyncio.create_task"): a triggerer holds 100,000 idle triggers, and anyio's ``start_soon``
costs about 2.7 KB per task on top of the task itself (a ``TaskHandle``, its own cancel
scope with two sets and a task state, a finished event, a wrapper coroutine, a done
closure), about as much as everything else an idle ``TimeDeltaTrigger`` needs. Measured with
``bench/triggerer_bench.py`` at 100,000 idle triggers: 6.8 KiB of RSS per trigger with
``start_soon``, 4.0 KiB with plain tasks.

The runner keeps these tasks structured by hand: it counts every task it spawned, ``run()``
does not return before all of them ended (cancelling them when it is cancelled or closed,
again every ``STOP_SLACK_S`` for a trigger that swallowed it), and a task that ends with
an exception (a bug of the runtime: user code is wrapped at one boundary) is logged, stops
every other trigger and is raised by ``run()`` (in an ``ExceptionGroup``, as a task group
would).

Cancellation is native (``Task.cancel()``, as Airflow's triggerer does): a trigger's own
anyio cancel scopes (``move_on_after``, task groups) work inside it as usual, but a
*shielded* scope inside ``run()`` does not hold off ``stop()``; keep such work in
``cleanup()``, which the runner shields. A task that is cleaning up is not cancelled: it
ends once its (bounded) cleanup did. Cancellation is never reported as a failure and never
swallowed.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import anyio

from engine.logs import LOG_FIELDS
from engine.triggerer.outbox import TriggerKind
from engine.triggerer.trigger_task import (
    EXITED_WITHOUT_EVENT,
    RETURNED_EVENT,
    WATCHER_EXITED,
    SharedStreamSubscriptions,
    TriggerHandle,
    TriggerTasks,
    _Failure,
)
from triggers.base import classpath_of

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from anyio.abc import TaskStatus

    from engine.triggerer.outbox import Outbox
    from triggers.base import BaseTrigger

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


@dataclass(frozen=True, slots=True)
class TriggerSpec:
    """A trigger to run: its row id, a built instance, and what it serves."""

    trigger_id: int
    trigger: BaseTrigger
    kind: TriggerKind
    #: What the trigger serves (dag_id/run_id/task_id, or asset/watcher): every line logged
    #: in its task carries these and its trigger_id. None keeps the task's context as is.
    log_fields: Mapping[str, object] | None = None
    #: A watcher's (asset id, watcher name): what its fired events are stored for.
    watcher: tuple[int, str] | None = None


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
        self._tasks = TriggerTasks(
            outbox=outbox,
            shared_streams=shared_streams,
            cleanup_timeout_s=cleanup_timeout_s,
            restart_backoff_s=restart_backoff_s,
            healthy_run_s=healthy_run_s,
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
        self._tasks.close_by(anyio.current_time() + grace_s)
        for handle in self._handles.values():
            handle.cancel()
        logger.info(
            "Stopping %d triggers (grace %.1fs)",
            len(self._handles),
            grace_s,
            extra={"action": "runner_stopping", "count": len(self._handles)},
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
        loop = self._loop
        if loop is None:
            raise RuntimeError("TriggerRunner.start() called while run() is not running")
        if self._closing:
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
        handle = TriggerHandle(
            spec.trigger_id, spec.trigger, spec.kind, previous, self._on_task_end, spec.watcher
        )
        name = f"trigger {spec.trigger_id} {classpath_of(spec.trigger)}"
        # Every line logged by the trigger's task carries its id (and what it serves).
        context = contextvars.copy_context()
        context.run(LOG_FIELDS.set, {"trigger_id": spec.trigger_id, **(spec.log_fields or {})})
        handle.task = task = loop.create_task(
            self._tasks.run_trigger(handle), name=name, context=context
        )
        task.add_done_callback(handle, context=self._callback_context)
        self._handles[spec.trigger_id] = handle
        self._live += 1

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
            _call_on_kill(handle.trigger, trigger_id)
        handle.cancel()

    def report_failure(
        self, trigger_id: int, kind: TriggerKind, reason: str, *, traceback: str | None = None
    ) -> None:
        """Report a failure found outside the runner (e.g. the trigger could not be loaded)."""
        self._tasks.report(trigger_id, kind, _Failure(reason, traceback))

    @property
    def events_fired(self) -> int:
        """Trigger events put in the outbox since the runner was created."""
        return self._tasks.fired

    @property
    def failures_reported(self) -> int:
        """Trigger failures put in the outbox since the runner was created."""
        return self._tasks.failed

    def running_ids(self) -> frozenset[int]:
        """Ids of the triggers that have a task (including ones stopping)."""
        return frozenset(self._handles)

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
            f"outbox={len(self._outbox)}>"
        )

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


def _call_on_kill(trigger: BaseTrigger, trigger_id: int) -> None:
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
