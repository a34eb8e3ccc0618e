"""``DAG``: a named set of tasks with dependencies, and what is being defined right now.

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
(``engine.authoring.schedules.resolve_schedule``). A run started by assets can read the
asset events that started it from ``context["triggering_asset_events"]``.

The arguments are Airflow's. Those Sluice does not implement yet are accepted with one
warning per name, or refused when ignoring them would change what runs
(``engine.authoring.arguments``); an unknown name is a ``DagDefinitionError``. A DAG's
``default_args`` fill the arguments an operator accepts and its caller did not pass (a
``TaskGroup``'s ``default_args`` over the DAG's: ``engine.authoring.default_args``).

What is being defined: the DAG and the task group of the innermost ``with`` blocks
(``current_dag``, ``current_group``), which a new task joins, and the DAGs whose block
ended (``take_registered_dags``, read by whoever imports a DAG file). A task
(``engine.authoring.baseoperator``) builds on this module; the DAG names its tasks' type
only for type checkers.
"""

from __future__ import annotations

import inspect
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol

from engine.authoring.arguments import (
    DAG_IGNORED,
    DAG_REJECTED_WHEN_SET,
    DAG_REMOVED,
    check_default_args,
    check_id,
    check_positive_int,
    check_tags,
    check_timedelta,
    check_type,
    split_unsupported,
    warn_once,
)
from engine.authoring.callbacks import as_callbacks
from engine.authoring.deadlines import as_deadline_alerts
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_file_line_and_module
from engine.authoring.params import as_params
from engine.authoring.schedules import resolve_schedule
from engine.authoring.timetables import timezone_of, to_utc

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from datetime import tzinfo
    from types import TracebackType

    import jinja2

    from engine.authoring.assets import BaseAsset
    from engine.authoring.baseoperator import BaseOperator
    from engine.authoring.callbacks import Callback
    from engine.authoring.deadlines import DeadlineAlert
    from engine.authoring.timetables import Timetable

DEFAULT_MAX_ACTIVE_RUNS: Final = 16
DEFAULT_MAX_ACTIVE_TASKS: Final = 16
DEFAULT_OWNER: Final = "airflow"

_dag_stack: list[DAG] = []
_group_stack: list[TaskContainer] = []
_registered: list[DAG] = []


class TaskContainer(Protocol):
    """What a task needs of the ``TaskGroup`` it is created in (``engine.authoring.groups``)."""

    @property
    def dag(self) -> DAG: ...

    @property
    def default_args(self) -> dict[str, Any]: ...

    def child_id(self, label: str) -> str: ...

    def add(self, node: BaseOperator) -> None: ...


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


# --- DAG ---------------------------------------------------------------------------------------


def _zone_of(where: str, start: object) -> tzinfo:
    """The DAG's time zone: ``start_date``'s when it is aware, else UTC."""
    if isinstance(start, datetime) and start.utcoffset() is not None:
        return timezone_of(start.tzinfo)
    return timezone_of(None)


def _undefined_class(where: str, value: object) -> type[jinja2.Undefined] | None:
    if value is None:
        return None
    import jinja2

    if not (isinstance(value, type) and issubclass(value, jinja2.Undefined)):
        raise DagDefinitionError(
            f"{where}: template_undefined must be a jinja2.Undefined class (e.g. "
            f"jinja2.StrictUndefined), got {value!r}"
        )
    return value


