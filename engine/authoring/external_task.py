"""``ExternalTaskSensor``: waits for tasks, a task group or a whole run of another DAG.

::

    ExternalTaskSensor(
        task_id="wait_for_export",
        external_dag_id="export",
        external_task_id="publish",            # or external_task_ids=[...] /
        failed_states=["failed"],              #    external_task_group_id="group"
        execution_delta=timedelta(hours=1),    # the run one hour earlier
        timeout=3600,
    )

The run it looks at is the one whose logical date matches this run's (Airflow's rule),
shifted back by ``execution_delta``, or the logical date(s) ``execution_date_fn(logical_date,
**context)`` returns; a run without a logical date uses its ``run_after``.

Unlike Airflow, the wait never holds a worker slot, in either mode: the task process has no
database access, so the sensor always defers to an ``ExternalTaskTrigger``, which reads the
states in the triggerer every ``poke_interval`` seconds (``poll_interval`` when
``deferrable=True``, as Airflow's deferrable sensor). The sensor is done when every watched
task (or the run) is in ``allowed_states`` (default ``["success"]``) at every logical date;
a state in ``failed_states`` fails it with an ``AirflowException`` naming the external DAG,
task and logical date (a skip with ``soft_fail``); one in ``skipped_states`` skips it.
As in Airflow, ``failed_states`` is empty by default: a failed external task is waited on
(it may be retried) until ``timeout``. ``check_existence=True`` fails at once when the DAG
or a task does not exist.
"""

from __future__ import annotations

import inspect
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.context import as_moment, default_deferrable_from, resolve_deferrable
from engine.authoring.errors import DagDefinitionError
from engine.authoring.external_task_trigger import NOT_FOUND, ExternalTaskTrigger
from engine.authoring.locations import caller_location
from engine.authoring.sensor_base import EXECUTE_COMPLETE, BaseSensorOperator
from engine.exceptions import AirflowException, AirflowSkipException
from engine.states import DagRunState, TaskState

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Sequence

    from engine.authoring.context import Context

__all__ = (
    "DuplicateStateError",
    "ExternalDagFailedError",
    "ExternalTaskFailedError",
    "ExternalTaskNotFoundError",
    "ExternalTaskSensor",
)

#: the states ``allowed_states`` & co. may name: Sluice's, and Airflow's that Sluice never
#: sets (accepted, so that a ported sensor keeps its arguments)
TASK_STATES: Final = frozenset({*(s.value for s in TaskState), "removed", "up_for_reschedule"})
DAG_RUN_STATES: Final = frozenset(s.value for s in DagRunState)


class ExternalTaskFailedError(AirflowException):
    """A watched task of another DAG reached one of ``failed_states``."""


class ExternalDagFailedError(ExternalTaskFailedError):
    """The watched run of another DAG reached one of ``failed_states``."""


class ExternalTaskNotFoundError(AirflowException):
    """``check_existence``: the external DAG, task or task group does not exist."""


class DuplicateStateError(DagDefinitionError):
    """A state is in more than one of allowed / skipped / failed states."""


def _states(where: str, name: str, value: Iterable[str] | None, default: list[str]) -> list[str]:
    if value is None:
        return list(default)
    if isinstance(value, str) or not all(isinstance(item, str) for item in value):
        raise DagDefinitionError(f"{where}: {name} must be a list of state names, got {value!r}")
    return [str(item) for item in value]


def _task_ids(
    where: str, task_id: str | None, task_ids: Collection[str] | None
) -> list[str] | None:
    if task_id is not None and task_ids:
        raise DagDefinitionError(f"{where}: pass external_task_id or external_task_ids, not both")
    if task_id is not None:
        return [task_id]
    if not task_ids:
        return None
    if isinstance(task_ids, str):
        raise DagDefinitionError(f"{where}: external_task_ids must be a list of task ids")
    ids = list(task_ids)
    if len(ids) != len(set(ids)):
        raise DagDefinitionError(f"{where}: external_task_ids has duplicates: {ids!r}")
    return ids


