"""The authoring API: what a DAG file imports, and nothing else (Airflow 3's task-sdk
``definitions``).

Owns the in-memory model of a DAG: ``DAG``, ``BaseOperator`` and the operators, sensors,
assets, schedules and timetables, task groups, params, decorators, task results
(``XComArg``), ``Connection`` / ``Variable`` and the exceptions a task raises
(``TaskDeferred``). It holds no state beyond the DAG being defined and touches no database,
process or clock. What only a task process runs (the runner, the context it builds, the
XCom API, templates, the request channel) is ``engine.execution``; where an authoring name
needs it (``get_current_context()``, ``Connection.get``, ``Variable.get``), it goes through
a port defined here that the task process fills when it starts (``engine.authoring.context``,
``engine.authoring.store``), never through an import of ``engine.execution``. May import:
``engine.states``, the leaf utilities (``engine.exceptions``) and ``triggers``. Imported by
every other part of the engine.

Airflow's names, for ports that change only their imports (``airflow.sdk.X`` ->
``engine.X``): ``task``, ``DAG``, ``Asset``, ``AssetAlias``, ``Metadata``, ``chain``,
``TaskGroup``, ``task_group``, ``Param``, ``TriggerRule``, ``XComArg``, the timetables ...
The ``@dag`` decorator is exported by ``engine`` only (``engine.authoring.decorators.dag``):
here the name ``dag`` stays the module ``engine.authoring.dag``, so ``import
engine.authoring.dag`` and dotted patch targets keep meaning the module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

from triggers.lazy import submodule

if TYPE_CHECKING:
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
    from engine.authoring.baseoperator import BaseOperator
    from engine.authoring.bash import BashOperator
    from engine.authoring.branching import (
        BaseBranchOperator,
        BranchPythonOperator,
        LatestOnlyOperator,
        ShortCircuitOperator,
    )
    from engine.authoring.connections import Connection
    from engine.authoring.context import Context, get_current_context, resolve_deferrable
    from engine.authoring.dag import DAG
    from engine.authoring.deferral import TaskDeferred
    from engine.authoring.errors import DagDefinitionError
    from engine.authoring.external_task import ExternalTaskSensor
    from engine.authoring.groups import TaskGroup, chain, cross_downstream, task_group
    from engine.authoring.interval_timetables import (
        CronDataIntervalTimetable,
        DeltaDataIntervalTimetable,
    )
    from engine.authoring.operators import EmptyOperator, PythonOperator, task
    from engine.authoring.params import Param
    from engine.authoring.partition_mappers import (
        AllowedKeyMapper,
        ChainMapper,
        FixedKeyMapper,
        IdentityMapper,
        PartitionKeyError,
        PartitionMapper,
        ProductMapper,
    )
    from engine.authoring.partition_rollups import FanOutMapper, RollupMapper
    from engine.authoring.partition_temporal import (
        StartOfDayMapper,
        StartOfHourMapper,
        StartOfMonthMapper,
        StartOfQuarterMapper,
        StartOfWeekMapper,
        StartOfYearMapper,
    )
    from engine.authoring.partition_timetables import (
        CronPartitionTimetable,
        PartitionedAssetTimetable,
        PartitionedAtRuntime,
    )
    from engine.authoring.partition_windows import (
        DayWindow,
        HourWindow,
        MinimumCount,
        MonthWindow,
        QuarterWindow,
        SegmentWindow,
        WaitForAll,
        WeekWindow,
        YearWindow,
    )
    from engine.authoring.sensor_base import BaseSensorOperator, PokeReturnValue
    from engine.authoring.standard_sensors import (
        BashSensor,
        DayOfWeekSensor,
        PythonSensor,
        TimeSensor,
        WeekDay,
    )
    from engine.authoring.timetables import (
        AssetOrTimeSchedule,
        ContinuousTimetable,
        OnceTimetable,
        Timetable,
    )
    from engine.authoring.trigger_timetables import (
        CronTriggerTimetable,
        DeltaTriggerTimetable,
        MultipleCronTriggerTimetable,
    )
    from engine.authoring.variables import Variable
    from engine.authoring.xcom import XComArg

#: public name -> the module that defines it. The names load on first use (PEP 562): a
#: process that needs one part (the task runner, the DAG file parser) does not import the
#: others (e.g. ``ExternalTaskSensor``'s trigger and anyio). Type checkers read the imports
#: above; the ``__getattr__`` below is hidden from them, so a misspelt name stays an error.
_MODULE_OF: Final[dict[str, str]] = {
    "AllowedKeyMapper": "engine.authoring.partition_mappers",
    "Asset": "engine.authoring.assets",
    "AssetAlias": "engine.authoring.assets",
    "AssetAll": "engine.authoring.assets",
    "AssetAny": "engine.authoring.assets",
    "AssetOrTimeSchedule": "engine.authoring.timetables",
    "AssetWatcher": "engine.authoring.assets",
    "BaseAsset": "engine.authoring.assets",
    "BaseBranchOperator": "engine.authoring.branching",
    "BaseOperator": "engine.authoring.baseoperator",
    "BaseSensorOperator": "engine.authoring.sensor_base",
    "BashOperator": "engine.authoring.bash",
    "BashSensor": "engine.authoring.standard_sensors",
    "BranchPythonOperator": "engine.authoring.branching",
    "ChainMapper": "engine.authoring.partition_mappers",
    "Connection": "engine.authoring.connections",
    "Context": "engine.authoring.context",
    "ContinuousTimetable": "engine.authoring.timetables",
    "CronDataIntervalTimetable": "engine.authoring.interval_timetables",
    "CronPartitionTimetable": "engine.authoring.partition_timetables",
    "CronTriggerTimetable": "engine.authoring.trigger_timetables",
    "DAG": "engine.authoring.dag",
    "DagDefinitionError": "engine.authoring.errors",
    "DayOfWeekSensor": "engine.authoring.standard_sensors",
    "DayWindow": "engine.authoring.partition_windows",
    "DeltaDataIntervalTimetable": "engine.authoring.interval_timetables",
    "DeltaTriggerTimetable": "engine.authoring.trigger_timetables",
    "EmptyOperator": "engine.authoring.operators",
    "ExternalTaskSensor": "engine.authoring.external_task",
    "FanOutMapper": "engine.authoring.partition_rollups",
    "FixedKeyMapper": "engine.authoring.partition_mappers",
    "HourWindow": "engine.authoring.partition_windows",
    "IdentityMapper": "engine.authoring.partition_mappers",
    "LatestOnlyOperator": "engine.authoring.branching",
    "Metadata": "engine.authoring.assets",
    "MinimumCount": "engine.authoring.partition_windows",
    "MonthWindow": "engine.authoring.partition_windows",
    "MultipleCronTriggerTimetable": "engine.authoring.trigger_timetables",
    "OnceTimetable": "engine.authoring.timetables",
    "Param": "engine.authoring.params",
    "PartitionKeyError": "engine.authoring.partition_mappers",
    "PartitionMapper": "engine.authoring.partition_mappers",
    "PartitionedAssetTimetable": "engine.authoring.partition_timetables",
    "PartitionedAtRuntime": "engine.authoring.partition_timetables",
    "PokeReturnValue": "engine.authoring.sensor_base",
    "ProductMapper": "engine.authoring.partition_mappers",
    "PythonOperator": "engine.authoring.operators",
    "PythonSensor": "engine.authoring.standard_sensors",
    "QuarterWindow": "engine.authoring.partition_windows",
    "RollupMapper": "engine.authoring.partition_rollups",
    "SegmentWindow": "engine.authoring.partition_windows",
    "ShortCircuitOperator": "engine.authoring.branching",
    "StartOfDayMapper": "engine.authoring.partition_temporal",
    "StartOfHourMapper": "engine.authoring.partition_temporal",
    "StartOfMonthMapper": "engine.authoring.partition_temporal",
    "StartOfQuarterMapper": "engine.authoring.partition_temporal",
    "StartOfWeekMapper": "engine.authoring.partition_temporal",
    "StartOfYearMapper": "engine.authoring.partition_temporal",
    "TaskDeferred": "engine.authoring.deferral",
    "TaskGroup": "engine.authoring.groups",
    "TimeSensor": "engine.authoring.standard_sensors",
    "Timetable": "engine.authoring.timetables",
    "TriggerRule": "engine.authoring.arguments",
    "Variable": "engine.authoring.variables",
    "WaitForAll": "engine.authoring.partition_windows",
    "WeekDay": "engine.authoring.standard_sensors",
    "WeekWindow": "engine.authoring.partition_windows",
    "XComArg": "engine.authoring.xcom",
    "YearWindow": "engine.authoring.partition_windows",
    "bash_task": "engine.authoring.bash",
    "branch_task": "engine.authoring.branching",
    "chain": "engine.authoring.groups",
    "cross_downstream": "engine.authoring.groups",
    "get_current_context": "engine.authoring.context",
    "resolve_deferrable": "engine.authoring.context",
    "sensor_task": "engine.authoring.standard_sensors",
    "short_circuit_task": "engine.authoring.branching",
    "task": "engine.authoring.operators",
    "task_group": "engine.authoring.groups",
}
#: the modules whose decorators hang off ``task`` (``@task.bash``, ``@task.branch``, ...)
__all__: tuple[str, ...] = (
    "DAG",
    "AllowedKeyMapper",
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
    "ChainMapper",
    "Connection",
    "Context",
    "ContinuousTimetable",
    "CronDataIntervalTimetable",
    "CronPartitionTimetable",
    "CronTriggerTimetable",
    "DagDefinitionError",
    "DayOfWeekSensor",
    "DayWindow",
    "DeltaDataIntervalTimetable",
    "DeltaTriggerTimetable",
    "EmptyOperator",
    "ExternalTaskSensor",
    "FanOutMapper",
    "FixedKeyMapper",
    "HourWindow",
    "IdentityMapper",
    "LatestOnlyOperator",
    "Metadata",
    "MinimumCount",
    "MonthWindow",
    "MultipleCronTriggerTimetable",
    "OnceTimetable",
    "Param",
    "PartitionKeyError",
    "PartitionMapper",
    "PartitionedAssetTimetable",
    "PartitionedAtRuntime",
    "PokeReturnValue",
    "ProductMapper",
    "PythonOperator",
    "PythonSensor",
    "QuarterWindow",
    "RollupMapper",
    "SegmentWindow",
    "ShortCircuitOperator",
    "StartOfDayMapper",
    "StartOfHourMapper",
    "StartOfMonthMapper",
    "StartOfQuarterMapper",
    "StartOfWeekMapper",
    "StartOfYearMapper",
    "TaskDeferred",
    "TaskGroup",
    "TimeSensor",
    "Timetable",
    "TriggerRule",
    "Variable",
    "WaitForAll",
    "WeekDay",
    "WeekWindow",
    "XComArg",
    "YearWindow",
    "chain",
    "cross_downstream",
    "get_current_context",
    "resolve_deferrable",
    "task",
    "task_group",
)


def _task() -> Any:
    """``@task`` with its ``@task.bash``, ``@task.branch``, ``@task.short_circuit`` and
    ``@task.sensor``."""
    from engine.authoring.operators import TASK_SUB_DECORATORS, task

    for attr, module, name in TASK_SUB_DECORATORS:
        setattr(task, attr, getattr(importlib.import_module(module), name))
    return task


if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name == "task":
            value = _task()
        elif name in _MODULE_OF:
            value = getattr(importlib.import_module(_MODULE_OF[name]), name)
        else:  # a submodule not imported yet (``engine.authoring.dag`` is the module)
            return submodule(__name__, name)
        globals()[name] = value  # the next access is a plain attribute
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