def _name_map(where: str, name: str, value: object) -> dict[str, Any] | None:
    """``value`` as a dict with str keys (None stays None)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise DagDefinitionError(f"{where}: {name} must be a dict with str keys, got {value!r}")
    return dict(value)


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
        deadline: DeadlineAlert | Sequence[DeadlineAlert] | None = None,
        template_searchpath: str | Iterable[str] | None = None,
        template_undefined: type[jinja2.Undefined] | None = None,
        user_defined_macros: Mapping[str, Any] | None = None,
        user_defined_filters: Mapping[str, Callable[..., Any]] | None = None,
        render_template_as_native_obj: bool = False,
        jinja_environment_kwargs: Mapping[str, Any] | None = None,
        **unsupported: Any,
    ) -> None:
        self.fileloc, self.lineno, self.module_name = caller_file_line_and_module()
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
        #: the scheduler fires their callbacks for runs past their deadline
        #: (``engine.authoring.deadlines``)
        self.deadline = as_deadline_alerts(where, deadline, zone=self.timezone)
        self.dag_display_name = dag_id if dag_display_name is None else dag_display_name
        check_type(where, "dag_display_name", self.dag_display_name, str)
        if is_paused_upon_creation is not None:
            check_type(where, "is_paused_upon_creation", is_paused_upon_creation, bool)
        self.is_paused_upon_creation = is_paused_upon_creation
        self.auto_register = auto_register
        self._set_templating(
            where,
            template_searchpath=template_searchpath,
            template_undefined=template_undefined,
            user_defined_macros=user_defined_macros,
            user_defined_filters=user_defined_filters,
            render_template_as_native_obj=render_template_as_native_obj,
            jinja_environment_kwargs=jinja_environment_kwargs,
        )
        self.task_dict: dict[str, BaseOperator] = {}
        self.task_group_dict: dict[str, TaskContainer] = {}
        #: what an edge carries (``Label``): (upstream, downstream task id) -> {"label": ...}
        self.edge_info: dict[tuple[str, str], dict[str, str]] = {}
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

    def _set_templating(
        self,
        where: str,
        *,
        template_searchpath: object,
        template_undefined: object,
        user_defined_macros: object,
        user_defined_filters: object,
        render_template_as_native_obj: object,
        jinja_environment_kwargs: object,
    ) -> None:
        """How this DAG's templates render (``engine.execution.templates``)."""
        folders = [template_searchpath] if isinstance(template_searchpath, str) else None
        if folders is None and template_searchpath is not None:
            check_type(where, "template_searchpath", template_searchpath, (list, tuple))
            folders = list(template_searchpath)  # type: ignore[call-overload]
        for folder in folders or ():
            check_type(where, "template_searchpath item", folder, str)
        self.template_searchpath: list[str] | None = folders
        #: None: jinja2.StrictUndefined (jinja2 is imported by the task process only)
        self.template_undefined: type[jinja2.Undefined] | None = _undefined_class(
            where, template_undefined
        )
        self.user_defined_macros = _name_map(where, "user_defined_macros", user_defined_macros)
        self.user_defined_filters = _name_map(where, "user_defined_filters", user_defined_filters)
        for name, function in (self.user_defined_filters or {}).items():
            if not callable(function):
                raise DagDefinitionError(
                    f"{where}: user_defined_filters[{name!r}] must be callable, got {function!r}"
                )
        check_type(where, "render_template_as_native_obj", render_template_as_native_obj, bool)
        self.render_template_as_native_obj = bool(render_template_as_native_obj)
        self.jinja_environment_kwargs = _name_map(
            where, "jinja_environment_kwargs", jinja_environment_kwargs
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

    def set_edge_info(
        self, upstream_task_id: str, downstream_task_id: str, info: dict[str, str]
    ) -> None:
        """Attach ``info`` (``{"label": ...}``) to an edge (Airflow's, for ``Label``)."""
        self.edge_info[(upstream_task_id, downstream_task_id)] = dict(info)

    def get_edge_info(self, upstream_task_id: str, downstream_task_id: str) -> dict[str, str]:
        """What the edge carries (``{}`` without a label)."""
        return dict(self.edge_info.get((upstream_task_id, downstream_task_id), {}))

    def edge_labels_of(self, task_id: str) -> dict[str, str]:
        """The labels of ``task_id``'s edges to its downstream tasks: downstream id -> label."""
        return {
            down: info["label"]
            for (up, down), info in sorted(self.edge_info.items())
            if up == task_id and "label" in info
        }

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
