"""``DAG`` and ``BaseOperator``: a named set of tasks with dependencies, and a task.

A DAG runs on a time schedule, on assets, or by hand. Use it as a context manager (or the
``@dag`` decorator): every operator (or ``@task`` call) created inside the block joins the
DAG, and the DAG is registered for the DAG processor even if no variable holds it::

    with DAG("orders", schedule="@daily", start_date=datetime(2025, 1, 1)):
        extract = PythonOperator(task_id="extract", python_callable=run_extract)
        load = PythonOperator(task_id="load", python_callable=run_load, outlets=[orders])
        extract >> load

``schedule`` takes None (manual runs only), a cron string or preset (``"@daily"``), a
``timedelta``, a timetable, an ``Asset`` / ``AssetAlias``, a list of assets (all of them
updated) or an asset condition built with ``&`` and ``|``
(``engine.authoring.timetables.resolve_schedule``). A run started by assets can read the
asset events that started it from ``context["triggering_asset_events"]``.

The arguments are Airflow's. Those Sluice does not implement yet are accepted with one
warning per name, or refused when ignoring them would change what runs
(``engine.authoring.arguments``); an unknown name is a ``DagDefinitionError``. A DAG's
``default_args`` fill the arguments an operator accepts and its caller did not pass (a
``TaskGroup``'s ``default_args`` over the DAG's).

A task runs in a worker process that imports the DAG file again, finds the task and calls
``task.execute(context)`` (see ``engine.authoring.runtime_context`` for the context keys).
How a task waits on a trigger and resumes (``defer``, ``resume_execution``) is
``engine.authoring.deferral``. A trigger that yields ``TaskSuccessEvent`` /
``TaskFailedEvent`` / ``TaskSkippedEvent`` ends the task on the triggerer
(``end_from_trigger``).

DAG and task refer to each other (a task joins the DAG being defined; a DAG holds its
tasks), so both live here; ``engine.authoring.groups`` (task groups, ``chain``) and
``engine.authoring.operators`` build on them.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol

from engine.authoring.arguments import (
    DAG_IGNORED,
    DAG_REJECTED_WHEN_SET,
    DAG_REMOVED,
    OPERATOR_IGNORED,
    OPERATOR_REJECTED_WHEN_SET,
    OPERATOR_REMOVED,
    TriggerRule,
    check_default_args,
    check_positive_int,
    check_tags,
    check_timedelta,
    check_trigger_rule,
    check_type,
    split_unsupported,
)
from engine.authoring.assets import Asset, AssetAlias, as_asset_list
from engine.authoring.callbacks import (
    DEFAULT_POOL,
    TASK_CALLBACKS,
    as_callbacks,
    check_pool,
    check_pool_slots,
)
from engine.authoring.deferral import Deferrable
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_file_and_line, caller_location
from engine.authoring.params import Param, as_params
from engine.authoring.timetables import resolve_schedule, timezone_of, to_utc
from triggers.base import classpath_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from datetime import tzinfo
    from types import TracebackType

    from engine.authoring.assets import BaseAsset
    from engine.authoring.callbacks import Callback
    from engine.authoring.context import Context
    from engine.authoring.timetables import Timetable

logger = logging.getLogger(__name__)

ID_MAX_CHARS: Final = 250
DEFAULT_MAX_ACTIVE_RUNS: Final = 16
DEFAULT_MAX_ACTIVE_TASKS: Final = 16
DEFAULT_OWNER: Final = "airflow"
#: Airflow's default ``retry_delay``: a failed try with tries left waits this long.
DEFAULT_RETRY_DELAY: Final = timedelta(seconds=300)
_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_.\-]+")

_dag_stack: list[DAG] = []
_group_stack: list[TaskContainer] = []
_registered: list[DAG] = []
_warned: set[tuple[str, str]] = set()
#: what ``BaseOperator.partial`` returns (``engine.authoring.mapping.OperatorPartial``)
_partial_factory: Callable[[type[BaseOperator], dict[str, Any]], Any] | None = None


#: the task results a value refers to (``engine.authoring.xcom.iter_references``)
_reference_finder: Callable[[Any], Iterable[DependencyMixin]] | None = None


def set_reference_finder(finder: Callable[[Any], Iterable[DependencyMixin]]) -> None:
    """Install how an operator finds the task results its template fields refer to (the
    results module builds on this one)."""
    global _reference_finder
    _reference_finder = finder


def _depend_on_referenced_results(operator: BaseOperator) -> None:
    """A task result given to a template field (``values=other.output``) makes its task
    upstream, as in Airflow: the value is pulled when the field is rendered."""
    if _reference_finder is None:
        return
    for name in getattr(operator, "template_fields", ()):
        for reference in _reference_finder(getattr(operator, name, None)):
            operator.set_upstream(reference)


def set_partial_factory(factory: Callable[[type[BaseOperator], dict[str, Any]], Any]) -> None:
    """Install ``BaseOperator.partial``'s implementation (mapping builds on this module)."""
    global _partial_factory
    _partial_factory = factory


