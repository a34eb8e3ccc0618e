"""Deadline alerts (Airflow 3's ``airflow.sdk``): ``DAG(deadline=DeadlineAlert(...))``
runs a callback once when a run has not finished by its deadline.

A deadline is ``reference + interval``; the references (``DeadlineReference``):

- ``DAGRUN_QUEUED_AT``: when the run was queued;
- ``DAGRUN_LOGICAL_DATE``: the run's logical date (a run without one, e.g. asset-triggered,
  gets no deadline);
- ``FIXED_DATETIME(dt)``: a fixed moment (a naive one is in the DAG's time zone);
- ``AVERAGE_RUNTIME(max_runs=10, min_runs=max_runs)``: when the run was created plus the
  average duration of the DAG's latest ``max_runs`` finished runs; with fewer than
  ``min_runs`` of them the run gets no deadline.

The callback is an ``AsyncCallback`` (an ``async def``) or a ``SyncCallback``: a top-level
callable, or its dotted path, and ``kwargs`` for it; it is called with those and
``context``: ``{"dag_run": the run's details, "deadline": {"id", "deadline_time"}}``.
``interval`` may be negative (an alert before the reference). A DAG may have several alerts
(a list). A run that finishes by its deadline never fires it; one still running, or that
finished after it, fires it once.

What the scheduler and the callback process do with them is ``engine.scheduler.deadlines``
and ``engine.execution.deadline_callbacks``; this module is the DAG file's side: the
definitions, checked, and their JSON (stored with the DAG).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, ClassVar, Final

from engine.authoring.errors import DagDefinitionError

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)

__all__ = (
    "AsyncCallback",
    "BaseDeadlineReference",
    "Callback",
    "DeadlineAlert",
    "DeadlineReference",
    "SyncCallback",
)

#: the key of a serialized reference that names its kind (Airflow's)
REFERENCE_TYPE_FIELD: Final = "reference_type"


# --- callbacks --------------------------------------------------------------------------------


class Callback:
    """A callable (or the dotted path of one) and the ``kwargs`` it is called with when a
    deadline is missed, besides ``context``."""

    kind: ClassVar[str] = "callback"

    def __init__(
        self, callback_callable: Callable[..., Any] | str, kwargs: dict[str, Any] | None = None
    ) -> None:
        where = f"{type(self).__name__}({callback_callable!r})"
        self.callable: Callable[..., Any] | None = None
        if callable(callback_callable):
            self.verify_callable(where, callback_callable)
            if callback_callable.__name__ == "<lambda>":
                raise DagDefinitionError(f"{where}: a lambda has no path; use a def")
            self.callable = callback_callable
            self.path = f"{callback_callable.__module__}.{callback_callable.__qualname__}"
        elif isinstance(callback_callable, str) and _is_dotted(callback_callable.strip()):
            self.path = callback_callable.strip()
            found = _import_path(self.path)
            if found is not None:
                if not callable(found):
                    raise DagDefinitionError(f"{where}: {self.path} is not callable")
                self.verify_callable(where, found)
        else:
            raise DagDefinitionError(
                f"{where}: give a callable or the dotted path of one ('package.module.name')"
            )
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(kwargs, dict):
            raise DagDefinitionError(f"{where}: kwargs must be a dict, got {kwargs!r}")
        if "context" in kwargs:
            raise DagDefinitionError(f"{where}: context is a reserved kwarg (the callback's)")
        try:
            json.dumps(kwargs)
        except (TypeError, ValueError) as exc:
            raise DagDefinitionError(
                f"{where}: kwargs must be JSON data (they are stored with the DAG): {exc}"
            ) from None
        self.kwargs = kwargs

    @classmethod
    def verify_callable(cls, where: str, callback: Callable[..., Any]) -> None:
        """Subclasses check what kind of callable they take."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Callback):
            return NotImplemented
        return (type(self), self.path, self.kwargs) == (type(other), other.path, other.kwargs)

    def __hash__(self) -> int:
        return hash((type(self), self.path, json.dumps(self.kwargs, sort_keys=True)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, kwargs={self.kwargs!r})"

    def serialize(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "kwargs": self.kwargs}


class AsyncCallback(Callback):
    """An ``async def`` (or other awaitable callable) run when a deadline is missed."""

    kind: ClassVar[str] = "async"

    @classmethod
    def verify_callable(cls, where: str, callback: Callable[..., Any]) -> None:
        if not (inspect.iscoroutinefunction(callback) or hasattr(callback, "__await__")):
            raise DagDefinitionError(f"{where}: an AsyncCallback takes an async def")


class SyncCallback(Callback):
    """A plain callable run when a deadline is missed. ``executor`` picks an executor in
    Airflow; Sluice runs every callback on its executors, so it must be left out."""

    kind: ClassVar[str] = "sync"

    def __init__(
        self,
        callback_callable: Callable[..., Any] | str,
        kwargs: dict[str, Any] | None = None,
        executor: str | None = None,
    ) -> None:
        super().__init__(callback_callable, kwargs)
        if executor is not None:
            raise DagDefinitionError(
                f"SyncCallback({self.path!r}): executor={executor!r}: Sluice runs callbacks on "
                "its executors, one kind per deployment; leave executor out"
            )
        self.executor = executor


# --- references -------------------------------------------------------------------------------


class BaseDeadlineReference:
    """What a deadline counts from; its ``reference_name`` is its kind."""

    @property
    def reference_name(self) -> str:
        return type(self).__name__

    def serialize_reference(self) -> dict[str, Any]:
        return {REFERENCE_TYPE_FIELD: self.reference_name}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BaseDeadlineReference):
            return NotImplemented
        return self.serialize_reference() == other.serialize_reference()

    def __hash__(self) -> int:
        return hash(json.dumps(self.serialize_reference(), sort_keys=True, default=str))

    def __repr__(self) -> str:
        return f"<{self.reference_name}>"


