"""The authoring API: what a DAG file declares (DAGs, tasks, operators, sensors, assets,
schedules, task groups, params) and what a running task sees (its context, connections and
variables).

Owns the in-memory model of a DAG and the task context; it holds no state beyond the DAG
being defined and touches no database, process or clock. May import: the leaf utilities
(``engine.exceptions``) and ``triggers``. Imported by every other part of the engine.

Airflow's names, for ports that change only their imports (``airflow.sdk.X`` ->
``engine.X``): ``task``, ``DAG``, ``Asset``, ``AssetAlias``, ``Metadata``, ``chain``,
``TaskGroup``, ``task_group``, ``Param``, ``TriggerRule``, ``XComArg``, the timetables ...
The ``@dag`` decorator is exported by ``engine`` only (``engine.authoring.decorators.dag``):
here the name ``dag`` stays the module ``engine.authoring.dag``, so ``import
engine.authoring.dag`` and dotted patch targets keep meaning the module.
"""

from __future__ import annotations

from engine.authoring.arguments import TriggerRule
from engine.authoring.assets import (
    Asset,
    AssetAlias,
    AssetAll,
    AssetAny,
    AssetWatcher,
    BaseAsset,
    Metadata,
)
from engine.authoring.bash import BashOperator, bash_task
from engine.authoring.branching import (
    BaseBranchOperator,
    BranchPythonOperator,
    LatestOnlyOperator,
    ShortCircuitOperator,
    branch_task,
    short_circuit_task,
)
from engine.authoring.connections import Connection
from engine.authoring.context import Context, DagDefinitionError, TaskDeferred, resolve_deferrable
from engine.authoring.dag import DAG, BaseOperator
from engine.authoring.external_task import ExternalTaskSensor
from engine.authoring.groups import TaskGroup, chain, cross_downstream, task_group
from engine.authoring.operators import EmptyOperator, PythonOperator, task
from engine.authoring.params import Param
from engine.authoring.runtime_context import get_current_context
from engine.authoring.sensor_base import BaseSensorOperator, PokeReturnValue
from engine.authoring.standard_sensors import (
    BashSensor,
    DayOfWeekSensor,
    PythonSensor,
    TimeSensor,
    WeekDay,
    sensor_task,
)
from engine.authoring.timetables import (
    AssetOrTimeSchedule,
    ContinuousTimetable,
    CronDataIntervalTimetable,
    CronTriggerTimetable,
    DeltaDataIntervalTimetable,
    DeltaTriggerTimetable,
    MultipleCronTriggerTimetable,
    OnceTimetable,
    Timetable,
)
from engine.authoring.variables import Variable
from engine.authoring.xcom import XComArg

task.bash = bash_task  # type: ignore[attr-defined]  # @task.bash
task.branch = branch_task  # type: ignore[attr-defined]  # @task.branch
task.short_circuit = short_circuit_task  # type: ignore[attr-defined]  # @task.short_circuit
task.sensor = sensor_task  # type: ignore[attr-defined]  # @task.sensor

__all__: tuple[str, ...] = (
    "DAG",
    "Asset",
    "AssetAlias",
    "AssetAll",
    "AssetAny",
    "AssetOrTimeSchedule",
    "AssetWatcher",
    "BaseAsset",
    "BaseBranchOperator",
    "BaseOperator",
    "BaseSensorOperator",
    "BashOperator",
    "BashSensor",
    "BranchPythonOperator",
    "Connection",
    "Context",
    "ContinuousTimetable",
    "CronDataIntervalTimetable",
    "CronTriggerTimetable",
    "DagDefinitionError",
    "DayOfWeekSensor",
    "DeltaDataIntervalTimetable",
    "DeltaTriggerTimetable",
    "EmptyOperator",
    "ExternalTaskSensor",
    "LatestOnlyOperator",
    "Metadata",
    "MultipleCronTriggerTimetable",
    "OnceTimetable",
    "Param",
    "PokeReturnValue",
    "PythonOperator",
    "PythonSensor",
    "ShortCircuitOperator",
    "TaskDeferred",
    "TaskGroup",
    "TimeSensor",
    "Timetable",
    "TriggerRule",
    "Variable",
    "WeekDay",
    "XComArg",
    "chain",
    "cross_downstream",
    "get_current_context",
    "resolve_deferrable",
    "task",
    "task_group",
)
