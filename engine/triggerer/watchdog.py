"""A watchdog that names the trigger blocking the event loop.

Theory of operation. A task on the loop stamps ``time.monotonic()`` every ``threshold/4``
seconds. A daemon thread wakes at the same pace and checks the age of the stamp: when the
loop has not stamped for longer than the threshold, it is blocked right now (a trigger
made a blocking call, or ran a long CPU-bound stretch), so the thread samples the loop
thread's stack *while it is blocked* (``sys._current_frames()``), walks it outwards to
the first frame that ``engine.triggerer.attempts.trigger_in_frame`` recognises as a trigger
task's body, which names the trigger id and class. Every warning also says where the loop
thread was: the innermost frame outside asyncio and anyio (``file:line in function``, and
the innermost frame outside the standard library when that one is inside it), with the
running asyncio task, and the other threads that were running Python code (a loop thread
that waits for the GIL shows no code but the event loop's own, or whatever line it was
preempted at). Only a trigger on the stack is blamed and advised (triggers must not
block); a block in a shared-stream poll advises its producer; any other is named, not
blamed. One warning per blocked stretch.

A stale stamp is a block only if the loop thread was free to run. Two cases look alike
and are not reported: the whole process was held up (CPU quota throttling, descheduled,
SIGSTOP) and, at the resume, the watchdog thread ran before the loop could stamp; and the
loop thread waiting in its selector (idle: the OS has not scheduled it yet). The first is
told by the watchdog's own lateness that the process's CPU time does not account for: a
stall delays both threads alike and uses no CPU, so that part of the stamp's age is not
counted; a loop holding the GIL (a long regex, a big ``json.loads``) also makes the
watchdog late, but the process runs meanwhile, and that is a block. The second by the loop
thread's innermost frames being the event loop's own ``select()``. A real block goes on
past either check and is reported at a later tick of the same stretch.

A loop that is merely overloaded (many ready callbacks, none long) can also miss its
stamp; the warning then names whichever task happened to run, which is the usual
limitation of sampling.
"""

from __future__ import annotations

import asyncio
import logging
import os
import selectors
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import anyio

from engine.triggerer.attempts import trigger_in_frame

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from anyio.abc import TaskStatus

__all__ = ("LoopBlocked", "LoopWatchdog")

logger = logging.getLogger(__name__)

TICKS_PER_THRESHOLD: Final = 4
THREAD_JOIN_TIMEOUT_S: Final = 2.0
# select() of every selector asyncio may use: the loop thread in there is idle, not blocked
_SELECTORS: Final = ("SelectSelector", "PollSelector", "EpollSelector", "DevpollSelector")
_SELECTOR_WAIT_CODES: Final = frozenset(
    cls.select.__code__
    for name in (*_SELECTORS, "KqueueSelector")
    if (cls := getattr(selectors, name, None)) is not None
)
_RUN_ONCE_CODE: Final = asyncio.BaseEventLoop._run_once.__code__  # type: ignore[attr-defined]
_ADVICE: Final = "triggers must not make blocking calls: use async I/O or anyio.to_thread.run_sync"
_POLL_ADVICE: Final = (
    "a shared stream's producer must not make blocking calls: use async I/O or "
    "anyio.to_thread.run_sync"
)
_POLL_TASK_PREFIX: Final = "shared-stream-poll["
BUSY_THREADS_SHOWN: Final = 3
#: the event loop's and the task group's own code: where a frame says nothing of who blocked
_LOOP_DIRS: Final = tuple(
    os.path.dirname(module.__file__) + os.sep for module in (asyncio, anyio) if module.__file__
)
_STDLIB_DIR: Final = os.path.dirname(os.__file__) + os.sep
#: where a thread that waits (for work, a lock, a socket) sits: not running Python code
_WAITING_FILES: Final = frozenset(
    {
        "threading.py",
        "queue.py",
        "selectors.py",
        "thread.py",
        "_asyncio.py",
        "socket.py",
        "unix_events.py",
    }
)


@dataclass(frozen=True, slots=True)
class LoopBlocked:
    """What the watchdog saw: how long the loop was blocked so far, and who was running."""

    blocked_s: float
    trigger_id: int | None
    culprit: str  # the trigger's classpath, or the name of the running asyncio task
    count: int
    #: where the loop thread was (``file:line in function``), or the other threads running
    where: str = ""


