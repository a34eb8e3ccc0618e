"""Branching (Airflow's): ``BranchPythonOperator`` / ``@task.branch``, ``BaseBranchOperator``,
``ShortCircuitOperator`` / ``@task.short_circuit`` and ``LatestOnlyOperator``.

Theory of operation. A branching task decides while it runs which of its downstream tasks
are skipped, and the decision travels with its success. The task computes the ids from the
DAG it was loaded with (``task.downstream_task_ids``, ``task.dag``) and records them in its
context (``skip_tasks``); the task process reports them with the success
(``skipped_task_ids``) and the executor marks the task instances of the run that still wait
(``none``) as ``skipped``, in the transaction that records the success. The trigger rules
decide the rest, as in Airflow: below a skipped task, an ``all_success`` task is skipped,
and a join with ``none_failed_min_one_success`` runs after the branch that was followed.
A try that fails skips nothing.

- A branch (``choose_branch``, or the callable of ``BranchPythonOperator`` / ``@task.branch``)
  returns a task id, a list of ids, or None. The direct downstream tasks it does not follow
  are skipped (None: all of them). A task group id follows the group's root tasks. A direct
  downstream task that is also downstream of a followed one is kept (the empty branch of
  ``branch >> join`` beside ``branch >> a >> join``). An id that is not a direct downstream
  task (or group) fails the try, naming the choices. What the branch returned is its result.
- A short circuit (``ShortCircuitOperator`` / ``@task.short_circuit``) whose callable returns
  a falsy value skips every task downstream of it (``ignore_downstream_trigger_rules=True``,
  the default) or only the direct ones (False: the trigger rules decide the others). The
  value is its result either way.
- ``LatestOnlyOperator`` skips its direct downstream tasks unless its run is the latest
  time-scheduled interval: the current time is in ``[data_interval_end, end of the next
  interval)``. Manual and asset-triggered runs, runs of a DAG without a periodic timetable,
  and the last run before the DAG's ``end_date`` are never skipped (Airflow 3).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, overload

from engine.authoring.arguments import check_type
from engine.authoring.baseoperator import BaseOperator
from engine.authoring.groups import TaskGroup
from engine.authoring.locations import caller_location
from engine.authoring.operators import PythonOperator, TaskFactory
from engine.authoring.timetables import DataInterval, TimeRestriction
from engine.exceptions import AirflowException

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.authoring.context import Context
    from engine.authoring.dag import DAG

logger = logging.getLogger(__name__)

#: Where a running task records the task ids its success skips (engine-private context key).
SKIP_TASKS_KEY: Final = "_sluice_skip_task_ids"
#: The run types ``LatestOnlyOperator`` checks; others (manual, asset_triggered) go on.
TIME_RUN_TYPES: Final = frozenset({"scheduled", "backfill"})


# --- what a try reports -----------------------------------------------------------------------


def skip_tasks(context: Context, task_ids: Iterable[str]) -> None:
    """Record that the tasks ``task_ids`` of this run are skipped when this try succeeds."""
    recorded: list[str] = context.setdefault(SKIP_TASKS_KEY, [])
    recorded.extend(task_id for task_id in task_ids if task_id not in recorded)


def skipped_task_ids(context: Mapping[str, Any]) -> list[str]:
    """The task ids the try recorded with ``skip_tasks``, sorted (reported with its success)."""
    return sorted(set(context.get(SKIP_TASKS_KEY) or ()))


# --- the DAG's structure -----------------------------------------------------------------------


def downstream_task_ids(task: BaseOperator, *, recursive: bool) -> set[str]:
    """The tasks directly downstream of ``task``, or (``recursive``) every task below it."""
    found = set(task.downstream_task_ids)
    dag = task.dag
    if not recursive or dag is None:
        return found
    stack = list(found)
    while stack:
        for child in dag.task_dict[stack.pop()].downstream_task_ids:
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _branch_ids(task: BaseOperator, returned: object) -> list[str]:
    """What a branch returned, as a list of ids (None: no branch is followed)."""
    if returned is None:
        return []
    if isinstance(returned, str):
        return [returned]
    if isinstance(returned, Iterable) and not isinstance(returned, Mapping | bytes):
        items = list(returned)
        if all(isinstance(item, str) for item in items):
            return items
    raise AirflowException(
        f"branch task {task.task_id!r} must return a task id, a list of task ids or None; "
        f"it returned {returned!r}"
    )


def _followed(task: BaseOperator, branch_id: str, direct: set[str]) -> set[str]:
    """The direct downstream tasks ``branch_id`` (a task or task group id) follows."""
    if branch_id in direct:
        return {branch_id}
    dag = task.dag
    group = None if dag is None else dag.task_group_dict.get(branch_id)
    if isinstance(group, TaskGroup):
        roots = {root.task_id for root in group.roots} & direct
        if roots:
            return roots
        problem = f"no root task of task group {branch_id!r} is directly downstream of it"
    elif dag is not None and dag.has_task(branch_id):
        problem = f"task {branch_id!r} is not directly downstream of it"
    else:
        where = "" if dag is None else f" of DAG {dag.dag_id!r}"
        problem = f"{branch_id!r} is not a task or task group{where}"
    raise AirflowException(
        f"branch task {task.task_id!r} returned {branch_id!r}, but {problem}; it can follow "
        f"its direct downstream tasks {sorted(direct)} or task groups whose root tasks are "
        "among them"
    )


def branch_skips(task: BaseOperator, returned: object) -> list[str]:
    """The direct downstream tasks of ``task`` that a branch returning ``returned`` skips.

    ``AirflowException`` for a value that is not a task id, a list of ids or None, and for
    an id that is neither a direct downstream task nor a task group with a root among them.
    """
    direct = set(task.downstream_task_ids)
    followed: set[str] = set()
    for branch_id in _branch_ids(task, returned):
        followed |= _followed(task, branch_id, direct)
    kept = set(followed)
    if task.dag is not None:
        for task_id in followed:
            kept |= downstream_task_ids(task.dag.task_dict[task_id], recursive=True)
    return sorted(direct - kept)


def follow_branch(task: BaseOperator, context: Context, returned: object) -> Any:
    """Skip the direct downstream tasks of ``task`` that ``returned`` does not follow;
    ``returned`` is the task's result (Airflow's ``do_branch``)."""
    skipped = branch_skips(task, returned)
    logger.info(
        "Branch %r follows %s; skipping %s",
        task.task_id,
        sorted(set(task.downstream_task_ids) - set(skipped)),
        skipped,
        extra={"action": "branch", "task_id": task.task_id, "skipped": skipped},
    )
    skip_tasks(context, skipped)
    return returned


# --- operators ---------------------------------------------------------------------------------


class BaseBranchOperator(BaseOperator):
    """A task that picks which direct downstream tasks run: subclasses implement
    ``choose_branch(context)`` returning a task id, a list of ids, or None; the direct
    downstream tasks not chosen are skipped (a task group id chooses its root tasks)."""

    def choose_branch(self, context: Context) -> str | Iterable[str] | None:
        raise NotImplementedError(f"{type(self).__name__} must implement choose_branch(context)")

    def execute(self, context: Context) -> Any:
        return follow_branch(self, context, self.choose_branch(context))


class BranchPythonOperator(BaseBranchOperator, PythonOperator):
    """A ``PythonOperator`` whose callable returns the task id(s) to follow (or None): the
    other direct downstream tasks are skipped."""

    def choose_branch(self, context: Context) -> Any:
        return PythonOperator.execute(self, context)


class ShortCircuitOperator(PythonOperator):
    """A ``PythonOperator`` whose falsy result skips the tasks downstream of it: all of them
    (``ignore_downstream_trigger_rules=True``) or only the direct ones (False: the trigger
    rules of the others decide). A truthy result lets them run. The result is stored."""

    def __init__(self, *, ignore_downstream_trigger_rules: bool = True, **kwargs: Any) -> None:
        where = f"{caller_location()}: task {kwargs.get('task_id')!r}"
        check_type(where, "ignore_downstream_trigger_rules", ignore_downstream_trigger_rules, bool)
        super().__init__(**kwargs)
        self.ignore_downstream_trigger_rules = ignore_downstream_trigger_rules

    def execute(self, context: Context) -> Any:
        condition = super().execute(context)
        if condition:
            logger.info(
                "Condition %r is true: the downstream tasks run",
                condition,
                extra={"action": "short_circuit", "task_id": self.task_id, "skipped": []},
            )
            return condition
        skipped = sorted(downstream_task_ids(self, recursive=self.ignore_downstream_trigger_rules))
        logger.info(
            "Condition %r is false: skipping %s",
            condition,
            skipped,
            extra={"action": "short_circuit", "task_id": self.task_id, "skipped": skipped},
        )
        skip_tasks(context, skipped)
        return condition


def _utcnow() -> datetime:
    return datetime.now(UTC)


def is_latest_run(dag: DAG | None, dag_run: object, *, now: datetime) -> bool:
    """Whether ``dag_run`` (the context's ``dag_run``) is the latest time-scheduled run at
    ``now``: ``now`` in ``[data_interval_end, end of the next interval)``. Runs that are not
    time-scheduled, runs of a DAG without a periodic timetable and a DAG's last run (no next
    interval before its ``end_date``) always are."""
    if getattr(dag_run, "run_type", None) not in TIME_RUN_TYPES:
        return True
    timetable = None if dag is None else dag.timetable
    if dag is None or timetable is None or not timetable.periodic:
        return True
    end = _first(dag_run, "data_interval_end", "logical_date", "run_after")
    if end is None:
        return True
    start = _first(dag_run, "data_interval_start") or end
    following = timetable.next_dagrun_info(
        last_automated_data_interval=DataInterval(start, end),
        restriction=TimeRestriction(earliest=dag.start_date, latest=dag.end_date, catchup=True),
        now=now,
    )
    return following is None or end <= now < following.data_interval.end


def _first(dag_run: object, *names: str) -> datetime | None:
    for name in names:
        value = getattr(dag_run, name, None)
        if isinstance(value, datetime):
            return value
    return None


class LatestOnlyOperator(BaseBranchOperator):
    """Skips its direct downstream tasks unless its run is the latest time-scheduled
    interval (the current time is before the end of the interval after the run's); manual
    and asset-triggered runs always go on."""

    def choose_branch(self, context: Context) -> list[str]:
        downstream = sorted(self.downstream_task_ids)
        dag_run = context.get("dag_run")
        if is_latest_run(self.dag, dag_run, now=_utcnow()):
            logger.info(
                "Run %s is the latest: the downstream tasks run",
                getattr(dag_run, "run_id", None),
                extra={"action": "latest_only", "task_id": self.task_id, "latest": True},
            )
            return downstream
        logger.info(
            "Run %s is not the latest interval: skipping %s",
            getattr(dag_run, "run_id", None),
            downstream,
            extra={"action": "latest_only", "task_id": self.task_id, "latest": False},
        )
        return []


# --- @task.branch and @task.short_circuit ------------------------------------------------------


class BranchTaskFactory(TaskFactory):
    """What ``@task.branch`` returns: each call adds a ``BranchPythonOperator``."""

    operator_class = BranchPythonOperator


class ShortCircuitTaskFactory(TaskFactory):
    """What ``@task.short_circuit`` returns: each call adds a ``ShortCircuitOperator``."""

    operator_class = ShortCircuitOperator


@overload
def branch_task(python_callable: Callable[..., Any], /) -> BranchTaskFactory: ...


@overload
def branch_task(**operator_kwargs: Any) -> Callable[[Callable[..., Any]], BranchTaskFactory]: ...


def branch_task(
    python_callable: Callable[..., Any] | None = None, /, **operator_kwargs: Any
) -> BranchTaskFactory | Callable[[Callable[..., Any]], BranchTaskFactory]:
    """``@task.branch``: the function returns the task id(s) to follow, or None; the other
    direct downstream tasks are skipped. Takes ``@task``'s arguments."""
    if python_callable is not None:
        return BranchTaskFactory(python_callable, **operator_kwargs)
    return functools.partial(BranchTaskFactory, **operator_kwargs)


@overload
def short_circuit_task(python_callable: Callable[..., Any], /) -> ShortCircuitTaskFactory: ...


@overload
def short_circuit_task(
    **operator_kwargs: Any,
) -> Callable[[Callable[..., Any]], ShortCircuitTaskFactory]: ...


def short_circuit_task(
    python_callable: Callable[..., Any] | None = None, /, **operator_kwargs: Any
) -> ShortCircuitTaskFactory | Callable[[Callable[..., Any]], ShortCircuitTaskFactory]:
    """``@task.short_circuit``: a falsy return value skips the downstream tasks (all of them,
    or with ``ignore_downstream_trigger_rules=False`` the direct ones). Takes ``@task``'s
    arguments."""
    if python_callable is not None:
        return ShortCircuitTaskFactory(python_callable, **operator_kwargs)
    return functools.partial(ShortCircuitTaskFactory, **operator_kwargs)
