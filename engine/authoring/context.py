"""Shared pieces of the authoring API: its errors, ``TaskDeferred`` and the task context.

What a DAG file imports lives in ``engine.authoring.assets`` (``Asset``, ``AssetAlias``,
``AssetWatcher``, ``Metadata``, conditions), ``engine.authoring.dag`` (``DAG``,
``BaseOperator``), ``engine.authoring.decorators`` (``@dag``),
``engine.authoring.operators`` (``PythonOperator``, ``EmptyOperator``, ``@task``),
``engine.authoring.groups`` (``TaskGroup``, ``@task_group``, ``chain``),
``engine.authoring.params`` (``Param``), ``engine.authoring.arguments`` (``TriggerRule``),
``engine.authoring.timetables`` and ``engine.authoring.sensors``; all are re-exported by
``engine`` (sensors by ``engine.sensors``, Airflow's exceptions by ``engine.exceptions``).

The task context is a dict: the executor sends plain data (``dag_id``, ``task_id``,
``run_id``, ``try_number``, ``run``, ``triggering_asset_events``, ``inlet_events``,
``default_deferrable`` ...) and ``engine.authoring.runtime_context.hydrate_context`` turns it
into what a task sees (``ti``, ``dag_run``, ``params``, ``logical_date``, ``ds``,
``outlet_events`` ...); that module documents every key. ``default_deferrable`` is the
``[operators] default_deferrable`` setting, read by ``resolve_deferrable`` for sensors and
operators built with ``deferrable=None``.
"""

from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from engine.exceptions import AirflowException, AirflowSensorTimeout, DagFileError
from triggers.base import BaseTrigger, classpath_of
from triggers.exceptions import SerializationError
from triggers.serde import dumps, dumps_kwargs

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from triggers.base import StartTriggerArgs

Context: TypeAlias = "dict[str, Any]"

DEFAULT_DEFERRABLE_KEY: Final = "default_deferrable"
TRIGGERING_ASSET_EVENTS_KEY: Final = "triggering_asset_events"
FAIL_METHOD: Final = "__fail__"  # next_method of a task whose trigger failed (engine.db too)
TRIGGER_TIMEOUT_ERROR: Final = "trigger timeout"

_ENGINE_DIR: Final = str(Path(__file__).resolve().parents[1]) + os.sep  # all of engine/


class DagDefinitionError(DagFileError, ValueError):
    """A DAG file declares something invalid; the message names the file, line and object.

    ``lineno`` is the line in the DAG file when the error was found after the import
    (e.g. two DAGs with one id); otherwise the line comes from the traceback.
    """

    def __init__(self, message: str, *, lineno: int | None = None) -> None:
        super().__init__(message)
        self.lineno = lineno


class TaskDeferralError(AirflowException):
    """A deferred task cannot resume: its trigger failed (``next_method == "__fail__"``)."""


class TaskDeferralTimeout(TaskDeferralError):
    """A deferred task waited longer than the ``timeout`` given to ``defer``."""


class SensorTimeout(AirflowSensorTimeout):
    """A sensor in poke mode did not succeed within its ``timeout`` (``AirflowSensorTimeout``)."""


