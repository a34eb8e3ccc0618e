"""``TriggerDagRunOperator`` (Airflow's standard provider): a task that starts a run of
another DAG, and optionally waits for it to end.

::

    TriggerDagRunOperator(
        task_id="load",
        trigger_dag_id="load_orders",
        conf={"day": "{{ ds }}"},
        wait_for_completion=True,
        deferrable=True,
    )

Theory of operation. The task process has no database access, so it asks the executor that
supervises it to create the run, over its request channel (``trigger_dag_run``; the channel
is the process's store, ``engine.authoring.store``, and serves ``DagRunTriggering``). The
executor creates a manual run of ``trigger_dag_id`` with ``conf``, at ``logical_date``
(default: now; None: a run without a logical date) and with ``trigger_run_id`` as its run
id (default: a manual run id), its data interval from the DAG's timetable, as ``sluice dags
trigger`` does. When the DAG already has that run: ``skip_when_already_exists`` skips the
task, else ``reset_dag_run`` clears the run (its tasks run again), else the task fails with
``DagRunAlreadyExists``. The run id is pushed as the XCom ``trigger_run_id`` (the DAG id
as ``trigger_dag_id``).

With ``wait_for_completion`` the task then waits for the run to reach one of
``allowed_states`` (success) or one of ``failed_states`` (fails): polling the run's state
over the channel every ``poke_interval`` seconds, or, deferrable, in the triggerer
(``ExternalTaskTrigger`` on the run's logical date), freeing the worker slot.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from engine.authoring.baseoperator import BaseOperator
from engine.authoring.context import as_moment, default_deferrable_from, resolve_deferrable
from engine.authoring.errors import DagDefinitionError
from engine.authoring.external_task_trigger import ExternalTaskTrigger
from engine.authoring.locations import caller_location
from engine.authoring.params import NOTSET, ArgNotSet
from engine.authoring.store import current_store
from engine.exceptions import AirflowException, AirflowSkipException
from engine.states import DagRunState

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.authoring.context import Context

__all__ = (
    "XCOM_DAG_ID",
    "XCOM_RUN_ID",
    "DagIsPaused",
    "DagRunAlreadyExists",
    "DagRunTriggering",
    "TriggerDagRunOperator",
)

logger = logging.getLogger(__name__)

#: the XCom keys the triggered run's id and DAG id are pushed under (Airflow's)
XCOM_RUN_ID: Final = "trigger_run_id"
XCOM_DAG_ID: Final = "trigger_dag_id"
#: what the executor answers a ``trigger_dag_run`` request with (``outcome``)
CREATED: Final = "created"
RESET: Final = "reset"
SKIPPED: Final = "skipped"
EXISTS: Final = "exists"
PAUSED: Final = "paused"


class DagRunAlreadyExists(AirflowException):
    """The DAG to trigger already has a run with that run id or logical date."""


class DagIsPaused(AirflowException):
    """The DAG to trigger is paused (with ``fail_when_dag_is_paused=True``)."""

    def __init__(self, dag_id: str) -> None:
        super().__init__(f"Dag {dag_id} is paused")
        self.dag_id = dag_id


@runtime_checkable
class DagRunTriggering(Protocol):
    """What the task process's store (its request channel) does for this operator."""

    def trigger_dag_run(
        self,
        *,
        dag_id: str,
        run_id: str | None,
        conf: Any,
        logical_date: str | None,
        reset_dag_run: bool,
        skip_when_already_exists: bool,
        fail_when_dag_is_paused: bool,
    ) -> dict[str, Any]:
        """``{"outcome": created|reset|skipped|exists|paused, "run_id", "logical_date"}``."""

    def dag_run_state(self, *, dag_id: str, run_id: str) -> str:
        """The state of the run ``run_id`` of ``dag_id``."""


def _states(where: str, name: str, value: Iterable[str] | None, default: list[str]) -> list[str]:
    if value is None:
        return default
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise DagDefinitionError(f"{where}: {name} must be a list of DAG run states")
    states = [str(state) for state in value]
    unknown = sorted(set(states) - {state.value for state in DagRunState})
    if unknown:
        raise DagDefinitionError(
            f"{where}: {name} {unknown!r} are not DAG run states; valid ones are "
            f"{sorted(state.value for state in DagRunState)}"
        )
    return states


def _triggering(task_id: str) -> DagRunTriggering:
    store = current_store(f"TriggerDagRunOperator {task_id!r}")
    if not isinstance(store, DagRunTriggering):
        raise AirflowException(
            f"task {task_id!r}: this process cannot trigger DAG runs (it runs outside a task "
            "process supervised by an executor)"
        )
    return store


