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
``TaskGroup``, ``task_group``, ``Param``, ``TriggerRule``, ``XComArg``, the timetables,
``asset``, ``setup`` / ``teardown``, ``Label``, ``chain_linear``, ``literal``, ``conf`` ...
(docs/porting-from-airflow.md lists every ``airflow.sdk`` name and where it is).
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
    from engine.authoring.asset_decorator import asset
    from engine.authoring.assets import (
        Asset,
        AssetAlias,
        AssetAll,
        AssetAny,
        AssetWatcher,
        BaseAsset,
        Metadata,
    )
    from engine.authoring.async_operator import BaseAsyncOperator
    from engine.authoring.baseoperator import BaseOperator
    from engine.authoring.bash import BashOperator, bash_task
    from engine.authoring.branching import (
        BaseBranchOperator,
        BranchPythonOperator,
        LatestOnlyOperator,
        ShortCircuitOperator,
        branch_task,
        short_circuit_task,
    )
    from engine.authoring.configuration import conf
    from engine.authoring.connections import Connection
    from engine.authoring.context import Context, get_current_context, resolve_deferrable
    from engine.authoring.dag import DAG
    from engine.authoring.datetime_branch import BranchDateTimeOperator, BranchDayOfWeekOperator
    from engine.authoring.deadlines import (
        AsyncCallback,
        BaseDeadlineReference,
        DeadlineAlert,
        DeadlineReference,
        SyncCallback,
    )
    from engine.authoring.deferral import TaskDeferred
    from engine.authoring.edges import EdgeModifier, Label, chain_linear
    from engine.authoring.enums import DagRunState, TaskInstanceState, WeightRule
    from engine.authoring.errors import DagDefinitionError
    from engine.authoring.events_timetable import EventsTimetable
    from engine.authoring.external_task import ExternalTaskSensor
    from engine.authoring.external_task_marker import ExternalTaskMarker
    from engine.authoring.groups import TaskGroup, chain, cross_downstream, task_group
    from engine.authoring.interval_timetables import (
        CronDataIntervalTimetable,
        DeltaDataIntervalTimetable,
    )
    from engine.authoring.literals import literal
    from engine.authoring.notifier import BaseNotifier
    from engine.authoring.operatorlink import BaseOperatorLink
    from engine.authoring.operators import EmptyOperator, PythonOperator, task
    from engine.authoring.params import Param
    from engine.authoring.params_dict import ParamsDict
    from engine.authoring.parsing_context import get_parsing_context
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
        PartitionAtRuntime,
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
        Window,
        YearWindow,
    )
    from engine.authoring.resumable import ResumableJobMixin
    from engine.authoring.retry_policies import (
        ExceptionRetryPolicy,
        RetryAction,
        RetryDecision,
        RetryPolicy,
        RetryRule,
    )
    from engine.authoring.sensor_base import BaseSensorOperator, PokeReturnValue
    from engine.authoring.setup_teardown_tasks import setup, teardown
    from engine.authoring.skipmixin import BranchMixIn, SkipMixin
    from engine.authoring.standard_sensors import (
        BashSensor,
        DayOfWeekSensor,
        PythonSensor,
        TimeSensor,
        WeekDay,
        sensor_task,
    )
    from engine.authoring.state_store import NEVER_EXPIRE
    from engine.authoring.task_instance import TaskInstance
    from engine.authoring.timetables import (
        AssetOrTimeSchedule,
        ContinuousTimetable,
        OnceTimetable,
        Timetable,
    )
    from engine.authoring.trigger_dagrun import TriggerDagRunOperator
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
    "AsyncCallback": "engine.authoring.deadlines",
    "BaseAsset": "engine.authoring.assets",
    "BaseAsyncOperator": "engine.authoring.async_operator",
    "BaseBranchOperator": "engine.authoring.branching",
    "BaseDeadlineReference": "engine.authoring.deadlines",
    "BaseNotifier": "engine.authoring.notifier",
    "BaseOperator": "engine.authoring.baseoperator",
    "BaseOperatorLink": "engine.authoring.operatorlink",
    "BaseSensorOperator": "engine.authoring.sensor_base",
    "BashOperator": "engine.authoring.bash",
    "BashSensor": "engine.authoring.standard_sensors",
    "BranchDateTimeOperator": "engine.authoring.datetime_branch",
    "BranchDayOfWeekOperator": "engine.authoring.datetime_branch",
    "BranchMixIn": "engine.authoring.skipmixin",
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
    "DagRunState": "engine.authoring.enums",
    "DayOfWeekSensor": "engine.authoring.standard_sensors",
    "DayWindow": "engine.authoring.partition_windows",
    "DeadlineAlert": "engine.authoring.deadlines",
    "DeadlineReference": "engine.authoring.deadlines",
    "DeltaDataIntervalTimetable": "engine.authoring.interval_timetables",
    "DeltaTriggerTimetable": "engine.authoring.trigger_timetables",
    "EdgeModifier": "engine.authoring.edges",
    "EmptyOperator": "engine.authoring.operators",
    "EventsTimetable": "engine.authoring.events_timetable",
    "ExceptionRetryPolicy": "engine.authoring.retry_policies",
    "ExternalTaskMarker": "engine.authoring.external_task_marker",
    "ExternalTaskSensor": "engine.authoring.external_task",
    "FanOutMapper": "engine.authoring.partition_rollups",
    "FixedKeyMapper": "engine.authoring.partition_mappers",
    "HourWindow": "engine.authoring.partition_windows",
    "IdentityMapper": "engine.authoring.partition_mappers",
    "Label": "engine.authoring.edges",
    "LatestOnlyOperator": "engine.authoring.branching",
    "Metadata": "engine.authoring.assets",
    "MinimumCount": "engine.authoring.partition_windows",
    "MonthWindow": "engine.authoring.partition_windows",
    "MultipleCronTriggerTimetable": "engine.authoring.trigger_timetables",
    "NEVER_EXPIRE": "engine.authoring.state_store",
    "OnceTimetable": "engine.authoring.timetables",
    "Param": "engine.authoring.params",
    "ParamsDict": "engine.authoring.params_dict",
    "PartitionAtRuntime": "engine.authoring.partition_timetables",
    "PartitionKeyError": "engine.authoring.partition_mappers",
    "PartitionMapper": "engine.authoring.partition_mappers",
    "PartitionedAssetTimetable": "engine.authoring.partition_timetables",
    "PartitionedAtRuntime": "engine.authoring.partition_timetables",
    "PokeReturnValue": "engine.authoring.sensor_base",
    "ProductMapper": "engine.authoring.partition_mappers",
    "PythonOperator": "engine.authoring.operators",
    "PythonSensor": "engine.authoring.standard_sensors",
    "QuarterWindow": "engine.authoring.partition_windows",
    "ResumableJobMixin": "engine.authoring.resumable",
    "RetryAction": "engine.authoring.retry_policies",
    "RetryDecision": "engine.authoring.retry_policies",
    "RetryPolicy": "engine.authoring.retry_policies",
    "RetryRule": "engine.authoring.retry_policies",
    "RollupMapper": "engine.authoring.partition_rollups",
    "SegmentWindow": "engine.authoring.partition_windows",
    "ShortCircuitOperator": "engine.authoring.branching",
    "SkipMixin": "engine.authoring.skipmixin",
    "StartOfDayMapper": "engine.authoring.partition_temporal",
    "StartOfHourMapper": "engine.authoring.partition_temporal",
    "StartOfMonthMapper": "engine.authoring.partition_temporal",
    "StartOfQuarterMapper": "engine.authoring.partition_temporal",
    "StartOfWeekMapper": "engine.authoring.partition_temporal",
    "StartOfYearMapper": "engine.authoring.partition_temporal",
    "SyncCallback": "engine.authoring.deadlines",
    "TaskDeferred": "engine.authoring.deferral",
    "TaskGroup": "engine.authoring.groups",
    "TaskInstance": "engine.authoring.task_instance",
    "TaskInstanceState": "engine.authoring.enums",
    "TimeSensor": "engine.authoring.standard_sensors",
    "Timetable": "engine.authoring.timetables",
    "TriggerDagRunOperator": "engine.authoring.trigger_dagrun",
    "TriggerRule": "engine.authoring.arguments",
    "Variable": "engine.authoring.variables",
    "WaitForAll": "engine.authoring.partition_windows",
    "WeekDay": "engine.authoring.standard_sensors",
    "WeekWindow": "engine.authoring.partition_windows",
    "WeightRule": "engine.authoring.enums",
    "Window": "engine.authoring.partition_windows",
    "XComArg": "engine.authoring.xcom",
    "YearWindow": "engine.authoring.partition_windows",
    "asset": "engine.authoring.asset_decorator",
    "bash_task": "engine.authoring.bash",
    "branch_task": "engine.authoring.branching",
    "chain": "engine.authoring.groups",
    "chain_linear": "engine.authoring.edges",
    "conf": "engine.authoring.configuration",
    "cross_downstream": "engine.authoring.groups",
    "get_current_context": "engine.authoring.context",
    "get_parsing_context": "engine.authoring.parsing_context",
    "literal": "engine.authoring.literals",
    "resolve_deferrable": "engine.authoring.context",
    "sensor_task": "engine.authoring.standard_sensors",
    "setup": "engine.authoring.setup_teardown_tasks",
    "short_circuit_task": "engine.authoring.branching",
    "task": "engine.authoring.operators",
    "task_group": "engine.authoring.groups",
    "teardown": "engine.authoring.setup_teardown_tasks",
}
#: the modules whose decorators hang off ``task`` (``@task.bash``, ``@task.branch``, ...)
__all__: tuple[str, ...] = (
    "DAG",
    "NEVER_EXPIRE",
    "AllowedKeyMapper",
    "Asset",
    "AssetAlias",
    "AssetAll",
    "AssetAny",
    "AssetOrTimeSchedule",
    "AssetWatcher",
    "AsyncCallback",
    "BaseAsset",
    "BaseAsyncOperator",
    "BaseBranchOperator",
    "BaseDeadlineReference",
    "BaseNotifier",
    "BaseOperator",
    "BaseOperatorLink",
    "BaseSensorOperator",
    "BashOperator",
    "BashSensor",
    "BranchDateTimeOperator",
    "BranchDayOfWeekOperator",
    "BranchMixIn",
    "BranchPythonOperator",
    "ChainMapper",
    "Connection",
    "Context",
    "ContinuousTimetable",
    "CronDataIntervalTimetable",
    "CronPartitionTimetable",
    "CronTriggerTimetable",
    "DagDefinitionError",
    "DagRunState",
    "DayOfWeekSensor",
    "DayWindow",
    "DeadlineAlert",
    "DeadlineReference",
    "DeltaDataIntervalTimetable",
    "DeltaTriggerTimetable",
    "EdgeModifier",
    "EmptyOperator",
    "EventsTimetable",
    "ExceptionRetryPolicy",
    "ExternalTaskMarker",
    "ExternalTaskSensor",
    "FanOutMapper",
    "FixedKeyMapper",
    "HourWindow",
    "IdentityMapper",
    "Label",
    "LatestOnlyOperator",
    "Metadata",
    "MinimumCount",
    "MonthWindow",
    "MultipleCronTriggerTimetable",
    "OnceTimetable",
    "Param",
    "ParamsDict",
    "PartitionAtRuntime",
    "PartitionKeyError",
    "PartitionMapper",
    "PartitionedAssetTimetable",
    "PartitionedAtRuntime",
    "PokeReturnValue",
    "ProductMapper",
    "PythonOperator",
    "PythonSensor",
    "QuarterWindow",
    "ResumableJobMixin",
    "RetryAction",
    "RetryDecision",
    "RetryPolicy",
    "RetryRule",
    "RollupMapper",
    "SegmentWindow",
    "ShortCircuitOperator",
    "SkipMixin",
    "StartOfDayMapper",
    "StartOfHourMapper",
    "StartOfMonthMapper",
    "StartOfQuarterMapper",
    "StartOfWeekMapper",
    "StartOfYearMapper",
    "SyncCallback",
    "TaskDeferred",
    "TaskGroup",
    "TaskInstance",
    "TaskInstanceState",
    "TimeSensor",
    "Timetable",
    "TriggerDagRunOperator",
    "TriggerRule",
    "Variable",
    "WaitForAll",
    "WeekDay",
    "WeekWindow",
    "WeightRule",
    "Window",
    "XComArg",
    "YearWindow",
    "asset",
    "bash_task",
    "branch_task",
    "chain",
    "chain_linear",
    "conf",
    "cross_downstream",
    "get_current_context",
    "get_parsing_context",
    "literal",
    "resolve_deferrable",
    "sensor_task",
    "setup",
    "short_circuit_task",
    "task",
    "task_group",
    "teardown",
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
