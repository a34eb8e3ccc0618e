"""``DAG`` and ``BaseOperator``: a named set of tasks with dependencies, and a task.

A DAG is started manually or by assets.
Use it as a context manager: every operator (or ``@task`` call) created inside the block
joins the DAG, and the DAG is registered for the DAG processor even if no variable holds
it::

    with DAG("orders", schedule=orders_asset & customers_asset):
        extract = PythonOperator(task_id="extract", python_callable=run_extract)
        load = PythonOperator(task_id="load", python_callable=run_load)
        extract >> load

``schedule`` takes None (manual runs only), an ``Asset``, a list of assets (all of them
updated) or an asset condition built with ``&`` and ``|``. A run started by assets can read
the asset events that started it from ``context["triggering_asset_events"]``.

A task runs in a worker process that imports the DAG file again, finds the task and calls
``task.execute(context)`` (see ``engine.authoring.context`` for the context keys). A task
that waits calls ``self.defer(trigger=..., method_name=...)``: that raises ``TaskDeferred``,
the worker slot is freed, and once the trigger fires a *fresh* instance resumes at
``task.resume_execution(next_method, next_kwargs, context)``, which calls
``getattr(task, next_method)(context, event=payload, **defer_kwargs)``.

A task whose class sets ``start_from_trigger = True`` and ``start_trigger_args`` goes to the
triggerer without running on a worker first (``deferral_at_start``). A trigger that yields
``TaskSuccessEvent`` / ``TaskFailedEvent`` / ``TaskSkippedEvent`` ends the task on the
triggerer (``end_from_trigger``).

DAG and task refer to each other (a task joins the DAG being defined; a DAG holds its
tasks), so both live here; ``engine.authoring.operators`` builds on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

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
from triggers.base import classpath_of
from triggers.exceptions import SerializationError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import timedelta

    from engine.authoring.context import Context
    from triggers.base import BaseTrigger, StartTriggerArgs

import re
from typing import TYPE_CHECKING, Final

from engine.authoring.assets import as_condition
from engine.authoring.context import caller_file_and_line

if TYPE_CHECKING:
    from types import TracebackType

    from engine.authoring.assets import BaseAsset

ID_MAX_CHARS: Final = 250
_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_.\-]+")

_dag_stack: list[DAG] = []
_registered: list[DAG] = []


def check_id(kind: str, value: object, *, where: str) -> str:
    """A valid DAG or task id (letters, digits, ``_ . -``, at most 250 characters)."""
    if not isinstance(value, str) or not _ID_PATTERN.fullmatch(value):
        raise DagDefinitionError(
            f"{where}: {kind} {value!r} is invalid; use letters, digits, '_', '.' and '-' only"
        )
    if len(value) > ID_MAX_CHARS:
        raise DagDefinitionError(f"{where}: {kind} is longer than {ID_MAX_CHARS} characters")
    return value


def current_dag() -> DAG | None:
    """The DAG of the innermost ``with DAG(...)`` block, if any."""
    return _dag_stack[-1] if _dag_stack else None


def take_registered_dags() -> list[DAG]:
    """The DAGs whose ``with`` block ended since the last call (the DAG processor's hook)."""
    dags = list(_registered)
    _registered.clear()
    return dags


class DAG:
    """A DAG: ``dag_id``, a schedule, and tasks linked by ``>>``."""

    def __init__(
        self,
        dag_id: str,
        *,
        schedule: BaseAsset | list[BaseAsset] | tuple[BaseAsset, ...] | None = None,
        description: str | None = None,
        auto_register: bool = True,
    ) -> None:
        self.fileloc, self.lineno = caller_file_and_line()
        where = f"{self.fileloc}:{self.lineno}"
        self.dag_id = check_id("dag_id", dag_id, where=where)
        self.schedule: BaseAsset | None = as_condition(schedule, where=where)
        if description is not None and not isinstance(description, str):
            raise DagDefinitionError(f"{where}: DAG {dag_id!r} description must be a string")
        self.description = description
        self.auto_register = auto_register
        self.task_dict: dict[str, BaseOperator] = {}

    def __repr__(self) -> str:
        return f"<DAG {self.dag_id!r} tasks={len(self.task_dict)} schedule={self.schedule!r}>"

    def __enter__(self) -> DAG:
        _dag_stack.append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _dag_stack.remove(self)
        if exc_type is None and self.auto_register:
            _registered.append(self)

    @property
    def tasks(self) -> list[BaseOperator]:
        return list(self.task_dict.values())

    @property
    def task_ids(self) -> list[str]:
        return list(self.task_dict)

    def schedule_json(self) -> dict[str, Any] | None:
        """The schedule as stored in ``dag.schedule`` (None for manual runs only)."""
        return None if self.schedule is None else self.schedule.to_json()

    def add_task(self, task: BaseOperator) -> None:
        """Attach ``task``; its id must be new in this DAG."""
        if task.task_id in self.task_dict and self.task_dict[task.task_id] is not task:
            raise DagDefinitionError(
                f"DAG {self.dag_id!r} ({self.fileloc}) already has a task {task.task_id!r}; "
                "task ids must be unique within a DAG"
            )
        self.task_dict[task.task_id] = task

    def has_task(self, task_id: str) -> bool:
        return task_id in self.task_dict

    def get_task(self, task_id: str) -> BaseOperator:
        try:
            return self.task_dict[task_id]
        except KeyError:
            raise DagDefinitionError(
                f"DAG {self.dag_id!r} ({self.fileloc}) has no task {task_id!r}; it has "
                f"{sorted(self.task_dict)}"
            ) from None

    def check_cycles(self) -> None:
        """Raise ``DagDefinitionError`` naming a cycle of tasks, if there is one."""
        state: dict[str, int] = {}  # 1: on the current path, 2: done
        for root in self.task_dict:
            if root in state:
                continue
            path, stack = [root], [iter(self._downstream_of(root))]
            state[root] = 1
            while stack:
                child = next(stack[-1], None)
                if child is None:
                    state[path.pop()] = 2
                    stack.pop()
                elif state.get(child) == 1:
                    cycle = [*path[path.index(child) :], child]
                    raise DagDefinitionError(
                        f"DAG {self.dag_id!r} ({self.fileloc}) has a cycle: {' >> '.join(cycle)}"
                    )
                elif child not in state:
                    state[child] = 1
                    path.append(child)
                    stack.append(iter(self._downstream_of(child)))

    def topological_task_ids(self) -> list[str]:
        """Task ids, every task after all of its upstream tasks (ties in definition order)."""
        self.check_cycles()
        remaining = {tid: len(task.upstream_task_ids) for tid, task in self.task_dict.items()}
        ready = [tid for tid, count in remaining.items() if count == 0]
        order: list[str] = []
        while ready:
            tid = ready.pop(0)
            order.append(tid)
            for child in self._downstream_of(tid):
                remaining[child] -= 1
                if remaining[child] == 0:
                    ready.append(child)
        return order

    def _downstream_of(self, task_id: str) -> list[str]:
        return sorted(self.task_dict[task_id].downstream_task_ids)


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