class ExternalTaskSensor(BaseSensorOperator):
    """Waits for another DAG's task(s), task group or run at the matching logical date.

    Airflow's arguments: ``external_dag_id``, ``external_task_id`` / ``external_task_ids``
    / ``external_task_group_id`` (at most one; none: the whole run), ``allowed_states``,
    ``skipped_states``, ``failed_states``, ``execution_delta`` / ``execution_date_fn`` (at
    most one), ``check_existence``, ``poll_interval`` and the sensor arguments. The wait
    runs in the triggerer and frees the worker slot (see the module docstring).
    """

    template_fields: Sequence[str] = (
        "external_dag_id",
        "external_task_id",
        "external_task_ids",
        "external_task_group_id",
    )

    def __init__(
        self,
        *,
        external_dag_id: str,
        external_task_id: str | None = None,
        external_task_ids: Collection[str] | None = None,
        external_task_group_id: str | None = None,
        allowed_states: Iterable[str] | None = None,
        skipped_states: Iterable[str] | None = None,
        failed_states: Iterable[str] | None = None,
        execution_delta: timedelta | None = None,
        execution_date_fn: Callable[..., Any] | None = None,
        check_existence: bool = False,
        poll_interval: float = 2.0,
        **kwargs: Any,
    ) -> None:
        where = f"{caller_location()}: sensor {kwargs.get('task_id')!r}"
        if not isinstance(external_dag_id, str) or not external_dag_id:
            raise DagDefinitionError(f"{where}: external_dag_id must be a DAG id")
        ids = _task_ids(where, external_task_id, external_task_ids)
        if external_task_group_id is not None and ids is not None:
            raise DagDefinitionError(
                f"{where}: pass external_task_id(s) or external_task_group_id, not both"
            )
        if execution_delta is not None and execution_date_fn is not None:
            raise DagDefinitionError(
                f"{where}: pass execution_delta or execution_date_fn, not both"
            )
        if execution_delta is not None and not isinstance(execution_delta, timedelta):
            raise DagDefinitionError(f"{where}: execution_delta must be a timedelta")
        if execution_date_fn is not None and not callable(execution_date_fn):
            raise DagDefinitionError(f"{where}: execution_date_fn must be callable")
        super().__init__(**kwargs)
        self.allowed_states = _states(
            where, "allowed_states", allowed_states, [TaskState.SUCCESS.value]
        )
        self.skipped_states = _states(where, "skipped_states", skipped_states, [])
        self.failed_states = _states(where, "failed_states", failed_states, [])
        self._check_states(where, watches_tasks=ids is not None or bool(external_task_group_id))
        self.external_dag_id = external_dag_id
        self.external_task_id = external_task_id
        self.external_task_ids = ids
        self.external_task_group_id = external_task_group_id
        self.execution_delta = execution_delta
        self.execution_date_fn = execution_date_fn
        self.check_existence = bool(check_existence)
        self.poll_interval = float(poll_interval)

    def _check_states(self, where: str, *, watches_tasks: bool) -> None:
        every = [*self.allowed_states, *self.skipped_states, *self.failed_states]
        if len(every) != len(set(every)):
            raise DuplicateStateError(
                f"{where}: a state is in more than one of allowed_states, skipped_states and "
                f"failed_states: {every!r}"
            )
        valid, kind = (TASK_STATES, "task") if watches_tasks else (DAG_RUN_STATES, "DAG run")
        unknown = sorted(set(every) - valid)
        if unknown:
            raise DagDefinitionError(
                f"{where}: {unknown!r} are not {kind} states; valid ones are {sorted(valid)}"
            )

    def poke(self, context: Context) -> bool:
        raise AirflowException(
            f"sensor {self.task_id!r}: ExternalTaskSensor waits in the triggerer, where the "
            "metadata database is; it does not poke in the task process"
        )

    # --- which runs ---------------------------------------------------------------------------

    def _logical_date(self, context: Context) -> datetime:
        run = context.get("dag_run")
        moment = as_moment(context.get("logical_date")) or as_moment(
            getattr(run, "run_after", None) or context.get("run_after")
        )
        if moment is None:
            raise AirflowException(
                f"sensor {self.task_id!r}: the run has neither a logical date nor a run_after "
                "to match the external DAG's runs by"
            )
        return moment

    def logical_dates(self, context: Context) -> list[datetime]:
        """The logical dates of the external runs to look at (aware, UTC)."""
        logical_date = self._logical_date(context)
        if self.execution_delta is not None:
            found: object = logical_date - self.execution_delta
        elif self.execution_date_fn is not None:
            found = self._call_date_fn(logical_date, context)
        else:
            found = logical_date
        dates = found if isinstance(found, list | tuple) else [found]
        result = [as_moment(date) for date in dates if date is not None]
        if not result or any(date is None for date in result):
            raise AirflowException(
                f"sensor {self.task_id!r}: execution_date_fn returned {found!r}; return a "
                "datetime or a list of them"
            )
        return [date for date in result if date is not None]

    def _call_date_fn(self, logical_date: datetime, context: Context) -> object:
        fn = self.execution_date_fn
        assert fn is not None
        extra = {k: v for k, v in context.items() if k != "logical_date"}
        extra["context"] = context
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return fn(logical_date)
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return fn(logical_date, **extra)
        names = {p.name for p in list(params)[1:]}
        return fn(logical_date, **{k: v for k, v in extra.items() if k in names})

    # --- waiting ---------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        self._defer(context)

    def _defer(self, context: Context) -> None:
        deferrable = resolve_deferrable(self, default_deferrable_from(context))
        trigger = ExternalTaskTrigger(
            external_dag_id=self.external_dag_id,
            logical_dates=self.logical_dates(context),
            external_task_ids=self.external_task_ids,
            external_task_group_id=self.external_task_group_id,
            allowed_states=self.allowed_states,
            failed_states=self.failed_states,
            skipped_states=self.skipped_states,
            poke_interval=self.poll_interval if deferrable else self.poke_interval,
            check_existence=self.check_existence,
        )
        self.defer(
            trigger=trigger,
            method_name=EXECUTE_COMPLETE,
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: Any = None) -> None:
        """The trigger decided: done, or fail / skip naming what the external side did."""
        status = event.get("status") if isinstance(event, dict) else None
        message = event.get("message", "") if isinstance(event, dict) else repr(event)
        if status == TaskState.SUCCESS:
            return
        if status == TaskState.SKIPPED:
            raise AirflowSkipException(f"sensor {self.task_id!r}: {message}")
        if status in (TaskState.FAILED, NOT_FOUND) and self.soft_fail:
            raise AirflowSkipException(f"sensor {self.task_id!r}: {message} (soft_fail)")
        if status == TaskState.FAILED:
            error: type[AirflowException] = (
                ExternalTaskFailedError
                if self.external_task_ids or self.external_task_group_id
                else ExternalDagFailedError
            )
            raise error(f"sensor {self.task_id!r}: {message}")
        if status == NOT_FOUND:
            raise ExternalTaskNotFoundError(f"sensor {self.task_id!r}: {message}")
        raise AirflowException(f"sensor {self.task_id!r}: unexpected trigger event {event!r}")
