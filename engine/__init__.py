"""engine package: the authoring API DAG files import, and the engine behind it.

DAG files use ``from engine import DAG, Asset, AssetWatcher, task, BaseOperator,
BaseSensorOperator, TaskDeferred`` (sensors: ``engine.sensors``).
"""

from __future__ import annotations

from engine.assets import Asset, AssetAll, AssetAny, AssetWatcher, BaseAsset
from engine.authoring import Context, DagDefinitionError, TaskDeferred
from engine.dag import DAG
from engine.operators import BaseOperator, PythonOperator, resolve_deferrable, task
from engine.sensors import BaseSensorOperator

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
