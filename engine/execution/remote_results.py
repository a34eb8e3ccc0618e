"""``ti.xcom_pull`` beyond the task's own run: another DAG's run (``dag_id=``), another run
(``run_id=``), or the latest earlier run that stored the key (``include_prior_dates=True``),
as in Airflow 3 (``dag_id`` None is the task's DAG, ``run_id`` None its run, even when
``dag_id`` names another DAG).

The task process asks its executor (``pull_results`` on the request channel,
``engine.execution.task_channel``), which reads the metadata database; the channel is set
here when the process opens it (``use_results_reader``). ``map_indexes`` None gives the
unmapped task's value, or a list of every copy's value for a mapped task there; a task or
run that does not exist, or a key the task did not store, gives ``default``.
"""

from __future__ import annotations

from typing import Any, Protocol

from triggers.serde import deserialize_value

__all__ = ("ResultsReader", "pull_remote", "use_results_reader")


class ResultsReader(Protocol):
    def pull_results(self, **fields: Any) -> dict[str, Any] | None:
        """``{"run_id", "mapped", "stored": [{key: tagged JSON}, ...]}`` or None."""


_reader: ResultsReader | None = None


def use_results_reader(reader: ResultsReader | None) -> None:
    """Where this process reads other runs' results (its executor's request channel)."""
    global _reader
    _reader = reader


def pull_remote(
    *,
    asker: str,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int | None,
    key: str,
    include_prior_dates: bool,
    default: Any,
) -> Any:
    """One task's value (or its copies' values) of ``key`` in another run."""
    if _reader is None:
        raise RuntimeError(
            f"task {asker!r}: xcom_pull() from DAG {dag_id!r} run {run_id!r} needs the "
            "engine's task process (the executor answers it); it is not available here"
        )
    found = _reader.pull_results(
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        map_index=map_index,
        include_prior_dates=include_prior_dates,
        key=key,
    )
    if found is None:
        return default
    stored = [item for item in found["stored"] if isinstance(item, dict)]
    if found.get("mapped"):
        return [deserialize_value(item[key]) for item in stored if key in item]
    if not stored or key not in stored[0]:
        return default
    return deserialize_value(stored[0][key])