def caller_file_and_line() -> tuple[str, int]:
    """File and line of the innermost frame outside the engine package (the user's code)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_ENGINE_DIR):
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


def caller_location() -> str:
    """``file:line`` of the innermost frame outside the engine package (the user's code)."""
    filename, lineno = caller_file_and_line()
    return f"{filename}:{lineno}"


def run_to_completion(value: object, *, what: str) -> Any:
    """What a user callable returned, run to completion first if it was an ``async def``.

    Calling an ``async def`` only creates a coroutine: nothing of its body runs until it is
    awaited. As Airflow 3 does, a task runs it to completion in an event loop of its own
    (``asyncio.run`` in the task process), so its exceptions fail the try and its result is
    the task's. Every place the engine calls user code that may be ``async def``
    (``execute``, a ``@task`` / ``python_callable``, a ``next_method``, a sensor's ``poke``)
    passes the result through here. ``what`` names the callable in errors.
    """
    if inspect.iscoroutine(value):
        import asyncio  # only for an async def: the task runner need not import it

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(value)
        value.close()
        raise RuntimeError(
            f"{what} is an async def called where an event loop is already running; it "
            "was not run. Tasks run in a task process without a loop: run it there"
        )
    if inspect.isasyncgen(value):
        raise TypeError(
            f"{what} is an async generator (its body contains yield): it has no result "
            "and was not run; return the value instead of yielding it"
        )
    return value


def check_timedelta(owner: str, name: str, value: object) -> timedelta | None:
    """``value`` if it is None or a non-negative ``timedelta``, else a clear error."""
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise DagDefinitionError(
            f"{owner}: {name} must be a datetime.timedelta or None, got {value!r}"
        )
    if value < timedelta(0):
        raise DagDefinitionError(f"{owner}: {name} must not be negative, got {value}")
    return value


def resolve_deferrable(op: object, default: bool) -> bool:
    """Whether ``op`` runs deferrable: its own ``deferrable`` unless None, else ``default``.

    ``default`` is ``[operators] default_deferrable``; the executor passes it in the context
    (``default_deferrable_from(context)``).
    """
    own = getattr(op, "deferrable", None)
    return bool(default) if own is None else bool(own)


def default_deferrable_from(context: Mapping[str, Any]) -> bool:
    """``[operators] default_deferrable`` as the executor put it in the context."""
    value = context.get(DEFAULT_DEFERRABLE_KEY, False)
    if not isinstance(value, bool):
        raise TypeError(f"context[{DEFAULT_DEFERRABLE_KEY!r}] must be a bool, got {value!r}")
    return value


class TaskDeferred(BaseException):
    """Raised by ``BaseOperator.defer``: hand the wait to ``trigger``, resume at ``method_name``.

    A ``BaseException`` (as in Airflow) so that a task's ``except Exception`` does not
    swallow it. The trigger is serialized here, at defer time, so an unserializable kwarg
    fails in the task with a message naming the trigger class and the kwarg. The executor
    stores ``classpath`` + ``trigger_kwargs`` as the trigger row, ``method_name`` as
    ``next_method`` and ``kwargs`` as ``next_kwargs``; the task later resumes on a fresh
    operator as ``getattr(task, method_name)(context, event=payload, **kwargs)``.
    """

    def __init__(
        self,
        *,
        trigger: BaseTrigger,
        method_name: str,
        kwargs: Mapping[str, Any] | None = None,
        timeout: timedelta | None = None,
    ) -> None:
        if not isinstance(trigger, BaseTrigger):
            raise TypeError(
                f"defer() needs a BaseTrigger instance as trigger, got {trigger!r}; "
                "pass an instance, e.g. TimeDeltaTrigger(timedelta(minutes=5))"
            )
        classpath, trigger_kwargs = trigger.serialize()
        self._init(classpath, dict(trigger_kwargs), method_name, kwargs, timeout)
        self.trigger: BaseTrigger | None = trigger

    @classmethod
    def from_start_trigger_args(cls, args: StartTriggerArgs) -> TaskDeferred:
        """The deferral of a ``start_from_trigger`` task: no trigger instance, only its args."""
        return cls.from_parts(
            args.trigger_cls, args.trigger_kwargs, args.next_method, args.next_kwargs, args.timeout
        )

    @classmethod
    def from_parts(
        cls,
        classpath: str,
        trigger_kwargs: Mapping[str, Any],
        method_name: str,
        kwargs: Mapping[str, Any] | None,
        timeout: timedelta | None,
    ) -> TaskDeferred:
        """A deferral from its stored parts (``trigger`` is None); also used by pickling."""
        deferred = cls.__new__(cls)
        deferred._init(classpath, dict(trigger_kwargs), method_name, kwargs, timeout)
        deferred.trigger = None
        return deferred

    def __reduce__(self) -> tuple[Any, ...]:
        parts = (self.classpath, self.trigger_kwargs, self.method_name, self.kwargs, self.timeout)
        return (TaskDeferred.from_parts, parts)

    def _init(
        self,
        classpath: str,
        trigger_kwargs: dict[str, Any],
        method_name: str,
        kwargs: Mapping[str, Any] | None,
        timeout: timedelta | None,
    ) -> None:
        if not isinstance(method_name, str) or not method_name.isidentifier():
            raise TypeError(f"defer() method_name must be a method name, got {method_name!r}")
        dumps_kwargs(trigger_kwargs, owner=classpath)  # fails naming the class and the kwarg
        next_kwargs = dict(kwargs or {})
        dumps(next_kwargs, where=f"the kwargs given to defer() for {method_name}()")
        if "event" in next_kwargs:
            raise SerializationError(
                "defer() kwargs must not contain 'event': the resumed method receives the "
                "trigger's event under that name"
            )
        BaseException.__init__(self, classpath, method_name)
        self.classpath = classpath
        self.trigger_kwargs = trigger_kwargs
        self.method_name = method_name
        self.kwargs = next_kwargs
        self.timeout = check_timedelta("defer()", "timeout", timeout)

    def __repr__(self) -> str:
        # Trigger kwargs can hold secrets: names only.
        return (
            f"<TaskDeferred trigger={self.classpath} kwargs={sorted(self.trigger_kwargs)} "
            f"method={self.method_name} timeout={self.timeout}>"
        )

    @property
    def trigger_class(self) -> str:
        """The classpath of the trigger the task deferred to: its own class, which may be
        a subclass of what it serializes as (``TimeDeltaTrigger`` is stored as a
        ``DateTimeTrigger``)."""
        return self.classpath if self.trigger is None else classpath_of(self.trigger)

    def __str__(self) -> str:
        trigger = describe_trigger(self.trigger_class, self.classpath)
        return f"deferred to {trigger}, resuming at {self.method_name}()"


def describe_trigger(trigger_class: str | None, classpath: str) -> str:
    """The trigger a task deferred to, and what it is stored (and run) as when that differs."""
    if trigger_class is None or trigger_class == classpath:
        return classpath
    return f"{trigger_class} (stored as {classpath})"


@dataclass(frozen=True, slots=True)
class Deferral:
    """A ``TaskDeferred`` in transit: ``trigger_kwargs`` and ``kwargs`` are tagged JSON text."""

    classpath: str
    trigger_kwargs: str
    method_name: str
    kwargs: str
    timeout_s: float | None = None
    #: the class of the trigger the task built (``classpath`` is what it serializes as)
    trigger_class: str | None = None

    def __repr__(self) -> str:  # trigger kwargs may hold secrets
        return f"Deferral({self.classpath} -> {self.method_name}(), timeout_s={self.timeout_s})"

    @property
    def described(self) -> str:
        """The trigger for a log line: the class used, and what it is stored as if other."""
        return describe_trigger(self.trigger_class, self.classpath)

    @classmethod
    def from_exception(cls, deferred: TaskDeferred) -> Deferral:
        return cls(
            classpath=deferred.classpath,
            trigger_kwargs=dumps_kwargs(deferred.trigger_kwargs, owner=deferred.classpath),
            method_name=deferred.method_name,
            kwargs=dumps(deferred.kwargs, where="defer() kwargs"),
            timeout_s=None if deferred.timeout is None else deferred.timeout.total_seconds(),
            trigger_class=deferred.trigger_class,
        )


@dataclass(frozen=True, slots=True)
class EventRow:
    """One asset event as read for a task's context (``payload`` as stored: tagged JSON).

    The fields after ``source_watcher`` say where an event came from (a watcher, a task's
    outlet, ``sluice assets emit``); events stored before outlets existed leave them None.
    """

    id: int
    asset_name: str
    payload: Any
    timestamp: datetime
    source_watcher: str | None
    uri: str | None = None
    extra: dict[str, Any] | None = None
    source: str | None = None
    source_dag_id: str | None = None
    source_run_id: str | None = None
    source_task_id: str | None = None
    source_try_number: int | None = None
    source_alias: str | None = None
    created_by: str | None = None