class TaskContainer(Protocol):
    """What a task needs of the ``TaskGroup`` it is created in (``engine.authoring.groups``)."""

    @property
    def dag(self) -> DAG: ...

    @property
    def default_args(self) -> dict[str, Any]: ...

    def child_id(self, label: str) -> str: ...

    def add(self, node: BaseOperator) -> None: ...


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


def current_group() -> TaskContainer | None:
    """The innermost ``with TaskGroup(...)`` block, if any."""
    return _group_stack[-1] if _group_stack else None


def push_group(group: TaskContainer) -> None:
    _group_stack.append(group)


def pop_group(group: TaskContainer) -> None:
    _group_stack.remove(group)


def take_registered_dags() -> list[DAG]:
    """The DAGs whose ``with`` block ended since the last call (the DAG processor's hook)."""
    dags = list(_registered)
    _registered.clear()
    return dags


def warn_once(scope: str, argument: str, message: str, *args: object, **fields: str) -> None:
    """Log ``message`` once per process for each ``(scope, argument)``."""
    if (scope, argument) in _warned:
        return
    _warned.add((scope, argument))
    extra = {"action": "argument_ignored", "argument": argument, **fields}
    logger.warning(message, *args, extra=extra)


def forget_warnings() -> None:
    """Warn again about every argument (for tests)."""
    _warned.clear()


# --- DAG ---------------------------------------------------------------------------------------


def _zone_of(where: str, start: object) -> tzinfo:
    """The DAG's time zone: ``start_date``'s when it is aware, else UTC."""
    if isinstance(start, datetime) and start.utcoffset() is not None:
        return timezone_of(start.tzinfo)
    return timezone_of(None)