class DagRunLogicalDateDeadline(BaseDeadlineReference):
    """The run's logical date."""


class DagRunQueuedAtDeadline(BaseDeadlineReference):
    """When the run was queued."""


@dataclass(eq=False)
class FixedDatetimeDeadline(BaseDeadlineReference):
    """A fixed moment."""

    _datetime: datetime

    def serialize_reference(self) -> dict[str, Any]:
        moment = self._datetime
        if moment.utcoffset() is None:
            moment = moment.replace(tzinfo=UTC)
        return {REFERENCE_TYPE_FIELD: self.reference_name, "datetime": moment.timestamp()}

    def in_zone(self, zone: tzinfo) -> FixedDatetimeDeadline:
        """A naive moment read in the DAG's time zone ``zone``."""
        if self._datetime.utcoffset() is not None:
            return self
        return FixedDatetimeDeadline(self._datetime.replace(tzinfo=zone))


@dataclass(eq=False)
class AverageRuntimeDeadline(BaseDeadlineReference):
    """The run's creation plus the average duration of the DAG's latest finished runs."""

    DEFAULT_LIMIT: ClassVar[int] = 10
    max_runs: int
    min_runs: int | None = None

    def __post_init__(self) -> None:
        if self.min_runs is None:
            self.min_runs = self.max_runs
        for name in ("max_runs", "min_runs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DagDefinitionError(
                    f"DeadlineReference.AVERAGE_RUNTIME: {name} must be an int >= 1, got {value!r}"
                )

    def serialize_reference(self) -> dict[str, Any]:
        return {
            REFERENCE_TYPE_FIELD: self.reference_name,
            "max_runs": self.max_runs,
            "min_runs": self.min_runs,
        }


