"""Operators: ``BaseOperator`` (tasks, dependencies, deferral), ``PythonOperator``, ``@task``.

A task runs in a worker process that imports the DAG file again, finds the task and calls
``task.execute(context)`` (see ``engine.authoring`` for the context keys). A task that waits
calls ``self.defer(trigger=..., method_name=...)``: that raises ``TaskDeferred``, the worker
slot is freed, and once the trigger fires a *fresh* instance resumes at
``task.resume_execution(next_method, next_kwargs, context)``, which calls
``getattr(task, next_method)(context, event=payload, **defer_kwargs)``.

A task whose class sets ``start_from_trigger = True`` and ``start_trigger_args`` goes to the
triggerer without running on a worker first (``deferral_at_start``). A trigger that yields
``TaskSuccessEvent`` / ``TaskFailedEvent`` / ``TaskSkippedEvent`` ends the task on the
triggerer (``end_from_trigger``).

``execute``, a ``python_callable`` / ``@task`` function and a ``next_method`` may be ``async
def``: as in Airflow 3 they are run to completion in an event loop of the task process
(``engine.authoring.run_to_completion``); what they raise fails the try.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, NoReturn, overload

from engine.authoring.context import (
    DEFAULT_DEFERRABLE_KEY,
    FAIL_METHOD,
    TRIGGER_TIMEOUT_ERROR,
    DagDefinitionError,
    TaskDeferralError,
    TaskDeferralTimeout,
    TaskDeferred,
    caller_location,
    check_timedelta,
    run_to_completion,
)
from engine.authoring.dag import check_id, current_dag
from triggers.base import classpath_of
from triggers.exceptions import SerializationError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from datetime import timedelta

    from engine.authoring.context import Context
    from engine.authoring.dag import DAG
    from triggers.base import BaseTrigger, StartTriggerArgs


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


def _as_list(value: object) -> list[BaseOperator]:
    items: list[object] = list(value) if isinstance(value, list | tuple | set) else [value]
    tasks: list[BaseOperator] = []
    for item in items:
        if not isinstance(item, BaseOperator):
            raise DagDefinitionError(
                f"{caller_location()}: dependencies link tasks, got {item!r}; use operators "
                "or the result of calling a @task function"
            )
        tasks.append(item)
    return tasks


class BaseOperator:
    """Base of every task. Subclasses implement ``execute(context)``."""

    start_from_trigger: bool = False
    start_trigger_args: StartTriggerArgs | None = None

    def __init__(
        self,
        *,
        task_id: str,
        dag: DAG | None = None,
        retries: int = 0,
        execution_timeout: timedelta | None = None,
    ) -> None:
        where = caller_location()
        self.task_id = check_id("task_id", task_id, where=where)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise DagDefinitionError(f"{where}: task {task_id!r} retries must be an int >= 0")
        self.retries = retries
        self.execution_timeout = check_timedelta(
            f"{where}: task {task_id!r}", "execution_timeout", execution_timeout
        )
        self.upstream_task_ids: set[str] = set()
        self.downstream_task_ids: set[str] = set()
        self.dag: DAG | None = None
        target = dag if dag is not None else current_dag()
        if target is not None:
            self._attach(target)

    def __repr__(self) -> str:
        return f"<Task({type(self).__name__}): {self.task_id}>"

    @property
    def operator_classpath(self) -> str:
        return classpath_of(self)

    def _attach(self, dag: DAG) -> None:
        if self.dag is not None and self.dag is not dag:
            raise DagDefinitionError(
                f"task {self.task_id!r} belongs to DAG {self.dag.dag_id!r}, not {dag.dag_id!r}"
            )
        dag.add_task(self)
        self.dag = dag

    # --- running --------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Do the work; the return value is the task's result."""
        raise NotImplementedError(f"{type(self).__name__} must implement execute(context)")

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

    # --- dependencies ---------------------------------------------------------------------

    def set_downstream(self, other: BaseOperator | Sequence[BaseOperator]) -> None:
        for task in _as_list(other):
            _link(self, task)

    def set_upstream(self, other: BaseOperator | Sequence[BaseOperator]) -> None:
        for task in _as_list(other):
            _link(task, self)

    def __rshift__(self, other: Any) -> Any:
        self.set_downstream(other)
        return other

    def __lshift__(self, other: Any) -> Any:
        self.set_upstream(other)
        return other

    def __rrshift__(self, other: Any) -> BaseOperator:
        self.set_upstream(other)  # [a, b] >> self
        return self

    def __rlshift__(self, other: Any) -> BaseOperator:
        self.set_downstream(other)  # [a, b] << self
        return self