class DAG:
    """A DAG: ``dag_id``, a schedule, and tasks linked by ``>>`` (Airflow's arguments)."""

    def __init__(
        self,
        dag_id: str,
        *,
        schedule: object = None,
        start_date: datetime | None = None,
        end_date: datetime | None = None,
        catchup: bool = False,
        tags: Iterable[str] | None = None,
        description: str | None = None,
        doc_md: str | None = None,
        default_args: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        max_active_runs: int = DEFAULT_MAX_ACTIVE_RUNS,
        max_active_tasks: int = DEFAULT_MAX_ACTIVE_TASKS,
        dagrun_timeout: timedelta | None = None,
        dag_display_name: str | None = None,
        is_paused_upon_creation: bool | None = None,
        auto_register: bool = True,
        on_success_callback: Callback | Sequence[Callback] | None = None,
        on_failure_callback: Callback | Sequence[Callback] | None = None,
        **unsupported: Any,
    ) -> None:
        self.fileloc, self.lineno = caller_file_and_line()
        location = f"{self.fileloc}:{self.lineno}"
        self.dag_id = check_id("dag_id", dag_id, where=location)
        where = f"{location}: DAG {dag_id!r}"
        self._warn_unsupported(unsupported, location)
        self.default_args = check_default_args(where, default_args)
        self._set_dates(where, start_date, end_date)
        self.timetable: Timetable | None
        self.schedule: BaseAsset | None
        self.timetable, self.schedule = resolve_schedule(
            schedule, timezone=self.timezone, where=where
        )
        check_type(where, "catchup", catchup, bool)
        self.catchup = catchup
        self.tags = check_tags(where, tags)
        for name, text in (("description", description), ("doc_md", doc_md)):
            if text is not None:
                check_type(where, name, text, str)
        self.description = description
        self.doc_md = doc_md
        shared = as_params(self.default_args.pop("params", None), where=f"{where} default_args")
        self.params = {**shared, **as_params(params, where=where)}
        self.max_active_runs = check_positive_int(where, "max_active_runs", max_active_runs)
        self.max_active_tasks = check_positive_int(where, "max_active_tasks", max_active_tasks)
        self.dagrun_timeout = check_timedelta(where, "dagrun_timeout", dagrun_timeout)
        #: run by an executor when the scheduler ends a run (``engine.authoring.callbacks``)
        self.on_success_callback = as_callbacks(where, "on_success_callback", on_success_callback)
        self.on_failure_callback = as_callbacks(where, "on_failure_callback", on_failure_callback)
        self.dag_display_name = dag_id if dag_display_name is None else dag_display_name
        check_type(where, "dag_display_name", self.dag_display_name, str)
        if is_paused_upon_creation is not None:
            check_type(where, "is_paused_upon_creation", is_paused_upon_creation, bool)
        self.is_paused_upon_creation = is_paused_upon_creation
        self.auto_register = auto_register
        self.task_dict: dict[str, BaseOperator] = {}
        self.task_group_dict: dict[str, TaskContainer] = {}
        self._check_required_params(where)

    def _warn_unsupported(self, unsupported: Mapping[str, Any], location: str) -> None:
        names = split_unsupported(
            unsupported,
            owner=f"DAG {self.dag_id!r}",
            where=location,
            ignored=DAG_IGNORED,
            rejected=DAG_REJECTED_WHEN_SET,
            removed=DAG_REMOVED,
            known=[n for n in inspect.signature(DAG.__init__).parameters if n != "self"],
        )
        for name in names:
            warn_once(
                "DAG",
                name,
                "%s: DAG %r: argument %r is not supported yet and is ignored",
                location,
                self.dag_id,
                name,
                dag_id=self.dag_id,
                location=location,
            )

    def _set_dates(self, where: str, start_date: object, end_date: object) -> None:
        # Airflow takes the dates from default_args too; operators do not get them.
        default_start = self.default_args.pop("start_date", None)
        default_end = self.default_args.pop("end_date", None)
        start = default_start if start_date is None else start_date
        end = default_end if end_date is None else end_date
        self.timezone: tzinfo = _zone_of(where, start)
        self.start_date: datetime | None = None
        self.end_date: datetime | None = None
        if start is not None:
            self.start_date = to_utc(start, timezone=self.timezone, where=where, name="start_date")
        if end is not None:
            self.end_date = to_utc(end, timezone=self.timezone, where=where, name="end_date")
        if self.start_date and self.end_date and self.end_date < self.start_date:
            raise DagDefinitionError(
                f"{where}: end_date {self.end_date} is before start_date {self.start_date}"
            )

    def _check_required_params(self, where: str) -> None:
        if self.timetable is None and self.schedule is None:
            return
        missing = [name for name, param in self.params.items() if not param.has_value]
        if missing:
            raise DagDefinitionError(
                f"{where}: params {missing} have no default, so a scheduled run could not get "
                "a value; give them defaults or use schedule=None"
            )

    def __repr__(self) -> str:
        when = self.timetable.summary if self.timetable is not None else self.schedule
        return f"<DAG {self.dag_id!r} tasks={len(self.task_dict)} schedule={when!r}>"

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

    @property
    def owner(self) -> str:
        """The owners of the tasks, as Airflow shows them (``"airflow"`` without tasks)."""
        owners = dict.fromkeys(task.owner for task in self.task_dict.values())
        return ", ".join(owners) or DEFAULT_OWNER

    def schedule_json(self) -> dict[str, Any] | None:
        """The asset condition as stored in ``dag.schedule`` (None without one)."""
        return None if self.schedule is None else self.schedule.to_json()

    def add_task(self, task: BaseOperator) -> None:
        """Attach ``task``; its id must be new in this DAG (tasks and task groups)."""
        if task.task_id in self.task_dict and self.task_dict[task.task_id] is not task:
            raise DagDefinitionError(
                f"DAG {self.dag_id!r} ({self.fileloc}) already has a task {task.task_id!r}; "
                "task ids must be unique within a DAG"
            )
        if task.task_id in self.task_group_dict:
            raise DagDefinitionError(
                f"DAG {self.dag_id!r} ({self.fileloc}) already has a task group "
                f"{task.task_id!r}; a task cannot have the id of a task group"
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


# --- dependencies ------------------------------------------------------------------------------


class DependencyMixin:
    """Something ``>>`` links: a task, or a task group (through its roots and leaves)."""

    @property
    def roots(self) -> list[BaseOperator]:
        """The tasks an upstream node links to."""
        raise NotImplementedError

    @property
    def leaves(self) -> list[BaseOperator]:
        """The tasks that link to a downstream node."""
        raise NotImplementedError

    def set_downstream(self, other: DependencyMixin | Sequence[DependencyMixin]) -> None:
        targets = [root for node in _nodes(other) for root in node.roots]
        for leaf in self.leaves:
            for root in targets:
                _link(leaf, root)

    def set_upstream(self, other: DependencyMixin | Sequence[DependencyMixin]) -> None:
        sources = [leaf for node in _nodes(other) for leaf in node.leaves]
        for root in self.roots:
            for leaf in sources:
                _link(leaf, root)

    def __rshift__(self, other: Any) -> Any:
        self.set_downstream(other)
        return other

    def __lshift__(self, other: Any) -> Any:
        self.set_upstream(other)
        return other

    def __rrshift__(self, other: Any) -> Any:
        self.set_upstream(other)  # [a, b] >> self
        return self

    def __rlshift__(self, other: Any) -> Any:
        self.set_downstream(other)  # [a, b] << self
        return self


def _nodes(value: object) -> list[DependencyMixin]:
    items: list[object] = list(value) if isinstance(value, list | tuple | set) else [value]
    for item in items:
        if not isinstance(item, DependencyMixin):
            raise DagDefinitionError(
                f"{caller_location()}: dependencies link tasks and task groups, got {item!r}; "
                "use operators, task groups or the result of calling a @task function"
            )
    return items  # type: ignore[return-value]  # checked above


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


# --- default_args ------------------------------------------------------------------------------

# Never filled from default_args: the task's identity and place, and the DAG's own dates.
_NOT_DEFAULTED: Final = frozenset(
    {"self", "task_id", "dag", "task_group", "default_args", "start_date", "end_date"}
)
DEFAULT_ARGS_MARK: Final = "_sluice_default_args_applied"
_KEYWORD_KINDS: Final = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


_accepted: dict[type, frozenset[str]] = {}


def accepted_arguments(cls: type[BaseOperator]) -> frozenset[str]:
    """The argument names ``cls`` accepts (its ``__init__`` chain and Airflow's ignored ones)."""
    if cls not in _accepted:
        _accepted[cls] = _accepted_by(cls)
    return _accepted[cls]


def _accepted_by(cls: type[BaseOperator]) -> frozenset[str]:
    names: set[str] = set(OPERATOR_IGNORED) | OPERATOR_REJECTED_WHEN_SET
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        parameters = inspect.signature(init).parameters.values()
        names.update(p.name for p in parameters if p.kind in _KEYWORD_KINDS)
    return frozenset(names - _NOT_DEFAULTED)


def as_delay(where: str, name: str, value: object) -> timedelta | None:
    """A delay argument as Airflow takes it (``retry_delay``, ``max_retry_delay``): a
    ``timedelta`` or a number of seconds; None stays None."""
    problem = f"{where}: {name} must be a timedelta or a number of seconds, got {value!r}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise DagDefinitionError(f"{where}: {name} must not be negative, got {value!r}")
        try:
            value = timedelta(seconds=value)
        except (OverflowError, ValueError) as exc:  # inf, nan, beyond timedelta's range
            raise DagDefinitionError(problem) from exc
    elif value is not None and not isinstance(value, timedelta):
        raise DagDefinitionError(problem)
    return check_timedelta(where, name, value)


def _group_for(dag: object, group: object) -> TaskContainer | None:
    """The task group a new task joins: ``task_group=``, else the innermost of its DAG."""
    if group is not None:
        if not callable(getattr(group, "child_id", None)):
            raise DagDefinitionError(
                f"{caller_location()}: task_group must be a TaskGroup, got {group!r}"
            )
        return group  # type: ignore[return-value]  # a TaskGroup (checked above)
    inner = current_group()
    return inner if inner is not None and (dag is None or inner.dag is dag) else None


def _with_default_args(cls: type[BaseOperator], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` plus the default_args (DAG, then groups, then the operator's own) it lacks."""
    target = kwargs.get("dag") or current_dag()
    group = _group_for(kwargs.get("dag"), kwargs.get("task_group"))
    defaults: dict[str, Any] = {}
    if isinstance(target, DAG):
        defaults.update(target.default_args)
    elif group is not None:
        defaults.update(group.dag.default_args)
    if group is not None:
        defaults.update(group.default_args)
    own = kwargs.pop("default_args", None)
    defaults.update(check_default_args(caller_location(), own))
    accepted = accepted_arguments(cls)
    filled = {k: v for k, v in defaults.items() if k in accepted and k not in kwargs}
    if isinstance(defaults.get("params"), dict) and isinstance(kwargs.get("params"), dict):
        filled["params"] = {**defaults["params"], **kwargs["params"]}
    return {**kwargs, **filled}


def applies_default_args(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap an operator's ``__init__``: the outermost call fills arguments from default_args."""

    @functools.wraps(init)
    def wrapper(self: BaseOperator, *args: Any, **kwargs: Any) -> None:
        if self.__dict__.get(DEFAULT_ARGS_MARK):
            init(self, *args, **kwargs)
            return
        self.__dict__[DEFAULT_ARGS_MARK] = True
        init(self, *args, **_with_default_args(type(self), kwargs))
        _depend_on_referenced_results(self)

    setattr(wrapper, DEFAULT_ARGS_MARK, True)
    return wrapper


# --- BaseOperator ------------------------------------------------------------------------------


class BaseOperator(DependencyMixin, Deferrable):
    """Base of every task. Subclasses implement ``execute(context)``.

    Arguments are Airflow's: ``retries``, ``execution_timeout``, ``outlets`` / ``inlets``
    (assets and aliases), ``owner``, ``doc_md``, ``task_display_name``, ``params``,
    ``trigger_rule`` (every Airflow rule), ``default_args``; others are ignored with
    a warning or refused (``engine.authoring.arguments``). Each subclass's ``__init__`` is
    wrapped so that the DAG's (and task group's) ``default_args`` fill what its caller left
    out.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, DEFAULT_ARGS_MARK, False):
            cls.__init__ = applies_default_args(init)  # type: ignore[method-assign]

    @applies_default_args
    def __init__(
        self,
        *,
        task_id: str,
        dag: DAG | None = None,
        task_group: TaskContainer | None = None,
        retries: int = 0,
        retry_delay: timedelta | float = DEFAULT_RETRY_DELAY,
        retry_exponential_backoff: bool = False,
        max_retry_delay: timedelta | float | None = None,
        execution_timeout: timedelta | None = None,
        multiple_outputs: bool = False,
        do_xcom_push: bool = True,
        outlets: Asset | AssetAlias | Sequence[Asset | AssetAlias] | None = None,
        inlets: Asset | AssetAlias | Sequence[Asset | AssetAlias] | None = None,
        owner: str = DEFAULT_OWNER,
        doc_md: str | None = None,
        task_display_name: str | None = None,
        trigger_rule: TriggerRule | str = TriggerRule.ALL_SUCCESS,
        params: Mapping[str, Any] | None = None,
        pool: str = DEFAULT_POOL,
        pool_slots: int = 1,
        queue: str | None = None,
        on_execute_callback: Callback | Sequence[Callback] | None = None,
        on_success_callback: Callback | Sequence[Callback] | None = None,
        on_failure_callback: Callback | Sequence[Callback] | None = None,
        on_retry_callback: Callback | Sequence[Callback] | None = None,
        on_skipped_callback: Callback | Sequence[Callback] | None = None,
        default_args: Mapping[str, Any] | None = None,  # applied by the __init__ wrapper
        **unsupported: Any,
    ) -> None:
        location = caller_location()
        label = check_id("task_id", task_id, where=location)
        where = f"{location}: task {task_id!r}"
        self._warn_unsupported(unsupported, location, where)
        if dag is not None and not isinstance(dag, DAG):
            raise DagDefinitionError(f"{where}: dag must be a DAG, got {dag!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise DagDefinitionError(f"{where}: retries must be an int >= 0")
        self.retries = retries
        self.retry_delay = as_delay(where, "retry_delay", retry_delay) or timedelta(0)
        check_type(where, "retry_exponential_backoff", retry_exponential_backoff, bool)
        self.retry_exponential_backoff = retry_exponential_backoff
        self.max_retry_delay = as_delay(where, "max_retry_delay", max_retry_delay)
        self.execution_timeout = check_timedelta(where, "execution_timeout", execution_timeout)
        for name, flag in (("multiple_outputs", multiple_outputs), ("do_xcom_push", do_xcom_push)):
            check_type(where, name, flag, bool)
        #: a dict result is also stored key by key; ``do_xcom_push=False`` stores no result
        self.multiple_outputs = multiple_outputs
        self.do_xcom_push = do_xcom_push
        self.outlets = as_asset_list(where, "outlets", outlets)
        self.inlets = as_asset_list(where, "inlets", inlets)
        check_type(where, "owner", owner, str)
        self.owner = owner
        if doc_md is not None:
            check_type(where, "doc_md", doc_md, str)
        self.doc_md = doc_md
        self._trigger_rule = check_trigger_rule(trigger_rule, where=where)
        self.params: dict[str, Param] = as_params(params, where=where)
        #: the executors start the task only while ``pool`` has ``pool_slots`` open
        self.pool = check_pool(where, pool)
        self.pool_slots = check_pool_slots(where, pool_slots)
        if queue is not None and (not isinstance(queue, str) or not queue.strip()):
            raise DagDefinitionError(f"{where}: queue must be a non-empty string, got {queue!r}")
        #: the Celery queue its tries are sent to (None: ``[celery] default_queue``); the
        #: local executor runs every task alike
        self.queue = queue
        given = (
            on_execute_callback,
            on_success_callback,
            on_failure_callback,
            on_retry_callback,
            on_skipped_callback,
        )
        for name, value in zip(TASK_CALLBACKS, given, strict=True):
            setattr(self, name, as_callbacks(where, name, value))
        self.task_group = _group_for(dag, task_group)
        self.label = label
        full_id = label if self.task_group is None else self.task_group.child_id(label)
        self.task_id = check_id("task_id", full_id, where=location)
        self._display_name = task_display_name
        self.upstream_task_ids: set[str] = set()
        self.downstream_task_ids: set[str] = set()
        self.dag: DAG | None = None
        target = dag or (self.task_group.dag if self.task_group is not None else current_dag())
        if target is not None:
            self._attach(target)
        if self.task_group is not None:
            self.task_group.add(self)

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:
        """The arguments every copy of a mapped task shares; ``.expand(...)`` or
        ``.expand_kwargs(...)`` on the result adds the task (``engine.authoring.mapping``)."""
        if _partial_factory is None:  # engine.authoring.mapping sets it when imported
            raise RuntimeError("import engine.authoring (or engine) before calling partial()")
        return _partial_factory(cls, kwargs)

    def _warn_unsupported(self, unsupported: Mapping[str, Any], location: str, where: str) -> None:
        kind = type(self).__name__
        names = split_unsupported(
            unsupported,
            owner=kind,
            where=where,
            ignored=OPERATOR_IGNORED,
            rejected=OPERATOR_REJECTED_WHEN_SET,
            removed=OPERATOR_REMOVED,
            known=accepted_arguments(type(self)) - OPERATOR_IGNORED,
        )
        for name in names:
            warn_once(
                "operator",
                name,
                "%s: %s argument %r is not supported yet and is ignored",
                where,
                kind,
                name,
                location=location,
            )

    @property
    def trigger_rule(self) -> TriggerRule:
        return self._trigger_rule

    @trigger_rule.setter
    def trigger_rule(self, value: TriggerRule | str) -> None:
        """Set after construction (``op.trigger_rule = ...``): checked like the argument (an
        unknown rule is refused), and the DAG processor stores it like one."""
        self._trigger_rule = check_trigger_rule(
            value, where=f"{caller_location()}: task {self.task_id!r}"
        )

    def __repr__(self) -> str:
        return f"<Task({type(self).__name__}): {self.task_id}>"

    @property
    def task_display_name(self) -> str:
        return self._display_name or self.task_id

    @property
    def operator_classpath(self) -> str:
        return classpath_of(self)

    @property
    def roots(self) -> list[BaseOperator]:
        return [self]

    @property
    def leaves(self) -> list[BaseOperator]:
        return [self]

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
