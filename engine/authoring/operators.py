"""Operators on top of ``BaseOperator``: ``PythonOperator`` and the ``@task`` decorator.

``execute``, a ``python_callable`` / ``@task`` function and a ``next_method`` may be ``async
def``: as in Airflow 3 they are run to completion in an event loop of the task process
(``engine.authoring.context.run_to_completion``); what they raise fails the try.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, overload

from engine.authoring.context import (
    DagDefinitionError,
    caller_location,
    run_to_completion,
)
from engine.authoring.dag import BaseOperator, current_dag

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from datetime import timedelta

    from engine.authoring.context import Context
    from engine.authoring.dag import DAG


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