class LoopWatchdog:
    """Warns when the event loop is blocked longer than ``threshold_s``.

    ``on_block`` (optional) is called with a ``LoopBlocked`` from the watchdog's thread,
    not from the loop; keep it short and thread-safe.
    """

    def __init__(
        self, threshold_s: float, *, on_block: Callable[[LoopBlocked], None] | None = None
    ) -> None:
        if threshold_s <= 0:
            raise ValueError(f"threshold_s must be > 0, got {threshold_s}")
        self._threshold_s = threshold_s
        self._tick_s = threshold_s / TICKS_PER_THRESHOLD
        self._on_block = on_block
        self._last_tick = time.monotonic()
        self._blocked_count = 0
        self._checks = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None

    @property
    def blocked_count(self) -> int:
        """How many blocked stretches were reported."""
        return self._blocked_count

    @property
    def checks(self) -> int:
        """How many times the watchdog thread checked the loop."""
        return self._checks

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Stamp the loop and watch it from a thread until cancelled."""
        if self._loop is not None:
            raise RuntimeError("LoopWatchdog.run() is already running")
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._last_tick = time.monotonic()
        stop = threading.Event()
        thread = threading.Thread(
            target=self._watch, args=(stop,), name="sluice-loop-watchdog", daemon=True
        )
        thread.start()
        try:
            task_status.started()
            while True:
                self._last_tick = time.monotonic()
                await anyio.sleep(self._tick_s)
        finally:
            stop.set()
            # The thread waits on ``stop``: it exits at once, the join is immediate.
            thread.join(THREAD_JOIN_TIMEOUT_S)
            self._loop = None
            self._loop_thread_id = None

    def _watch(self, stop: threading.Event) -> None:
        reported_tick: float | None = None
        seen_tick: float | None = None
        stalled_s = 0.0  # since the stamp ``seen_tick``: time the whole process did not run
        checked, cpu_checked = time.monotonic(), time.process_time()
        while not stop.wait(self._tick_s):
            self._checks += 1
            now, cpu = time.monotonic(), time.process_time()
            # Read after the clock: a stamp written in between only makes the age smaller.
            tick = self._last_tick
            if tick != seen_tick:
                seen_tick, stalled_s = tick, 0.0
            # The watchdog woke late either because the process did not run (a stall: no
            # block) or because the loop held the GIL (a block): the process's CPU time
            # tells them apart.
            late_s = max(now - checked - self._tick_s, 0.0)
            stalled_s += max(late_s - (cpu - cpu_checked), 0.0)
            checked, cpu_checked = now, cpu
            blocked_s = now - tick
            if blocked_s - stalled_s < self._threshold_s or tick == reported_tick:
                continue
            if self._loop_is_waiting():
                continue
            reported_tick = tick
            self._report(blocked_s)

    def _loop_is_waiting(self) -> bool:
        """Whether the loop thread waits in the event loop's own selector: idle, not blocked
        (a selector that blocking code waits in, e.g. ``subprocess.run``'s, is a block)."""
        frame = sys._current_frames().get(self._loop_thread_id or -1)
        return (
            frame is not None
            and frame.f_code in _SELECTOR_WAIT_CODES
            and frame.f_back is not None
            and frame.f_back.f_code is _RUN_ONCE_CODE
        )

    def _report(self, blocked_s: float) -> None:
        self._blocked_count += 1
        try:
            trigger_id, culprit = self._find_culprit()
            where = self._where()
        except Exception:  # noqa: BLE001 - diagnostics must never kill the watchdog
            trigger_id, culprit = None, "<unknown: the loop stack could not be read>"
            where = "?"
        extra = {
            "action": "loop_blocked",
            "trigger_id": trigger_id,
            "culprit": culprit,
            "where": where,
            "blocked_s": blocked_s,
            "count": self._blocked_count,
        }
        if trigger_id is not None:
            logger.warning(
                "Event loop blocked for %.2fs while running trigger %s (%s) at %s; %s",
                blocked_s,
                trigger_id,
                culprit,
                where,
                _ADVICE,
                extra=extra,
            )
        elif _POLL_TASK_PREFIX in culprit:
            logger.warning(
                "Event loop blocked for %.2fs in %s, running %s; %s",
                blocked_s,
                where,
                culprit,
                _POLL_ADVICE,
                extra=extra,
            )
        else:
            logger.warning(
                "Event loop blocked for %.2fs in %s, running %s (no trigger on the stack)",
                blocked_s,
                where,
                culprit,
                extra=extra,
            )
        if self._on_block is not None:
            self._notify(LoopBlocked(blocked_s, trigger_id, culprit, self._blocked_count, where))

    def _notify(self, blocked: LoopBlocked) -> None:
        assert self._on_block is not None
        try:
            self._on_block(blocked)
        except Exception:
            logger.exception(
                "LoopWatchdog on_block callback raised", extra={"action": "loop_blocked"}
            )

    def _find_culprit(self) -> tuple[int | None, str]:
        """Who runs on the loop thread right now: (trigger id, classpath) or (None, task)."""
        frame: FrameType | None = sys._current_frames().get(self._loop_thread_id or -1)
        while frame is not None:
            if (running := trigger_in_frame(frame)) is not None:
                return running
            frame = frame.f_back
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        return None, (f"task {task.get_name()!r}" if task is not None else "a loop callback")

    def _where(self) -> str:
        """Where the loop thread is: its innermost frame outside the event loop's code (and
        the innermost outside the standard library, if that one is inside it); then the
        other threads that were running Python code, if any (a loop thread that waits for
        the GIL shows no code of its own, or whatever line it was preempted at)."""
        frames = _inside_the_loop(sys._current_frames().get(self._loop_thread_id or -1))
        own = [frame for frame in frames if not frame.f_code.co_filename.startswith(_LOOP_DIRS)]
        busy = self._busy_threads()
        running = f"; other threads running: {'; '.join(busy)}" if busy else ""
        if not own:
            return f"the event loop's own code (waiting for the GIL?{running})"
        where = _frame_text(own[0])
        caller = next((f for f in own if not _is_stdlib(f)), None)
        if caller is not None and caller is not own[0]:
            where += f", called from {_frame_text(caller)}"
        return where + running

    def _busy_threads(self) -> list[str]:
        """``name at file:line in function`` of each other thread running Python code."""
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        mine = {self._loop_thread_id, threading.get_ident()}
        busy = []
        for ident, frame in sys._current_frames().items():
            if ident in mine or os.path.basename(frame.f_code.co_filename) in _WAITING_FILES:
                continue
            busy.append(f"{names.get(ident, ident)} at {_frame_text(frame)}")
        return busy[:BUSY_THREADS_SHOWN]

    def __repr__(self) -> str:
        state = "running" if self._loop is not None else "stopped"
        return (
            f"<LoopWatchdog {state} threshold={self._threshold_s}s "
            f"blocked_count={self._blocked_count} checks={self._checks}>"
        )


def _inside_the_loop(frame: FrameType | None) -> list[FrameType]:
    """``frame`` and its callers, innermost first, up to the event loop's ``_run_once``
    (what runs one callback; the frames outside it, the process's main, name nobody)."""
    frames = []
    while frame is not None and frame.f_code is not _RUN_ONCE_CODE:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _is_stdlib(frame: FrameType) -> bool:
    """A frame of the standard library: its files, or a frozen module (importlib's)."""
    filename = frame.f_code.co_filename
    if filename.startswith("<frozen "):
        return True
    return filename.startswith(_STDLIB_DIR) and "site-packages" not in filename


def _frame_text(frame: FrameType) -> str:
    """``path:line in function``, the path from its top-level package on (``producers/
    kafka.py``, ``aiokafka/conn.py``), as its module's dotted name places it."""
    filename = frame.f_code.co_filename
    module = frame.f_globals.get("__name__")
    parts = filename.split(os.sep)
    if isinstance(module, str) and not filename.startswith("<") and len(parts) > 1:
        depth = module.count(".") + (2 if parts[-1] == "__init__.py" else 1)
        filename = os.sep.join(parts[-depth:])
    return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
