"""``BaseSensorOperator``: a task that waits for a condition, as Airflow 3's sensors do.

Theory of operation. A sensor calls ``poke(context)`` until it returns something truthy
(True, or ``PokeReturnValue(is_done=True, xcom_value=...)``: the ``xcom_value`` becomes the
task's result). How it waits between pokes:

- ``mode="poke"`` (the default): it sleeps ``poke_interval`` seconds in its worker slot.
- ``mode="reschedule"``: it gives the slot back between pokes. It defers to a time trigger
  (the task is ``deferred`` meanwhile) and, when that fires, a fresh instance pokes again
  (``RESCHEDULE_METHOD``); the first poke's time and the poke count travel in the
  deferral's kwargs, so ``timeout`` still counts from the first poke.
- ``deferrable=True`` on a sensor that offers a trigger (``deferral_trigger``): it hands the
  whole wait to that trigger at once (``deferrable=None`` follows ``[operators]
  default_deferrable``).

``timeout`` (seconds or a timedelta, default 7 days) is measured from the first poke;
past it the sensor fails with ``AirflowSensorTimeout``. ``exponential_backoff=True`` doubles
the wait after each poke (with a per-task jitter so that sensors started together spread
out), capped by ``max_wait`` and by the time left. Outcomes, as in Airflow 3:
``soft_fail=True`` turns a timeout, an ``AirflowTaskTimeout`` or an ``AirflowFailException``
into a skip; ``never_fail=True`` turns any error of ``poke`` into a skip (the two are
exclusive); ``silent_fail=True`` logs an unexpected error of ``poke`` and pokes again.

Unlike Airflow, a rescheduled sensor shows ``deferred`` between pokes (Airflow's
``up_for_reschedule``), and its ``execution_timeout`` counts the whole try, waits included
(as for every deferred task here), where Airflow counts only the pokes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.baseoperator import BaseOperator
from engine.authoring.context import default_deferrable_from, resolve_deferrable, run_to_completion
from engine.authoring.errors import DagDefinitionError, SensorTimeout, TaskDeferralTimeout
from engine.authoring.locations import caller_location
from engine.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    AirflowTaskTimeout,
)
from triggers.temporal import DateTimeTrigger

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from engine.authoring.context import Context
    from triggers.base import BaseTrigger

logger = logging.getLogger(__name__)

DEFAULT_POKE_INTERVAL_S: Final = 60.0
DEFAULT_SENSOR_TIMEOUT_S: Final = 7 * 24 * 3600.0
EXECUTE_COMPLETE: Final = "execute_complete"
#: where a sensor in reschedule mode resumes to poke again
RESCHEDULE_METHOD: Final = "poke_after_reschedule"
SENSOR_MODES: Final = ("poke", "reschedule")
# What soft_fail turns into a skip (Airflow 3): a timeout, or a deliberate failure.
SOFT_FAIL_ERRORS: Final = (AirflowSensorTimeout, AirflowTaskTimeout, AirflowFailException)


class PokeReturnValue:
    """What ``poke`` may return instead of a bool: done or not, and the task's result."""

    __slots__ = ("is_done", "xcom_value")

    def __init__(self, is_done: bool, xcom_value: Any | None = None) -> None:
        self.is_done = bool(is_done)
        self.xcom_value = xcom_value

    def __bool__(self) -> bool:
        return self.is_done

    def __repr__(self) -> str:
        return f"PokeReturnValue(is_done={self.is_done}, xcom_value={self.xcom_value!r})"


