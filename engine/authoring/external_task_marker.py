"""``ExternalTaskMarker`` (Airflow's standard provider): marks that a task of another DAG
depends on this one, so that clearing the marker clears that task too.

::

    parent_task >> ExternalTaskMarker(
        task_id="parent_marker",
        external_dag_id="child_dag",
        external_task_id="child_task1",  # an ExternalTaskSensor waiting on parent_task
    )

``sluice tasks clear parent_dag -t parent_task --downstream`` (or any clear that selects the
marker: the REST API, the UI, ``reset_dag_run``) then also clears ``child_task1`` of the
child DAG's run at the marker's ``logical_date`` and the tasks downstream of it there, and
follows the markers among those, at most ``recursion_depth`` markers deep (counted from the
first marker; deeper is an error naming the marker: a cycle, or too many tasks).

``external_dag_id``, ``external_task_id`` and ``logical_date`` are templates (Airflow's
default for the date: ``{{ logical_date.isoformat() }}``, the run's own logical date). In
Sluice templates are rendered only where a task runs, so the marker records its rendered
target when it runs, under its XCom key ``external_task_marker`` (``MARKER_XCOM_KEY``); the
clear follows markers that have run (a marker that never ran marks nothing yet).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.context import as_moment
from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from engine.authoring.operators import EmptyOperator
from engine.exceptions import AirflowException

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.authoring.context import Context

__all__ = ("MARKER_CLASSPATH", "MARKER_XCOM_KEY", "ExternalTaskMarker")

#: the XCom key under which a marker records the task instance it marks
MARKER_XCOM_KEY: Final = "external_task_marker"
#: how ``dag_task.operator`` names a marker
MARKER_CLASSPATH: Final = "engine.authoring.external_task_marker.ExternalTaskMarker"
DEFAULT_LOGICAL_DATE: Final = "{{ logical_date.isoformat() }}"


class ExternalTaskMarker(EmptyOperator):
    """Clearing this task clears ``external_task_id`` of ``external_dag_id`` at
    ``logical_date`` and its downstream tasks (module docstring); ``recursion_depth``
    (default 10) bounds how many markers deep a clear follows."""

    template_fields: Sequence[str] = ("external_dag_id", "external_task_id", "logical_date")

    def __init__(
        self,
        *,
        external_dag_id: str,
        external_task_id: str,
        logical_date: str | datetime | None = DEFAULT_LOGICAL_DATE,
        recursion_depth: int = 10,
        **kwargs: Any,
    ) -> None:
        where = f"{caller_location()}: task {kwargs.get('task_id')!r}"
        for name, value in (
            ("external_dag_id", external_dag_id),
            ("external_task_id", external_task_id),
        ):
            if not isinstance(value, str) or not value:
                raise DagDefinitionError(f"{where}: {name} must be a non-empty string")
        if isinstance(logical_date, datetime):
            logical_date = logical_date.isoformat()
        elif not isinstance(logical_date, str):
            raise DagDefinitionError(
                f"{where}: logical_date must be a str or a datetime, got "
                f"{type(logical_date).__name__} {logical_date!r}"
            )
        if isinstance(recursion_depth, bool) or not isinstance(recursion_depth, int):
            raise DagDefinitionError(f"{where}: recursion_depth must be an int")
        if recursion_depth <= 0:
            raise DagDefinitionError(f"{where}: recursion_depth should be a positive integer")
        super().__init__(**kwargs)
        self.external_dag_id = external_dag_id
        self.external_task_id = external_task_id
        self.logical_date = logical_date
        self.recursion_depth = recursion_depth

    def execute(self, context: Context) -> None:
        """Record the rendered target, for a later clear."""
        try:
            moment = as_moment(str(self.logical_date))
        except (TypeError, ValueError) as exc:
            raise AirflowException(
                f"task {self.task_id!r}: logical_date rendered to {self.logical_date!r}, not an "
                f"ISO date: {exc}"
            ) from exc
        assert moment is not None
        context["ti"].xcom_push(
            key=MARKER_XCOM_KEY,
            value={
                "external_dag_id": self.external_dag_id,
                "external_task_id": self.external_task_id,
                "logical_date": moment.isoformat(),
                "recursion_depth": self.recursion_depth,
            },
        )
