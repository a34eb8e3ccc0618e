"""How a task hands a wait to a trigger and resumes: ``Deferrable``, a base of ``BaseOperator``.

A task that waits calls ``self.defer(trigger=..., method_name=...)``: that raises
``TaskDeferred``, the worker slot is freed, and once the trigger fires a *fresh* instance
resumes at ``task.resume_execution(next_method, next_kwargs, context)``, which calls
``getattr(task, next_method)(context, event=payload, **defer_kwargs)``. A task whose class
sets ``start_from_trigger = True`` and ``start_trigger_args`` goes to the triggerer without
running on a worker first (``deferral_at_start``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from engine.authoring.context import (
    FAIL_METHOD,
    TRIGGER_TIMEOUT_ERROR,
    DagDefinitionError,
    TaskDeferralError,
    TaskDeferralTimeout,
    TaskDeferred,
    run_to_completion,
)
from triggers.exceptions import SerializationError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import timedelta

    from engine.authoring.context import Context
    from triggers.base import BaseTrigger, StartTriggerArgs


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
