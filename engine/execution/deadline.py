"""``execution_timeout``: the deadline of a try, counted from the try's start over all its
steps (deferrals included, as in Airflow: a task can time out while deferred or shortly
after resuming).

In the task process a ``Deadline`` interrupts the task's main thread with
``TaskExecutionTimeout`` (a SIGALRM timer) when the try's time is up; the executor kills a
process that does not stop within a grace period, and names the reason with
``timeout_message``.
"""

from __future__ import annotations

import math
import signal
from typing import TYPE_CHECKING, Any

from engine.exceptions import AirflowTaskTimeout

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime, timedelta
    from types import FrameType


class TaskExecutionTimeout(AirflowTaskTimeout):
    """Raised inside a task that ran past its ``execution_timeout`` (deferrals included)."""


def format_seconds(seconds: float) -> str:
    return f"{seconds:.0f}" if float(seconds).is_integer() else f"{seconds:.1f}"


def timeout_message(timeout_s: float, elapsed_s: float, deferrals: int) -> str:
    """The failure reason of a try that ran past its ``execution_timeout``."""
    return (
        f"execution_timeout ({format_seconds(timeout_s)}s) exceeded after {elapsed_s:.1f}s "
        f"across {deferrals} deferral{'' if deferrals == 1 else 's'}"
    )


def remaining_s(try_started_at: datetime, timeout: timedelta | None, now: datetime) -> float:
    """Seconds left before the try's execution deadline (``inf`` without a timeout)."""
    if timeout is None:
        return math.inf
    return (try_started_at + timeout - now).total_seconds()


class Deadline:
    """Interrupts the main thread with ``TaskExecutionTimeout`` after ``seconds``."""

    def __init__(self, seconds: float, message: Callable[[], str]) -> None:
        self._seconds = seconds
        self._message = message
        self._previous: Any = None
        self.fired = False

    def __repr__(self) -> str:
        return f"<Deadline in {self._seconds:.3f}s fired={self.fired}>"

    @property
    def expired(self) -> bool:
        return self._seconds <= 0

    def __enter__(self) -> Deadline:
        if math.isfinite(self._seconds):
            self._previous = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, max(self._seconds, 0.001))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if math.isfinite(self._seconds):
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous or signal.SIG_DFL)

    def _fire(self, _signum: int, _frame: FrameType | None) -> None:
        self.fired = True
        raise TaskExecutionTimeout(self._message())
