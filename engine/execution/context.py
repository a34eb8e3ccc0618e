"""What a running task sees: the context built from the executor's plain data.

The executor sends plain data (tagged JSON); ``hydrate_context(raw, task)`` builds the
context the task gets (``execute(context)``; a ``@task`` function's parameters by name).
Raw keys: ``dag_id``, ``task_id``, ``run_id``, ``try_number``, ``map_index`` (-1),
``default_deferrable``, ``triggering_asset_events`` and ``inlet_events`` (``{asset name:
[event dict, ...]}``, oldest first; a task's spec has no ``triggering_asset_events``: its
process reads them from the executor when the task first looks at them,
``engine.execution.triggering_events``), and ``run``: ``{run_id, run_type, logical_date,
data_interval_start, data_interval_end, run_after, conf, queued_at, start_date,
partition_key}``. An event dict holds ``id``, ``asset`` (the name), ``uri``, ``extra``, ``payload``,
``timestamp``, ``source`` (``watcher`` / ``task`` / ``cli`` / ``api``), ``source_watcher``,
``source_dag_id``, ``source_run_id``, ``source_task_id``, ``source_try_number``,
``source_alias`` (the alias an event was attached through), ``created_by`` and
``partition_key`` (the slice of the asset it updated); missing keys
read as None. ``xcoms``: the results of the run's finished tasks, ``{task_id: {key: tagged
JSON value}}``, decoded when pulled; ``mapped_xcoms``: those of mapped tasks' copies,
``{task_id: {map_index: {key: tagged JSON value}}}``.

The context holds every raw key plus:

- ``ti`` / ``task_instance`` (``dag_id``, ``task_id``, ``run_id``, ``try_number``,
  ``map_index``, ``task``; ``xcom_pull`` reads the run's results, ``xcom_push`` adds one of
  this task's, stored when the try succeeds: ``engine.execution.results``), ``task``,
  ``dag``, ``dag_run`` (``run_id``, ``run_type``, ``logical_date``, ``data_interval_start``
  / ``_end``, ``run_after``, ``conf``, ``queued_at``, ``start_date``, ``dag_id``,
  ``partition_key``);
- ``partition_key``: the run's (None for an unpartitioned run), as ``dag_run.partition_key``;
- ``params``: the DAG's params, the task's over them, the run's ``conf`` over those, each
  checked by its ``Param`` (``ParamValidationError`` fails the task);
- ``logical_date``, ``data_interval_start``, ``data_interval_end``, ``run_after``, and
  ``ds``, ``ds_nodash``, ``ts``, ``ts_nodash``, ``ts_nodash_with_tz`` from the logical date
  in UTC (all None for a run without one, such as an asset-triggered run);
- ``triggering_asset_events`` and ``inlet_events``: ``{asset name: [AssetEvent, ...]}``
  that also take an ``Asset`` or ``AssetAlias`` as key; an ``AssetEvent`` reads by item and
  by attribute (``e["payload"]``, ``e.extra``, ``e.asset.name``, ``e.source_dag_id``);
  ``triggering_asset_events`` is read on first use when the raw data has none
  (``LazyAssetEvents``, a mapping; ``AssetEvents``, a dict, otherwise);
- ``outlet_events``: what the task writes for its outlets (``engine.execution.outlets``),
  with the run's partition key;
- ``inlets`` and ``outlets``: the task's; ``var`` and ``conn``: its variables and
  connections (``engine.execution.accessors``);
- ``task_state_store``: this task instance's state store, kept across its tries, and
  ``asset_state_store``: those of its concrete ``Asset`` inlets and outlets, absent (a
  ``KeyError``) when it has none (``engine.authoring.state_store``).

Datetimes are pendulum ``DateTime`` in UTC when pendulum is installed (as Airflow gives
them), else aware stdlib datetimes (``engine.authoring.context.as_moment``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.assets import Asset
from engine.authoring.context import TRIGGERING_ASSET_EVENTS_KEY, as_moment
from engine.authoring.params import resolve_params
from engine.authoring.state_store import AssetStateStores, TaskStateStore
from engine.execution.accessors import ConnectionAccessor, VariableAccessors
from engine.execution.asset_events import (
    EVENT_KEYS,
    AssetEvent,
    AssetEvents,
    AttributeDict,
    InletEvents,
)
from engine.execution.outlets import OutletEventAccessors
from engine.execution.results import RuntimeTaskInstance
from engine.execution.triggering_events import LazyAssetEvents, events_reader

__all__ = (
    "EVENT_KEYS",
    "AssetEvent",
    "AssetEvents",
    "AttributeDict",
    "DagRun",
    "InletEvents",
    "date_strings",
    "hydrate_context",
)

if TYPE_CHECKING:
    from engine.authoring.baseoperator import BaseOperator

_DATE_KEYS: Final = ("ds", "ds_nodash", "ts", "ts_nodash", "ts_nodash_with_tz")


def date_strings(logical_date: datetime | None) -> dict[str, str | None]:
    """``ds``, ``ds_nodash``, ``ts``, ``ts_nodash`` and ``ts_nodash_with_tz`` (UTC)."""
    if logical_date is None:
        return dict.fromkeys(_DATE_KEYS)
    utc = logical_date.astimezone(UTC)
    ds, ts = utc.strftime("%Y-%m-%d"), utc.isoformat()
    return {
        "ds": ds,
        "ds_nodash": ds.replace("-", ""),
        "ts": ts,
        "ts_nodash": utc.strftime("%Y%m%dT%H%M%S"),
        "ts_nodash_with_tz": ts.replace("-", "").replace(":", ""),
    }


@dataclass(frozen=True, slots=True)
class DagRun:
    """The run a task belongs to (``context["dag_run"]``)."""

    dag_id: str | None
    run_id: str | None
    run_type: str | None = None
    logical_date: datetime | None = None
    data_interval_start: datetime | None = None
    data_interval_end: datetime | None = None
    run_after: datetime | None = None
    conf: dict[str, Any] = field(default_factory=dict)
    queued_at: datetime | None = None
    start_date: datetime | None = None
    partition_key: str | None = None


def _dag_run(raw: Mapping[str, Any], task: BaseOperator) -> DagRun:
    run = raw.get("run") or {}
    if not isinstance(run, Mapping):
        raise TypeError(f"context['run'] must be a mapping, got {run!r}")
    conf = run.get("conf") or {}
    if not isinstance(conf, Mapping):
        raise TypeError(f"the run's conf must be a mapping, got {conf!r}")
    return DagRun(
        dag_id=raw.get("dag_id") or (task.dag.dag_id if task.dag is not None else None),
        run_id=run.get("run_id", raw.get("run_id")),
        run_type=run.get("run_type"),
        logical_date=as_moment(run.get("logical_date")),
        data_interval_start=as_moment(run.get("data_interval_start")),
        data_interval_end=as_moment(run.get("data_interval_end")),
        run_after=as_moment(run.get("run_after")),
        conf=dict(conf),
        queued_at=as_moment(run.get("queued_at")),
        start_date=as_moment(run.get("start_date")),
        partition_key=run.get("partition_key"),
    )


def _results(raw: object) -> dict[str, Mapping[str, Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(v, Mapping) for v in raw.values()):
        raise TypeError(f"context['xcoms'] must map task ids to {{key: value}}, got {raw!r}")
    return dict(raw)


def _mapped_results(raw: object) -> dict[str, dict[int, Mapping[str, Any]]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise TypeError(f"context['mapped_xcoms'] must be a mapping, got {raw!r}")
    return {
        str(task_id): {int(index): values for index, values in copies.items()}
        for task_id, copies in raw.items()
    }


def _triggering_events(raw: Mapping[str, Any]) -> AssetEvents | LazyAssetEvents:
    """The events the raw context carries, else those the executor serves when the task
    first reads them (``engine.execution.triggering_events``), else none."""
    if TRIGGERING_ASSET_EVENTS_KEY in raw:
        return AssetEvents.from_raw(raw[TRIGGERING_ASSET_EVENTS_KEY])
    reader = events_reader()
    return AssetEvents() if reader is None else LazyAssetEvents(reader)


def hydrate_context(raw: Mapping[str, Any], task: BaseOperator) -> dict[str, Any]:
    """The context ``task`` sees, from the plain data the executor sent (keys above).

    Raises ``ParamValidationError`` when a param's value (default or from the run's conf)
    fails its ``Param``: the task fails with it.
    """
    dag_run = _dag_run(raw, task)
    ti = RuntimeTaskInstance(
        dag_id=dag_run.dag_id,
        task_id=task.task_id,
        run_id=dag_run.run_id,
        try_number=int(raw.get("try_number", 1)),
        map_index=int(raw.get("map_index", -1)),
        task=task,
        results=_results(raw.get("xcoms")),
        mapped_results=_mapped_results(raw.get("mapped_xcoms")),
    )
    dag_params = task.dag.params if task.dag is not None else {}
    context = dict(raw)
    context.update(
        ti=ti,
        task_instance=ti,
        task=task,
        dag=task.dag,
        dag_run=dag_run,
        run_id=dag_run.run_id,
        map_index=ti.map_index,
        params=resolve_params(dag_params, task.params, dag_run.conf),
        logical_date=dag_run.logical_date,
        data_interval_start=dag_run.data_interval_start,
        data_interval_end=dag_run.data_interval_end,
        run_after=dag_run.run_after,
        partition_key=dag_run.partition_key,
        **date_strings(dag_run.logical_date),
        triggering_asset_events=_triggering_events(raw),
        inlet_events=InletEvents(AssetEvents.from_raw(raw.get("inlet_events")), task),
        outlet_events=OutletEventAccessors(task, partition_key=dag_run.partition_key),
        inlets=list(task.inlets),
        outlets=list(task.outlets),
        var=VariableAccessors(),
        conn=ConnectionAccessor(),
        task_state_store=TaskStateStore(
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            task_id=task.task_id,
            map_index=ti.map_index,
        ),
    )
    concrete = [item.name for item in (*task.inlets, *task.outlets) if isinstance(item, Asset)]
    if concrete:  # Airflow's: no concrete inlet or outlet, no context["asset_state_store"]
        context["asset_state_store"] = AssetStateStores(concrete, task_id=task.task_id)
    if context["ds_nodash"] is not None:  # Airflow's, for runs with a logical date
        key = f"{dag_run.dag_id}__{task.task_id}__{context['ds_nodash']}"
        context["task_instance_key_str"] = key
    return context
