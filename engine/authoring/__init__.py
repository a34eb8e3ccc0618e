"""The authoring API: what a DAG file declares (DAGs, tasks, operators, sensors, assets).

Owns the in-memory model of a DAG and the task context; it holds no state beyond the DAG
being defined and touches no database, process or clock. May import: the leaf utilities
(``engine.exceptions``) and ``triggers``. Imported by every other part of the engine.
"""

from __future__ import annotations

from engine.authoring.assets import Asset, AssetAll, AssetAny, AssetWatcher, BaseAsset
from engine.authoring.context import Context, DagDefinitionError, TaskDeferred
from engine.authoring.dag import DAG, BaseOperator, resolve_deferrable
from engine.authoring.operators import PythonOperator, task
from engine.authoring.sensors import BaseSensorOperator

__all__: tuple[str, ...] = (
    "DAG",
    "Asset",
    "AssetAll",
    "AssetAny",
    "AssetWatcher",
    "BaseAsset",
    "BaseOperator",
    "BaseSensorOperator",
    "Context",
    "DagDefinitionError",
    "PythonOperator",
    "TaskDeferred",
    "resolve_deferrable",
    "task",
)