def as_seconds(where: str, name: str, value: object) -> float:
    """A duration argument (seconds or a timedelta, >= 0) as float seconds."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DagDefinitionError(f"{where}: {name} must be seconds or a timedelta, got {value!r}")
    if not value >= 0:  # also refuses nan
        raise DagDefinitionError(f"{where}: {name} must be >= 0 seconds, got {value}")
    return float(value)


def next_poke_interval(
    poke_interval_s: float,
    poke_count: int,
    *,
    exponential_backoff: bool,
    max_wait_s: float | None,
    remaining_s: float,
    jitter_key: str,
) -> float:
    """Seconds to wait after poke number ``poke_count`` (1 for the first) failed.

    Without backoff: ``poke_interval_s``. With it: the wait doubles after each poke, from
    half the interval after the first; a jitter derived from ``jitter_key`` (the task and
    its first poke) puts it anywhere in ``[w, 2w)``, so that sensors started together do
    not poke in step. It never exceeds ``max_wait_s`` nor the time left (``remaining_s``).
    """
    if not exponential_backoff:
        return poke_interval_s
    low = poke_interval_s * 2.0 ** (poke_count - 2)
    digest = hashlib.sha256(f"{jitter_key}#{poke_count}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2.0**64
    wait = min(low * (1.0 + fraction), max(remaining_s, 0.0))
    return wait if max_wait_s is None else min(wait, max_wait_s)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class BaseSensorOperator(BaseOperator):
    """Waits until ``poke(context)`` is truthy; defers when ``deferral_trigger`` offers one.

    Arguments (Airflow's): ``poke_interval``, ``timeout``, ``mode`` (``"poke"`` or
    ``"reschedule"``), ``soft_fail``, ``never_fail``, ``silent_fail``,
    ``exponential_backoff``, ``max_wait`` and ``deferrable``; see the module docstring.
    """

    def __init__(
        self,
        *,
        deferrable: bool | None = None,
        poke_interval: float | timedelta = DEFAULT_POKE_INTERVAL_S,
        timeout: float | timedelta | None = None,
        mode: str = "poke",
        soft_fail: bool = False,
        silent_fail: bool = False,
        never_fail: bool = False,
        exponential_backoff: bool = False,
        max_wait: float | timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        where = f"{caller_location()}: sensor {self.task_id!r}"
        if deferrable is not None and not isinstance(deferrable, bool):
            raise DagDefinitionError(f"{where}: deferrable must be True, False or None")
        self.deferrable = deferrable
        self.poke_interval = as_seconds(where, "poke_interval", poke_interval)
        timeout = DEFAULT_SENSOR_TIMEOUT_S if timeout is None else timeout
        self.timeout = as_seconds(where, "timeout", timeout)
        if mode not in SENSOR_MODES:
            raise DagDefinitionError(f"{where}: mode must be one of {SENSOR_MODES}, got {mode!r}")
        self.mode = mode
        if soft_fail and never_fail:
            raise DagDefinitionError(
                f"{where}: soft_fail and never_fail are mutually exclusive; set one of them"
            )
        self.soft_fail = bool(soft_fail)
        self.never_fail = bool(never_fail)
        self.silent_fail = bool(silent_fail)
        self.exponential_backoff = bool(exponential_backoff)
        self.max_wait = None if max_wait is None else as_seconds(where, "max_wait", max_wait)
        #: when the first poke of this try happened (kept across reschedules); None before
        self.first_poke_at: datetime | None = None

    @property
    def reschedule(self) -> bool:
        """True in ``mode="reschedule"``: the slot is freed between pokes."""
        return self.mode == "reschedule"

    def poke(self, context: Context) -> bool | PokeReturnValue:
        """Truthy once the condition holds (a ``PokeReturnValue`` also sets the result)."""
        raise NotImplementedError(f"{type(self).__name__} must implement poke(context)")

    def deferral_trigger(self, context: Context) -> BaseTrigger | None:
        """The trigger to defer to in deferrable mode; None: this sensor only pokes."""
        return None

    # --- the outcome rules ------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        return self._skip_timeout_if_soft(lambda: self._wait(context))

    def resume_execution(
        self, next_method: str, next_kwargs: Mapping[str, Any] | None, context: Context
    ) -> Any:
        """Resume after a deferral. Back from a reschedule, the rules of ``execute`` apply;
        back from a trigger, Airflow's: a deferral that timed out is a sensor timeout,
        ``soft_fail`` / ``never_fail`` skip a timeout or an ``AirflowFailException``, and
        ``never_fail`` skips any other failure too."""
        if next_method == RESCHEDULE_METHOD:
            return self._skip_timeout_if_soft(
                lambda: BaseOperator.resume_execution(self, next_method, next_kwargs, context)
            )
        try:
            try:
                return BaseOperator.resume_execution(self, next_method, next_kwargs, context)
            except TaskDeferralTimeout as exc:
                raise SensorTimeout(
                    f"sensor {self.task_id!r} did not succeed within {self.timeout:g} s "
                    "(its deferral timed out)"
                ) from exc
        except SOFT_FAIL_ERRORS as exc:
            if self.soft_fail or self.never_fail:
                raise self._skip(exc) from exc
            raise
        except AirflowSkipException:
            raise
        except AirflowException as exc:
            if self.never_fail:
                raise self._skip(exc) from exc
            raise

    def _skip_timeout_if_soft(self, step: Callable[[], Any]) -> Any:
        """Run ``step``; with ``soft_fail``, its timeout (poke or reschedule) is a skip."""
        try:
            return step()
        except SensorTimeout as exc:
            if self.soft_fail:
                raise self._skip(exc) from exc
            raise

    def _skip(self, exc: BaseException) -> AirflowSkipException:
        flag = "soft_fail" if self.soft_fail else "never_fail"
        what = "timed out" if isinstance(exc, AirflowSensorTimeout) else "skipped"
        return AirflowSkipException(f"sensor {self.task_id!r} {what} ({flag}): {exc}")

    # --- waiting --------------------------------------------------------------------------

    def _wait(self, context: Context) -> Any:
        if resolve_deferrable(self, default_deferrable_from(context)):
            trigger = run_to_completion(
                self.deferral_trigger(context), what=f"sensor {self.task_id!r}: deferral_trigger()"
            )
            if trigger is not None:
                self.defer(
                    trigger=trigger,
                    method_name=EXECUTE_COMPLETE,
                    timeout=timedelta(seconds=self.timeout),
                )
        if self.reschedule:
            return self._poke_or_reschedule(context, first_poke_at=self._utcnow(), poke_count=1)
        return self.poke_until_done(context)

    def execute_complete(self, context: Context, event: Any = None) -> Any:
        """Where a deferred sensor resumes: the trigger fired, so the wait is over."""
        return None

    def poke_until_done(self, context: Context) -> Any:
        """Poke mode: poke, sleep, poke ... until done (its result) or past ``timeout``."""
        started = self._monotonic()
        what = f"sensor {self.task_id!r}: poke()"
        poke_count = 1
        self.first_poke_at = self._utcnow()
        jitter_key = f"{self.dag_id_or_none()}#{self.task_id}#{self.first_poke_at.isoformat()}"
        while not (outcome := self._poke_once(context, what)):
            elapsed = self._monotonic() - started
            if elapsed >= self.timeout:
                raise self._timed_out(elapsed)
            wait = self._next_wait(poke_count, elapsed, jitter_key)
            self._sleep(min(wait, self.timeout - elapsed))
            poke_count += 1
        return self._result_of(outcome)

    def poke_after_reschedule(
        self, context: Context, event: Any = None, *, first_poke_at: datetime, poke_count: int
    ) -> Any:
        """Reschedule mode: where the fresh instance resumes to poke again."""
        return self._poke_or_reschedule(context, first_poke_at=first_poke_at, poke_count=poke_count)

    def _poke_or_reschedule(
        self, context: Context, *, first_poke_at: datetime, poke_count: int
    ) -> Any:
        """Poke once; when not done, defer to a time trigger (the slot is freed) and come
        back at ``RESCHEDULE_METHOD`` with the first poke's time and the next count."""
        self.first_poke_at = first_poke_at
        outcome = self._poke_once(context, f"sensor {self.task_id!r}: poke()")
        if outcome:
            return self._result_of(outcome)
        now = self._utcnow()
        elapsed = (now - first_poke_at).total_seconds()
        if elapsed >= self.timeout:
            raise self._timed_out(elapsed)
        jitter_key = f"{self.dag_id_or_none()}#{self.task_id}#{first_poke_at.isoformat()}"
        wait = min(self._next_wait(poke_count, elapsed, jitter_key), self.timeout - elapsed)
        logger.info(
            "Sensor %r not done after poke %d; rescheduled in %.3g s (slot freed)",
            self.task_id,
            poke_count,
            wait,
            extra={"action": "sensor_reschedule", "task_id": self.task_id},
        )
        self.defer(
            trigger=DateTimeTrigger(now + timedelta(seconds=wait)),
            method_name=RESCHEDULE_METHOD,
            kwargs={"first_poke_at": first_poke_at, "poke_count": poke_count + 1},
        )

    def _next_wait(self, poke_count: int, elapsed_s: float, jitter_key: str) -> float:
        return next_poke_interval(
            self.poke_interval,
            poke_count,
            exponential_backoff=self.exponential_backoff,
            max_wait_s=self.max_wait,
            remaining_s=self.timeout - elapsed_s,
            jitter_key=jitter_key,
        )

    def _timed_out(self, elapsed_s: float) -> SensorTimeout:
        return SensorTimeout(
            f"sensor {self.task_id!r} did not succeed within {self.timeout:g} s "
            f"({elapsed_s:.3g} s since its first poke, poked every {self.poke_interval:g} s)"
        )

    @staticmethod
    def _result_of(outcome: object) -> Any:
        return outcome.xcom_value if isinstance(outcome, PokeReturnValue) else None

    def _poke_once(self, context: Context, what: str) -> bool | PokeReturnValue:
        """One poke; its errors as Airflow 3 treats them (see the module docstring)."""
        try:
            outcome = run_to_completion(self.poke(context), what=what)
        except SOFT_FAIL_ERRORS as exc:
            if self.soft_fail or self.never_fail:
                raise self._skip(exc) from exc
            raise
        except AirflowSkipException:
            raise
        except Exception as exc:
            if self.silent_fail:
                logger.exception(
                    "%s failed; silent_fail is set, so the sensor pokes again",
                    what,
                    extra={"action": "poke_failed", "task_id": self.task_id},
                )
                return False
            if self.never_fail:
                raise AirflowSkipException(
                    f"sensor {self.task_id!r}: {what} failed ({type(exc).__name__}: {exc}); "
                    "skipped (never_fail)"
                ) from exc
            raise
        return outcome if isinstance(outcome, PokeReturnValue) else bool(outcome)

    def dag_id_or_none(self) -> str | None:
        return None if self.dag is None else self.dag.dag_id

    # --- clocks (tests replace them) ------------------------------------------------------

    def _monotonic(self) -> float:
        return time.monotonic()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _utcnow(self) -> datetime:
        return _utcnow()