def _link(upstream: BaseOperator, downstream: BaseOperator) -> None:
    if upstream is downstream:
        raise DagDefinitionError(f"task {upstream.task_id!r} cannot depend on itself")
    dag = upstream.dag or downstream.dag
    if dag is None:
        raise DagDefinitionError(
            f"cannot link {upstream.task_id!r} >> {downstream.task_id!r}: neither belongs to a "
            "DAG; create them inside `with DAG(...)` or pass dag="
        )
    upstream._attach(dag)
    downstream._attach(dag)
    upstream.downstream_task_ids.add(downstream.task_id)
    downstream.upstream_task_ids.add(upstream.task_id)


def _context_kwargs(
    fn: Callable[..., Any], n_args: int, op_kwargs: Mapping[str, Any], context: Context
) -> dict[str, Any]:
    """``op_kwargs`` plus the context entries the callable asks for by parameter name."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return dict(op_kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return {**context, **op_kwargs}
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    taken = {p.name for p in params[:n_args] if p.kind in positional}
    named = [p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    wanted = {name: context[name] for name in named if name in context and name not in taken}
    return {**wanted, **op_kwargs}


class PythonOperator(BaseOperator):
    """Calls ``python_callable(*op_args, **op_kwargs)``; parameters named like context keys
    (``triggering_asset_events``, ``dag_id`` ...) receive them, ``**kwargs`` gets them all."""

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Sequence[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not callable(python_callable):
            raise DagDefinitionError(
                f"{caller_location()}: python_callable must be callable, got {python_callable!r}"
            )
        super().__init__(**kwargs)
        self.python_callable = python_callable
        self.op_args = tuple(op_args or ())
        self.op_kwargs = dict(op_kwargs or {})

    def execute(self, context: Context) -> Any:
        kwargs = _context_kwargs(self.python_callable, len(self.op_args), self.op_kwargs, context)
        name = getattr(self.python_callable, "__qualname__", repr(self.python_callable))
        return run_to_completion(
            self.python_callable(*self.op_args, **kwargs), what=f"task {self.task_id!r}: {name}"
        )


class TaskFactory:
    """What ``@task`` returns: calling it inside ``with DAG(...)`` adds a ``PythonOperator``."""

    def __init__(self, function: Callable[..., Any], **operator_kwargs: Any) -> None:
        if not callable(function):
            raise DagDefinitionError(f"{caller_location()}: @task decorates functions")
        functools.update_wrapper(self, function)
        self.function = function
        self.operator_kwargs = operator_kwargs

    def __repr__(self) -> str:
        return f"<@task {getattr(self.function, '__qualname__', self.function)!r}>"

    def override(self, **operator_kwargs: Any) -> TaskFactory:
        """A copy with other operator arguments (``task_id``, ``retries`` ...)."""
        return TaskFactory(self.function, **{**self.operator_kwargs, **operator_kwargs})

    def __call__(self, *args: Any, **kwargs: Any) -> PythonOperator:
        dag = current_dag()
        if dag is None:
            raise DagDefinitionError(
                f"{caller_location()}: call @task function "
                f"{self.function.__name__!r} inside a `with DAG(...)` block"
            )
        for value in _values(args, kwargs):
            if isinstance(value, BaseOperator):
                raise DagDefinitionError(
                    f"{caller_location()}: task {value.task_id!r} passed as an argument to "
                    f"{self.function.__name__!r}; passing results between tasks is not "
                    "supported, order tasks with >>"
                )
        options = dict(self.operator_kwargs)
        task_id = _unique_task_id(dag, options.pop("task_id", None) or self.function.__name__)
        return PythonOperator(
            task_id=task_id,
            python_callable=self.function,
            op_args=args,
            op_kwargs=kwargs,
            dag=dag,
            **options,
        )


def _values(args: Iterable[Any], kwargs: Mapping[str, Any]) -> Iterable[Any]:
    yield from args
    yield from kwargs.values()


def _unique_task_id(dag: DAG, base: str) -> str:
    if not dag.has_task(base):
        return base
    suffix = 1
    while dag.has_task(f"{base}__{suffix}"):
        suffix += 1
    return f"{base}__{suffix}"


@overload
def task(python_callable: Callable[..., Any], /) -> TaskFactory: ...


@overload
def task(
    *, task_id: str | None = None, retries: int = 0, execution_timeout: timedelta | None = None
) -> Callable[[Callable[..., Any]], TaskFactory]: ...


def task(
    python_callable: Callable[..., Any] | None = None,
    /,
    **operator_kwargs: Any,
) -> TaskFactory | Callable[[Callable[..., Any]], TaskFactory]:
    """Turn a function into a task: ``@task`` or ``@task(task_id=..., retries=...)``.

    Each call of the decorated function inside ``with DAG(...)`` adds one task (a second
    call gets the id ``name__1``) and returns it, so ``extract() >> load()`` works.
    """
    if python_callable is not None:
        return TaskFactory(python_callable, **operator_kwargs)
    return functools.partial(TaskFactory, **operator_kwargs)
