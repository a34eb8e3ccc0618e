"""How a trigger's attempt fails, and what follows: the failure and restart policy, the report.

Theory of operation. Every way an attempt can go wrong (an exception, a ``run()`` that
returns instead of yielding, an item that is not a ``TriggerEvent``, a ``dedup_key()`` that
returns something else than a str, an event source that ends) is one ``Failure``: a reason
and, for an exception, its traceback. The runtime reports each one (an ERROR line and a
``TriggerFailed`` in the outbox); a ``TASK`` trigger then ends, a ``WATCHER`` trigger is
restarted from a fresh instance (``rebuild``) after a backoff.

``RestartPolicy.count`` numbers a failure within its *streak* (the failures of a watcher in
a row): the backoff doubles from the initial to the maximum, and an attempt that ran for
``healthy_run_s`` starts a new streak. The streak also remembers what the log already
said, so that a watcher failing again the same way (a broker that stays down) stays quiet:

- an *unavailable* upstream (``triggers.exceptions.is_upstream_unavailable``: a producer's
  ``UpstreamUnavailable``, or a socket refused, reset, unreachable, timing out on connect, a
  name that does not resolve; not a bare ``TimeoutError``) is an expected condition:
  the first failure of the streak is one WARNING naming the address and the backoff, with
  no traceback; the retries after it are DEBUG lines (the producer says at INFO when it
  connects again);
- an upstream that *refused* the trigger (``triggers.exceptions.UpstreamRefused``: a login
  or a TLS handshake that failed) is an ERROR with its cause, no traceback, once per
  distinct error in the streak; the retries failing the same way are DEBUG lines;
- any other error is an ERROR line per failure, with its traceback only the first time the
  streak meets that error (``seen``), not at every retry; but a subscriber whose group was
  fenced (its triggerer lost its lease, said once by the triggerer and once per group) has
  no traceback to show: the trigger did nothing wrong.

The policy does no I/O and has no clock: time is an argument (``ran_s``). ``report`` writes
the ERROR line and returns the ``TriggerFailed`` for the runtime to put in the outbox.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from engine.triggerer.outbox import TriggerFailed
from shared_stream.exceptions import SharedStreamFenced
from triggers.base import BaseTrigger, TriggerEvent, classpath_of
from triggers.exceptions import (
    TriggerContractError,
    UpstreamRefused,
    is_upstream_unavailable,
    upstream_address,
)

if TYPE_CHECKING:
    from engine.states import TriggerKind

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
#: in ``Failure.seen``: the streak logged its one warning about an unavailable upstream
UNAVAILABLE_WARNED: Final = "\x00unavailable-warned"
_NONE: Final[frozenset[str]] = frozenset()


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an attempt failed; numbered within its streak by ``RestartPolicy.count``."""

    reason: str
    traceback: str | None = None
    in_row: int = 1  # failures of this trigger in a row, this one included
    repeats: bool = False  # the one before it failed with the same reason
    backoff_s: float = 0.0  # how long a watcher waits before its restart
    #: the upstream cannot be reached (an expected condition: a warning, no traceback)
    unavailable: bool = False
    #: the upstream refused the trigger (login, TLS): an error, but its repeats are quiet
    refused: bool = False
    address: str | None = None  # where the unreachable upstream is, when the error says
    #: what the unreachable upstream is (``shared_stream.keys.broker_kind``: "kafka", ...,
    #: or the trigger class's name); set by the attempt that knows the trigger and its key
    broker: str | None = None
    #: what the streak logged before this failure: the reasons shown with their traceback,
    #: and UNAVAILABLE_WARNED once the unavailable upstream was warned about
    seen: frozenset[str] = frozenset()

    @classmethod
    def from_exception(cls, exc: BaseException) -> Failure:
        """The failure an exception is; an unavailable upstream's traceback is kept for the
        outbox (a deferred task's failure carries it) but never logged."""
        text = "".join(traceback.format_exception(exc))
        if is_upstream_unavailable(exc):
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else repr(exc)
            return cls(reason, text, unavailable=True, address=upstream_address(exc))
        if isinstance(exc, UpstreamRefused):
            return cls(f"{type(exc).__name__}: {exc}", text, refused=True, address=exc.address)
        if isinstance(exc, SharedStreamFenced):  # the lease lost: the triggerer says where
            return cls(repr(exc))
        return cls(repr(exc), text)

    @property
    def is_warned(self) -> bool:
        """The streak already warned that the upstream is unavailable: stay quiet."""
        return UNAVAILABLE_WARNED in self.seen

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
        return Failure(reason, self.traceback, seen=self.seen)


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
            return replace(failure, in_row=1, repeats=False, backoff_s=self.initial_s, seen=_NONE)
        return replace(
            failure,
            in_row=previous.in_row + 1,
            repeats=previous.reason == failure.reason,
            backoff_s=min(previous.backoff_s * 2, self.max_s),
            seen=previous.seen | _logged(previous),
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


def _logged(failure: Failure) -> frozenset[str]:
    """What logging ``failure`` added to its streak's memory."""
    return frozenset({UNAVAILABLE_WARNED if failure.unavailable else failure.reason})


def report(
    trigger_id: int,
    kind: TriggerKind,
    failure: Failure,
    *,
    restart_in_s: float | None = None,
    max_backoff_s: float | None = None,
) -> TriggerFailed:
    """Log ``failure``; the ``TriggerFailed`` that carries it to the persister.

    ``restart_in_s`` is the backoff before a restart (``max_backoff_s`` its ceiling). See
    the module docstring for what is logged at which level.
    """
    will_restart = restart_in_s is not None
    extra = {
        "action": "trigger_failed",
        "trigger_id": trigger_id,
        "will_restart": will_restart,
        "backoff_s": restart_in_s,
        "failures_in_row": failure.in_row,
        "unavailable": failure.unavailable,
    }
    if failure.unavailable:
        _log_unavailable(trigger_id, kind, failure, restart_in_s, max_backoff_s, extra)
    elif failure.refused:
        extra["address"] = failure.address
        logger.log(
            logging.DEBUG if failure.reason in failure.seen else logging.ERROR,
            "Trigger %s (%s) was refused by %s%s: %s%s",
            trigger_id,
            kind.value,
            failure.address or "its upstream",
            f" ({failure.in_row} times in a row)" if failure.in_row > 1 else "",
            failure.reason,
            f"; restarting it in {restart_in_s:.3g}s" if will_restart else "",
            extra=extra,
        )
    else:
        logger.error(
            "Trigger %s (%s) failed%s: %s%s%s",
            trigger_id,
            kind.value,
            f" ({failure.in_row} times in a row)" if failure.in_row > 1 else "",
            failure.reason,
            f"; restarting it in {restart_in_s:.3g}s" if will_restart else "",
            f"\n{failure.traceback}"
            if failure.traceback and failure.reason not in failure.seen
            else "",
            extra=extra,
        )
    unreachable = failure.unavailable
    return TriggerFailed(
        trigger_id,
        kind,
        failure.reason,
        failure.traceback,
        will_restart,
        unreachable_broker=failure.broker if unreachable else None,
        unreachable_address=failure.address if unreachable else None,
    )


def _log_unavailable(
    trigger_id: int,
    kind: TriggerKind,
    failure: Failure,
    restart_in_s: float | None,
    max_backoff_s: float | None,
    extra: dict[str, object],
) -> None:
    """One WARNING per streak (an ERROR for a task's trigger: the task fails), then DEBUG."""
    where = failure.address or "its upstream"
    extra["address"] = failure.address
    if restart_in_s is None:
        logger.error(
            "Trigger %s (%s) cannot reach %s: %s",
            trigger_id,
            kind.value,
            where,
            failure.reason,
            extra=extra,
        )
    elif failure.is_warned:
        logger.debug(
            "Trigger %s (%s) still cannot reach %s (attempt %d): %s; retrying in %.3gs",
            trigger_id,
            kind.value,
            where,
            failure.in_row,
            failure.reason,
            restart_in_s,
            extra=extra,
        )
    else:
        ceiling = restart_in_s if max_backoff_s is None else max(max_backoff_s, restart_in_s)
        logger.warning(
            "Trigger %s (%s) cannot reach %s: %s; retrying in %.3gs, then with a backoff "
            "doubling up to %.3gs; the retries are logged at DEBUG until it connects",
            trigger_id,
            kind.value,
            where,
            failure.reason,
            restart_in_s,
            ceiling,
            extra=extra,
        )