class TriggerDagRunOperator(BaseOperator):
    """Triggers a run of ``trigger_dag_id`` (see the module docstring).

    ``trigger_dag_id``, ``trigger_run_id``, ``logical_date`` (a datetime or an ISO string;
    by default now; None: the run has no logical date) and ``conf`` (JSON data) are
    templated. ``poke_interval`` is in seconds; ``allowed_states`` defaults to
    ``["success"]``, ``failed_states`` to ``["failed"]``.
    ``wait_for_completion`` and ``skip_when_already_exists`` are templated too (a template
    renders to ``True`` or ``False``). ``fail_when_dag_is_paused`` fails the task with
    ``DagIsPaused`` when the DAG to trigger is paused (by default its run is created and
    waits). ``deferrable=None`` follows ``[operators] default_deferrable``.
    """

    template_fields: Sequence[str] = (
        "trigger_dag_id",
        "trigger_run_id",
        "logical_date",
        "conf",
        "wait_for_completion",
        "skip_when_already_exists",
    )

    def __init__(
        self,
        *,
        trigger_dag_id: str,
        trigger_run_id: str | None = None,
        conf: Mapping[str, Any] | None = None,
        logical_date: str | datetime | ArgNotSet | None = NOTSET,
        reset_dag_run: bool = False,
        wait_for_completion: bool | str = False,
        poke_interval: float = 60,
        allowed_states: Iterable[str] | None = None,
        failed_states: Iterable[str] | None = None,
        skip_when_already_exists: bool | str = False,
        fail_when_dag_is_paused: bool = False,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        where = f"{caller_location()}: task {kwargs.get('task_id')!r}"
        if not isinstance(trigger_dag_id, str) or not trigger_dag_id:
            raise DagDefinitionError(f"{where}: trigger_dag_id must be a DAG id")
        if trigger_run_id is not None and not isinstance(trigger_run_id, str):
            raise DagDefinitionError(f"{where}: trigger_run_id must be a string or None")
        if not isinstance(logical_date, str | datetime | None | ArgNotSet):
            raise DagDefinitionError(
                f"{where}: logical_date must be a datetime, an ISO string or None, got "
                f"{logical_date!r}"
            )
        for name, flag in (
            ("reset_dag_run", reset_dag_run),
            ("fail_when_dag_is_paused", fail_when_dag_is_paused),
        ):
            if not isinstance(flag, bool):
                raise DagDefinitionError(f"{where}: {name} must be True or False")
        for name, value in (  # templated: a bool, or a template that renders to one
            ("wait_for_completion", wait_for_completion),
            ("skip_when_already_exists", skip_when_already_exists),
        ):
            if not isinstance(value, bool | str):
                raise DagDefinitionError(f"{where}: {name} must be True, False or a template")
        if deferrable is not None and not isinstance(deferrable, bool):
            raise DagDefinitionError(f"{where}: deferrable must be True, False or None")
        if isinstance(poke_interval, bool) or not isinstance(poke_interval, int | float):
            raise DagDefinitionError(f"{where}: poke_interval must be a number of seconds")
        if poke_interval <= 0:
            raise DagDefinitionError(f"{where}: poke_interval must be > 0")
        success, failure = [DagRunState.SUCCESS.value], [DagRunState.FAILED.value]
        # as Airflow: an empty allowed_states means the default, an empty failed_states none
        allowed = _states(where, "allowed_states", allowed_states or None, success)
        failed = _states(where, "failed_states", failed_states, failure)
        super().__init__(**kwargs)
        self.trigger_dag_id = trigger_dag_id
        self.trigger_run_id = trigger_run_id
        self.conf = conf
        self.logical_date = logical_date
        self.reset_dag_run = reset_dag_run
        self.wait_for_completion = wait_for_completion
        self.poke_interval = float(poke_interval)
        self.allowed_states = allowed
        self.failed_states = failed
        self.skip_when_already_exists = skip_when_already_exists
        self.fail_when_dag_is_paused = fail_when_dag_is_paused
        self.deferrable = deferrable

    # --- running ------------------------------------------------------------------------------

    def _conf(self) -> Any:
        if self.conf is not None and not isinstance(self.conf, Mapping):
            raise AirflowException(f"task {self.task_id!r}: conf must be a dict, got {self.conf!r}")
        try:
            json.dumps(self.conf)
        except (TypeError, ValueError) as exc:
            raise AirflowException(
                f"task {self.task_id!r}: conf must be JSON serializable: {exc}"
            ) from exc
        return None if self.conf is None else dict(self.conf)

    def _logical_date(self) -> str | None:
        """The run's logical date, ISO: now unless given (as Airflow, read in the task);
        None (given as None) asks for a run without one."""
        if isinstance(self.logical_date, ArgNotSet):
            return datetime.now(UTC).isoformat()
        if self.logical_date is None:
            return None
        try:
            moment = as_moment(self.logical_date)
        except (TypeError, ValueError) as exc:
            raise AirflowException(
                f"task {self.task_id!r}: logical_date {self.logical_date!r} is not a datetime "
                f"or an ISO date: {exc}"
            ) from exc
        return None if moment is None else moment.isoformat()

    def _flag(self, name: str) -> bool:
        """A templated flag: a bool, or what a template rendered (``True`` / ``False``)."""
        value = getattr(self, name)
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text not in ("true", "false"):
            raise AirflowException(
                f"task {self.task_id!r}: {name} rendered to {value!r}, not True or False"
            )
        return text == "true"

    def execute(self, context: Context) -> None:
        port = _triggering(self.task_id)
        context["ti"].xcom_push(key=XCOM_DAG_ID, value=self.trigger_dag_id)
        answer = port.trigger_dag_run(
            dag_id=self.trigger_dag_id,
            run_id=self.trigger_run_id or None,
            conf=self._conf(),
            logical_date=self._logical_date(),
            reset_dag_run=self.reset_dag_run,
            skip_when_already_exists=self._flag("skip_when_already_exists"),
            fail_when_dag_is_paused=self.fail_when_dag_is_paused,
        )
        outcome, run_id = answer.get("outcome"), str(answer.get("run_id"))
        if outcome == PAUSED:
            raise DagIsPaused(self.trigger_dag_id)
        if outcome == SKIPPED:
            raise AirflowSkipException(
                f"DAG {self.trigger_dag_id!r} already has run {run_id!r}; skipping the task "
                "(skip_when_already_exists)"
            )
        if outcome == EXISTS:
            raise DagRunAlreadyExists(
                f"DAG {self.trigger_dag_id!r} already has run {run_id!r} (logical date "
                f"{answer.get('logical_date')}); pass reset_dag_run=True to run it again or "
                "skip_when_already_exists=True to skip"
            )
        logger.info(
            "%s DAG %r run %r",
            "Cleared" if outcome == RESET else "Triggered",
            self.trigger_dag_id,
            run_id,
            extra={"action": "trigger_dag_run", "dag_id": self.trigger_dag_id, "run_id": run_id},
        )
        context["ti"].xcom_push(key=XCOM_RUN_ID, value=run_id)
        if not self._flag("wait_for_completion"):
            return
        logical_date = answer.get("logical_date")
        # the triggerer watches runs by logical date: a run without one is polled from here
        if logical_date and resolve_deferrable(self, default_deferrable_from(context)):
            self.defer(
                trigger=ExternalTaskTrigger(
                    external_dag_id=self.trigger_dag_id,
                    logical_dates=[datetime.fromisoformat(str(logical_date))],
                    allowed_states=self.allowed_states,
                    failed_states=self.failed_states,
                    poke_interval=self.poke_interval,
                ),
                method_name="execute_complete",
                kwargs={"run_id": run_id},
            )
        self._wait(port, run_id)

    def _wait(self, port: DagRunTriggering, run_id: str) -> None:
        while True:
            state = port.dag_run_state(dag_id=self.trigger_dag_id, run_id=run_id)
            if state in self.failed_states:
                raise AirflowException(
                    f"DAG {self.trigger_dag_id!r} run {run_id!r} failed with failed state {state!r}"
                )
            if state in self.allowed_states:
                logger.info(
                    "DAG %r run %r finished with allowed state %r",
                    self.trigger_dag_id,
                    run_id,
                    state,
                )
                return
            logger.info(
                "Waiting for DAG %r run %r (state %r); next check in %.3g s",
                self.trigger_dag_id,
                run_id,
                state,
                self.poke_interval,
            )
            time.sleep(self.poke_interval)

    def execute_complete(self, context: Context, event: Any = None, run_id: str = "") -> None:
        """The triggerer saw the run reach an allowed or a failed state."""
        status = event.get("status") if isinstance(event, dict) else None
        message = event.get("message", "") if isinstance(event, dict) else repr(event)
        if status == DagRunState.SUCCESS:
            logger.info("DAG %r run %r: %s", self.trigger_dag_id, run_id, message)
            return
        raise AirflowException(
            f"DAG {self.trigger_dag_id!r} run {run_id!r} failed with failed state: {message}"
        )
