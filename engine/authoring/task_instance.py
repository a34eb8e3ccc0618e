"""``TaskInstance``: the type of ``context["ti"]``, for annotations (Airflow's
``airflow.sdk.TaskInstance``).

::

    @task
    def report(ti: TaskInstance) -> None:
        rows = ti.xcom_pull(task_ids="extract")
        ti.xcom_push(key="count", value=len(rows))

A ``Protocol``: the try the task process runs (``engine.execution``'s ``RuntimeTaskInstance``)
satisfies it, and ``isinstance(context["ti"], TaskInstance)`` holds. It names what a DAG file
may use: who the try is and its results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence


@runtime_checkable
class TaskInstance(Protocol):
    """The running try: ``dag_id``, ``task_id``, ``run_id``, ``try_number``, ``map_index``,
    ``task``, and its results (``xcom_push`` / ``xcom_pull``)."""

    dag_id: str | None
    task_id: str
    run_id: str | None
    try_number: int
    map_index: int
    task: Any

    def xcom_push(self, key: str, value: Any) -> None: ...

    def xcom_pull(
        self,
        task_ids: str | Iterable[str] | None = None,
        dag_id: str | None = None,
        key: str = ...,
        include_prior_dates: bool = False,
        *,
        map_indexes: int | Iterable[int] | None = None,
        default: Any = None,
        run_id: str | None = None,
    ) -> Any: ...

    def render_template(
        self, value: Any, context: Mapping[str, Any], *, template_ext: Sequence[str] = ()
    ) -> Any: ...
