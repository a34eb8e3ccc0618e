"""How a task hands a wait to a trigger and resumes: ``TaskDeferred``, its stored form
``Deferral``, and ``Deferrable``, a base of ``BaseOperator``.

A task that waits calls ``self.defer(trigger=..., method_name=...)``: that raises
``TaskDeferred``, the worker slot is freed, and once the trigger fires a *fresh* instance
resumes at ``task.resume_execution(next_method, next_kwargs, context)``, which calls
``getattr(task, next_method)(context, event=payload, **defer_kwargs)``. A task whose class
sets ``start_from_trigger = True`` and ``start_trigger_args`` goes to the triggerer without
running on a worker first (``deferral_at_start``). The task process reports a
``TaskDeferred`` as a ``Deferral`` (tagged JSON), which the executor stores as the trigger
row and the task instance's ``next_method`` / ``next_kwargs``; a trigger that failed resumes
the task at ``__fail__`` (``FAIL_METHOD``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NoReturn

from engine.authoring.arguments import check_timedelta
from engine.authoring.context import run_to_completion
from engine.authoring.errors import DagDefinitionError, TaskDeferralError, TaskDeferralTimeout
from triggers.base import BaseTrigger, classpath_of
from triggers.exceptions import SerializationError
from triggers.serde import dumps, dumps_kwargs

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import timedelta

    from engine.authoring.context import Context
    from triggers.base import StartTriggerArgs

FAIL_METHOD: Final = "__fail__"  # next_method of a task whose trigger failed (engine.db too)
TRIGGER_TIMEOUT_ERROR: Final = "trigger timeout"
#: why a task its trigger ended ``failed`` (``end_from_trigger``) fails on a worker: to get
#: its retries (``engine.db.queries.deferrals.end_deferred_tasks``)
TRIGGER_FAILED_ERROR: Final = "it ended the task as failed (TaskFailedEvent, end_from_trigger)"


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


class Deferrable:
    """``defer``, ``resume_execution`` and ``deferral_at_start`` of a task."""

    task_id: str
    start_from_trigger: bool = False
    start_trigger_args: StartTriggerArgs | None = None

    def defer(
        self,
        trigger: BaseTrigger,
        method_name: str,
        kwargs: Mapping[str, Any] | None = None,
        timeout: timedelta | None = None,
    ) -> NoReturn:
        """Hand the wait to ``trigger``; resume at ``method_name(context, event=..., **kwargs)``.

        Raises ``TaskDeferred``. The trigger's kwargs and ``kwargs`` are serialized now, so
        an unserializable value fails here, naming the trigger class and the kwarg.
        """
        if not callable(getattr(self, method_name, None)):
            raise TypeError(
                f"task {self.task_id!r}: defer(method_name={method_name!r}) does not name a "
                f"method of {type(self).__name__}"
            )
        try:
            deferred = TaskDeferred(
                trigger=trigger, method_name=method_name, kwargs=kwargs, timeout=timeout
            )
        except SerializationError as exc:
            raise SerializationError(f"task {self.task_id!r} cannot defer: {exc}") from exc
        raise deferred

    def resume_execution(
        self, next_method: str, next_kwargs: Mapping[str, Any] | None, context: Context
    ) -> Any:
        """Resume after a deferral: call ``next_method``, or fail for ``__fail__``."""
        kwargs = dict(next_kwargs or {})
        if next_method == FAIL_METHOD:
            error = kwargs.get("error") or "unknown error"
            if error == TRIGGER_TIMEOUT_ERROR:
                raise TaskDeferralTimeout(f"task {self.task_id!r}: the deferral timed out")
            detail = f"\n{kwargs['traceback']}" if kwargs.get("traceback") else ""
            raise TaskDeferralError(f"task {self.task_id!r}: its trigger failed: {error}{detail}")
        method = getattr(self, next_method, None)
        if not callable(method):
            raise TaskDeferralError(
                f"task {self.task_id!r} cannot resume: {type(self).__name__} has no method "
                f"{next_method!r}"
            )
        return run_to_completion(
            method(context, **kwargs), what=f"task {self.task_id!r}: {next_method}()"
        )

    def deferral_at_start(self) -> TaskDeferred | None:
        """For ``start_from_trigger`` tasks, the deferral to store instead of running."""
        if not self.start_from_trigger:
            return None
        if self.start_trigger_args is None:
            raise DagDefinitionError(
                f"task {self.task_id!r} sets start_from_trigger but no start_trigger_args; "
                "set start_trigger_args = StartTriggerArgs(trigger_cls=..., ...)"
            )
        return TaskDeferred.from_start_trigger_args(self.start_trigger_args)
