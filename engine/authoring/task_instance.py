"""``TaskInstance`` (``airflow.sdk.TaskInstance``): the type of ``context["ti"]``, for type
hints and ``isinstance`` in DAG files, as Airflow's is a protocol of what a running task
instance offers.

Sluice's running task instance (``engine.execution.results.RuntimeTaskInstance``) has who
it is (``dag_id``, ``task_id``, ``run_id``, ``try_number``, ``map_index``, ``task``) and
the run's results (``xcom_push``, ``xcom_pull``); the protocol names exactly those, so a
DAG file that annotates ``ti: TaskInstance`` type-checks against what it gets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Iterable

    from engine.authoring.baseoperator import BaseOperator

__all__ = ("TaskInstance",)


@runtime_checkable
class TaskInstance(Protocol):
    """What ``context["ti"]`` offers while a task runs."""

    dag_id: str | None
    task_id: str
    run_id: str | None
    try_number: int
    map_index: int
    task: BaseOperator

    def xcom_push(self, key: str, value: Any) -> None: ...

    def xcom_pull(
        self,
        task_ids: str | Iterable[str] | None = None,
        dag_id: str | None = None,
        key: str = "return_value",
        include_prior_dates: bool = False,
        *,
        map_indexes: int | Iterable[int] | None = None,
        default: Any = None,
        run_id: str | None = None,
    ) -> Any: ...
