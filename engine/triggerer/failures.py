"""How a trigger's attempt fails, and what follows: the failure and restart policy, the report.

Theory of operation. Every way an attempt can go wrong (an exception, a ``run()`` that
returns instead of yielding, an item that is not a ``TriggerEvent``, a ``dedup_key()`` that
returns something else than a str, an event source that ends) is one ``Failure``: a reason
and, for an exception, its traceback. The runtime reports each one (an ERROR line and a
``TriggerFailed`` in the outbox); a ``TASK`` trigger then ends, a ``WATCHER`` trigger is
restarted from a fresh instance (``rebuild``) after a backoff.

``RestartPolicy.count`` numbers a failure within its *streak* (the failures of a watcher in
a row): the backoff doubles from the initial to the maximum, and an attempt that ran for
``healthy_run_s`` starts a new streak. A failure that repeats the reason of the one before
says so (``repeats``), so that a watcher failing the same way again (a broker that stays
down) is logged in one line, its traceback only at the first failure of the streak.

The policy does no I/O and has no clock: time is an argument (``ran_s``). ``report`` writes
the ERROR line and returns the ``TriggerFailed`` for the runtime to put in the outbox.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from engine.triggerer.outbox import TriggerFailed
from triggers.base import BaseTrigger, TriggerEvent, classpath_of
from triggers.exceptions import TriggerContractError

if TYPE_CHECKING:
    from engine.db.models import TriggerKind

__all__ = (
    "EXITED_WITHOUT_EVENT",
    "RETURNED_EVENT",
    "WATCHER_EXITED",
    "Failure",
    "RestartPolicy",
    "rebuild",
    "report",
)

# These lines are about a trigger's task: they keep the runtime's logger name, which
# operators (and tests) filter on.
logger = logging.getLogger("engine.triggerer.runtime")

EXITED_WITHOUT_EVENT: Final = "Trigger exited without sending an event"
WATCHER_EXITED: Final = "watcher trigger exited; event triggers must keep running"
_USE_YIELD: Final = "make run() an async generator (use `yield`)"
RETURNED_EVENT: Final = f"run() returned a TriggerEvent instead of yielding it; {_USE_YIELD}"


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an attempt failed; numbered within its streak by ``RestartPolicy.count``."""

    reason: str
    traceback: str | None = None
    in_row: int = 1  # failures of this trigger in a row, this one included
    repeats: bool = False  # the one before it failed with the same reason
    backoff_s: float = 0.0  # how long a watcher waits before its restart

    @classmethod
    def from_exception(cls, exc: BaseException) -> Failure:
        return cls(repr(exc), "".join(traceback.format_exception(exc)))

    @classmethod
    def returned(cls, result: object) -> Failure:
        """``run()`` is a coroutine function that returned ``result``."""
        if isinstance(result, TriggerEvent):
            return cls(RETURNED_EVENT)
        return cls(
            f"run() returned {type(result).__name__} instead of yielding TriggerEvents; "
            f"{_USE_YIELD}"
        )

    @classmethod
    def exhausted(cls, *, is_task: bool) -> Failure:
        """The event source ended: before its event (a task's), or at all (a watcher's)."""
        return cls(EXITED_WITHOUT_EVENT if is_task else WATCHER_EXITED)

    @classmethod
    def not_an_event(cls, item: object) -> Failure:
        return cls(f"yielded {type(item).__name__} instead of a TriggerEvent")

    @classmethod
    def bad_dedup_key(cls, key: object) -> Failure:
        return cls(
            f"dedup_key() returned {type(key).__name__}, not a str or None"
            " (it must be a plain def returning a str)"
        )

    def not_rebuilt(self) -> Failure:
        """This failure (of ``rebuild``) as the end of a watcher that cannot restart."""
        reason = f"could not re-create the trigger to restart it: {self.reason}"
        return Failure(reason, self.traceback)


class RestartPolicy:
    """The backoff of a failing watcher: doubling, reset by a healthy run."""

    __slots__ = ("healthy_run_s", "initial_s", "max_s")

    def __init__(self, backoff_s: tuple[float, float], healthy_run_s: float) -> None:
        initial_s, max_s = backoff_s
        if not 0 <= initial_s <= max_s:
            raise ValueError(f"restart_backoff_s must be (initial, max), got {backoff_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self.healthy_run_s = healthy_run_s

    def count(self, previous: Failure | None, failure: Failure, *, ran_s: float) -> Failure:
        """``failure`` numbered after ``previous`` (the last of the streak, if any), for an
        attempt that ran ``ran_s`` seconds, with the backoff before the next attempt."""
        if previous is None or ran_s >= self.healthy_run_s:  # a new streak
            return Failure(failure.reason, failure.traceback, backoff_s=self.initial_s)
        return Failure(
            failure.reason,
            failure.traceback,
            in_row=previous.in_row + 1,
            repeats=previous.reason == failure.reason,
            backoff_s=min(previous.backoff_s * 2, self.max_s),
        )

    def __repr__(self) -> str:
        return (
            f"<RestartPolicy backoff={self.initial_s}..{self.max_s}s "
            f"healthy_run={self.healthy_run_s}s>"
        )


def rebuild(trigger: BaseTrigger) -> BaseTrigger:
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


def report(
    trigger_id: int, kind: TriggerKind, failure: Failure, *, restart_in_s: float | None = None
) -> TriggerFailed:
    """Log ``failure``; the ``TriggerFailed`` that carries it to the persister.

    ``restart_in_s`` is the backoff before a restart. A watcher that fails again the same
    way is logged in one line with its count: the traceback was in the log at the first
    failure of the streak.
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
    return TriggerFailed(trigger_id, kind, failure.reason, failure.traceback, will_restart)