class DeadlineReference:
    """The references a ``DeadlineAlert`` counts from."""

    class TYPES:
        """Which references are evaluated when a run is created, which when it is queued."""

        DAGRUN_CREATED: ClassVar[tuple[type[BaseDeadlineReference], ...]] = (
            DagRunLogicalDateDeadline,
            FixedDatetimeDeadline,
            AverageRuntimeDeadline,
        )
        DAGRUN_QUEUED: ClassVar[tuple[type[BaseDeadlineReference], ...]] = (DagRunQueuedAtDeadline,)
        DAGRUN: ClassVar[tuple[type[BaseDeadlineReference], ...]] = DAGRUN_CREATED + DAGRUN_QUEUED

    DAGRUN_LOGICAL_DATE: ClassVar[BaseDeadlineReference] = DagRunLogicalDateDeadline()
    DAGRUN_QUEUED_AT: ClassVar[BaseDeadlineReference] = DagRunQueuedAtDeadline()

    @classmethod
    def FIXED_DATETIME(cls, dt: datetime) -> BaseDeadlineReference:
        if not isinstance(dt, datetime):
            raise DagDefinitionError(
                f"DeadlineReference.FIXED_DATETIME takes a datetime, got {dt!r}"
            )
        return FixedDatetimeDeadline(dt)

    @classmethod
    def AVERAGE_RUNTIME(
        cls, max_runs: int = 0, min_runs: int | None = None
    ) -> BaseDeadlineReference:
        if max_runs == 0:
            max_runs = AverageRuntimeDeadline.DEFAULT_LIMIT
        return AverageRuntimeDeadline(max_runs, max_runs if min_runs is None else min_runs)


# --- alerts -----------------------------------------------------------------------------------


class DeadlineAlert:
    """``callback`` runs once for a run not finished by ``reference + interval``."""

    def __init__(
        self,
        reference: BaseDeadlineReference,
        interval: timedelta,
        callback: Callback,
        name: str | None = None,
    ) -> None:
        if not isinstance(reference, BaseDeadlineReference):
            raise DagDefinitionError(
                f"DeadlineAlert: reference must be one of DeadlineReference's, got {reference!r}"
            )
        if not isinstance(interval, timedelta):
            raise DagDefinitionError(
                f"DeadlineAlert: interval must be a timedelta, got {interval!r}"
            )
        if not isinstance(callback, AsyncCallback | SyncCallback):
            raise DagDefinitionError(
                f"DeadlineAlert: callback must be an AsyncCallback or a SyncCallback, got "
                f"{callback!r}"
            )
        if name is not None and not isinstance(name, str):
            raise DagDefinitionError(f"DeadlineAlert: name must be a str, got {name!r}")
        self.reference = reference
        self.interval = interval
        self.callback = callback
        self.name = name

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeadlineAlert):
            return NotImplemented
        return (self.reference, self.interval, self.callback) == (
            other.reference,
            other.interval,
            other.callback,
        )

    def __hash__(self) -> int:
        return hash((self.reference, self.interval, self.callback))

    def __repr__(self) -> str:
        return (
            f"DeadlineAlert({self.reference!r} + {self.interval}, {self.callback!r}"
            f"{'' if self.name is None else f', name={self.name!r}'})"
        )

    def serialize(self) -> dict[str, Any]:
        return {
            "reference": self.reference.serialize_reference(),
            "interval_s": self.interval.total_seconds(),
            "callback": self.callback.serialize(),
            "name": self.name,
        }


def as_deadline_alerts(where: str, value: object, *, zone: tzinfo) -> tuple[DeadlineAlert, ...]:
    """``DAG(deadline=...)``: None, one ``DeadlineAlert`` or a list of them; a naive
    ``FIXED_DATETIME`` is read in the DAG's time zone ``zone``."""
    if value is None:
        return ()
    given: list[object] = list(value) if isinstance(value, list | tuple) else [value]
    alerts: list[DeadlineAlert] = []
    for alert in given:
        if not isinstance(alert, DeadlineAlert):
            raise DagDefinitionError(
                f"{where}: deadline must be a DeadlineAlert or a list of them, got {alert!r}"
            )
        if isinstance(alert.reference, FixedDatetimeDeadline):
            alert.reference = alert.reference.in_zone(zone)
        alerts.append(alert)
    return tuple(alerts)


def _is_dotted(path: str) -> bool:
    parts = path.split(".")
    return len(parts) >= 2 and all(part.isidentifier() for part in parts)


def _import_path(path: str) -> Any:
    """What ``path`` names, or None when it does not import here (it may in the process that
    runs the callback)."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        logger.debug("Deadline callback %s does not import here", path)
        return None
