"""Operators on top of ``BaseOperator``: ``PythonOperator``, ``EmptyOperator``, and ``@task``.

``execute``, a ``python_callable`` / ``@task`` function and a ``next_method`` may be ``async
def``: as in Airflow 3 they are run to completion in an event loop of the task process
(``engine.authoring.context.run_to_completion``); what they raise fails the try.

Name injection (Airflow's): a parameter of the callable that ``op_args`` / ``op_kwargs`` do
not bind and whose name is a context key (``ti``, ``dag_run``, ``params``, ``ds``,
``logical_date``, ``outlet_events`` ...) receives that value; a callable with ``**kwargs``
receives the whole context (minus the names already bound). A callable that returns a
generator is iterated: each ``Metadata`` it yields sets an outlet's extra (or attaches an
event through an alias), and the generator's return value is the task's result. A returned
``Metadata`` is applied the same way and the result is None.

Results between tasks (TaskFlow): a task passed in ``op_args`` / ``op_kwargs`` (or to a
``@task`` call: ``load(extract())``), ``extract()["key"]`` and ``op.output`` are references
(``engine.authoring.xcom.XComArg``): the referenced task becomes upstream, and the value
is passed when the task runs. ``op_args`` / ``op_kwargs`` may also be one result as a
whole (``op_args=extract.output``, ``op_kwargs=XComArg(settings)``): resolved when the task
runs, where it must be a list (or tuple) / a dict with str keys, as in Airflow.
``multiple_outputs=True`` (inferred for a ``@task`` whose
return annotation is a dict type) also stores each key of a dict result as a result of its
own; ``do_xcom_push=False`` stores no return value.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import typing
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, overload

from engine.authoring.assets import Metadata
from engine.authoring.baseoperator import BaseOperator, MappedOperator
from engine.authoring.context import outlet_events, run_to_completion
from engine.authoring.dag import DAG, TaskContainer, current_dag, current_group
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.partial import TaskFlowPartial
from engine.authoring.xcom import (
    XComArg,
    as_references,
    iter_references,
    resolve_references,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Sequence

    from engine.authoring.context import Context

logger = logging.getLogger(__name__)

_POSITIONAL: Final = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
)
_BY_NAME: Final = (
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
)


def _context_kwargs(
    fn: Callable[..., Any], n_args: int, op_kwargs: Mapping[str, Any], context: Context
) -> dict[str, Any]:
    """``op_kwargs`` plus the context entries the callable asks for by parameter name."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return dict(op_kwargs)
    bound = {p.name for p in params[:n_args] if p.kind in _POSITIONAL} | set(op_kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        wanted = {name: value for name, value in context.items() if name not in bound}
    else:
        names = [p.name for p in params if p.kind in _BY_NAME and p.name not in bound]
        wanted = {name: context[name] for name in names if name in context}
    return {**wanted, **op_kwargs}


def _whole_or(value: Any, kind: type[Any], *, where: str, name: str) -> Any:
    """``op_args`` / ``op_kwargs`` as stored: one task result (``XComArg``, or a task for its
    return value) kept whole, else ``kind(value)`` with the tasks in it as references."""
    reference = as_references(value)
    if isinstance(reference, XComArg):
        return reference
    if isinstance(value, str) or (value is not None and not isinstance(value, Iterable)):
        wanted = "a list" if kind is tuple else "a dict"
        raise DagDefinitionError(f"{where}: {name} must be {wanted} or a task's result")
    return as_references(kind(value or ()))


def _checked_args(task_id: str, value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return list(value)
    raise TypeError(
        f"task {task_id!r}: op_args must be a list or tuple when the task runs, got "
        f"{type(value).__name__} ({value!r:.80})"
    )


def _checked_kwargs(task_id: str, value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        return dict(value)
    raise TypeError(
        f"task {task_id!r}: op_kwargs must be a dict with str keys when the task runs, got "
        f"{type(value).__name__} ({value!r:.80})"
    )


class PythonOperator(BaseOperator):
    """Calls ``python_callable(*op_args, **op_kwargs)``; parameters named like context keys
    (``ti``, ``params``, ``logical_date``, ``outlet_events`` ...) receive them, ``**kwargs``
    gets them all. Yielded or returned ``Metadata`` sets outlet extras. Tasks and their
    results in ``op_args`` / ``op_kwargs`` become upstream and are passed as values.
    ``templates_dict``, ``op_args`` and ``op_kwargs`` are templates (rendered before the call;
    ``templates_exts`` lists the extensions of template files); the rendered
    ``templates_dict`` is the context key ``templates_dict``."""

    template_fields: Sequence[str] = ("templates_dict", "op_args", "op_kwargs")
    template_ext: Sequence[str] = ()

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Sequence[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        templates_dict: Mapping[str, Any] | None = None,
        templates_exts: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        where = caller_location()
        if not callable(python_callable):
            raise DagDefinitionError(
                f"{where}: python_callable must be callable, got {python_callable!r}"
            )
        super().__init__(**kwargs)
        self.python_callable = python_callable
        #: a tuple, or one task result (``XComArg``) resolved when the task runs
        self.op_args: Any = _whole_or(op_args, tuple, where=where, name="op_args")
        #: a dict, or one task result (``XComArg``) resolved when the task runs
        self.op_kwargs: Any = _whole_or(op_kwargs, dict, where=where, name="op_kwargs")
        for reference in iter_references((self.op_args, self.op_kwargs)):
            self.set_upstream(reference)
        self.templates_dict: dict[str, Any] | None = (
            None if templates_dict is None else dict(templates_dict)
        )
        if templates_exts is not None:
            self.template_ext = tuple(templates_exts)

    def execute(self, context: Context) -> Any:
        context["templates_dict"] = self.templates_dict
        args = _checked_args(self.task_id, resolve_references(self.op_args, context))
        kwargs = _checked_kwargs(self.task_id, resolve_references(self.op_kwargs, context))
        kwargs = _context_kwargs(self.python_callable, len(args), kwargs, context)
        name = getattr(self.python_callable, "__qualname__", repr(self.python_callable))
        value = run_to_completion(
            self.python_callable(*args, **kwargs), what=f"task {self.task_id!r}: {name}"
        )
        if inspect.isgenerator(value):
            return self._drain(value, context)
        if isinstance(value, Metadata):
            outlet_events(context).apply(value)
            return None
        return value

    def _drain(self, generator: Generator[Any, Any, Any], context: Context) -> Any:
        while True:
            try:
                item = next(generator)
            except StopIteration as stop:
                return stop.value
            if isinstance(item, Metadata):
                outlet_events(context).apply(item)
            else:
                logger.warning(
                    "task %r yielded %s, not a Metadata: ignored",
                    self.task_id,
                    type(item).__name__,
                    extra={"action": "yield_ignored", "task_id": self.task_id},
                )


class EmptyOperator(BaseOperator):
    """Does nothing: a join point or a placeholder in the graph."""

    def execute(self, context: Context) -> None:
        return None


class TaskFactory:
    """What ``@task`` returns: calling it inside ``with DAG(...)`` adds a ``PythonOperator``
    (``operator_class``: a subclass's, for ``@task.bash`` and the like)."""

    operator_class: type[PythonOperator] = PythonOperator

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
        return type(self)(self.function, **{**self.operator_kwargs, **operator_kwargs})

    def _options(self, verb: str) -> dict[str, Any]:
        """The operator arguments of a new task: unique ``task_id``, ``dag`` and the rest."""
        group = current_group()
        dag = current_dag() or (group.dag if group is not None else None)
        if dag is None:
            raise DagDefinitionError(
                f"{caller_location()}: {verb} @task function "
                f"{self.function.__name__!r} inside a `with DAG(...)` block or a @dag function"
            )
        options = dict(self.operator_kwargs)
        if "multiple_outputs" not in options:
            options["multiple_outputs"] = returns_a_mapping(self.function)
        if options.get("doc_md") is None and self.function.__doc__:
            options["doc_md"] = inspect.cleandoc(self.function.__doc__)
        base = options.pop("task_id", None) or self.function.__name__
        return {"task_id": _unique_task_id(dag, group, base), "dag": dag, **options}

    def __call__(self, *args: Any, **kwargs: Any) -> PythonOperator:
        options = self._options("call")
        return self.operator_class(
            python_callable=self.function, op_args=args, op_kwargs=kwargs, **options
        )

    def partial(self, **fixed: Any) -> TaskFlowPartial[MappedOperator]:
        """The function arguments every copy of a mapped task shares (``.expand`` next)."""
        return TaskFlowPartial(
            function=self.function,
            operator_class=self.operator_class,
            operator_kwargs=self._options("map"),
            fixed=fixed,
            mapped=MappedOperator,
        )

    def expand(self, **mapped: Any) -> MappedOperator:
        """A mapped task: one copy per item (``engine.authoring.mapping``)."""
        return self.partial().expand(**mapped)

    def expand_kwargs(self, kwargs_list: Any) -> MappedOperator:
        """A mapped task: one copy per dict of keyword arguments."""
        return self.partial().expand_kwargs(kwargs_list)


def returns_a_mapping(function: Callable[..., Any]) -> bool:
    """True when ``function``'s return annotation is a dict type (``dict[str, int]``, a
    ``TypedDict``, ``Mapping``): Airflow then infers ``multiple_outputs=True``."""
    try:
        annotation = typing.get_type_hints(function).get("return")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve infers nothing
        return False
    origin = typing.get_origin(annotation) or annotation
    return isinstance(origin, type) and issubclass(origin, Mapping)


def _unique_task_id(dag: DAG, group: TaskContainer | None, base: str) -> str:
    """``base``, or ``base__N`` when the DAG already has that id (inside the group)."""

    def taken(label: str) -> bool:
        return dag.has_task(
            label if group is None or group.dag is not dag else group.child_id(label)
        )

    if not taken(base):
        return base
    suffix = 1
    while taken(f"{base}__{suffix}"):
        suffix += 1
    return f"{base}__{suffix}"


@overload
def task(python_callable: Callable[..., Any], /) -> TaskFactory: ...


@overload
def task(**operator_kwargs: Any) -> Callable[[Callable[..., Any]], TaskFactory]: ...


def task(
    python_callable: Callable[..., Any] | None = None,
    /,
    **operator_kwargs: Any,
) -> TaskFactory | Callable[[Callable[..., Any]], TaskFactory]:
    """Turn a function into a task: ``@task`` or ``@task(task_id=..., retries=...)``.

    Takes every ``BaseOperator`` argument (``outlets=``, ``inlets=``, ``retries=`` ...) and
    ``multiple_outputs`` (default: True when the return annotation is a dict type). Each call
    of the decorated function inside ``with DAG(...)`` adds one task (a second call gets the
    id ``name__1``) and returns it, so ``extract() >> load()`` works; passed to another call,
    ``load(extract())``, it is ``extract``'s result (and ``extract()["key"]`` one of its
    ``multiple_outputs``). The function's docstring becomes the task's ``doc_md``.
    """
    if python_callable is not None:
        return TaskFactory(python_callable, **operator_kwargs)
    return functools.partial(TaskFactory, **operator_kwargs)


#: ``@task.bash``, ``@task.branch``, ``@task.short_circuit`` and ``@task.sensor``: attribute,
#: module, name. Their modules load when one is first used (``engine.authoring``'s ``task``
#: replaces these stand-ins with the functions themselves).
TASK_SUB_DECORATORS: Final = (
    ("bash", "engine.authoring.bash", "bash_task"),
    ("branch", "engine.authoring.branching", "branch_task"),
    ("short_circuit", "engine.authoring.branching", "short_circuit_task"),
    ("sensor", "engine.authoring.standard_sensors", "sensor_task"),
)


def _loaded_on_first_call(module: str, name: str) -> Callable[..., Any]:
    def sub_decorator(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    sub_decorator.__name__ = sub_decorator.__qualname__ = name
    return sub_decorator


for _attr, _module, _name in TASK_SUB_DECORATORS:
    setattr(task, _attr, _loaded_on_first_call(_module, _name))
