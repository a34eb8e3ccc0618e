"""The sensors DAG files import as ``engine.sensors`` (Airflow's standard provider sensors).

A port changes ``from airflow.providers.standard.sensors.python import PythonSensor`` (or
``.bash``, ``.time``, ``.weekday``, ``.external_task``, ``.time_delta``, ``.date_time``,
``.filesystem``) and ``from airflow.sdk import BaseSensorOperator, PokeReturnValue`` to
``from engine.sensors import ...``. They are defined in ``engine.authoring``
(``sensor_base``, ``sensors``, ``standard_sensors``, ``external_task``).
"""

from __future__ import annotations

from engine.authoring.errors import SensorTimeout
from engine.authoring.external_task import (
    DuplicateStateError,
    ExternalDagFailedError,
    ExternalTaskFailedError,
    ExternalTaskNotFoundError,
    ExternalTaskSensor,
)
from engine.authoring.external_task_trigger import ExternalTaskTrigger
from engine.authoring.sensor_base import (
    DEFAULT_POKE_INTERVAL_S,
    DEFAULT_SENSOR_TIMEOUT_S,
    EXECUTE_COMPLETE,
    BaseSensorOperator,
    PokeReturnValue,
)
from engine.authoring.sensors import DateTimeSensor, FileSensor, TimeDeltaSensor
from engine.authoring.standard_sensors import (
    BashSensor,
    DayOfWeekSensor,
    PythonSensor,
    TimeSensor,
    TimeSensorAsync,
    WeekDay,
)

__all__: tuple[str, ...] = (
    "DEFAULT_POKE_INTERVAL_S",
    "DEFAULT_SENSOR_TIMEOUT_S",
    "EXECUTE_COMPLETE",
    "BaseSensorOperator",
    "BashSensor",
    "DateTimeSensor",
    "DayOfWeekSensor",
    "DuplicateStateError",
    "ExternalDagFailedError",
    "ExternalTaskFailedError",
    "ExternalTaskNotFoundError",
    "ExternalTaskSensor",
    "ExternalTaskTrigger",
    "FileSensor",
    "PokeReturnValue",
    "PythonSensor",
    "SensorTimeout",
    "TimeDeltaSensor",
    "TimeSensor",
    "TimeSensorAsync",
    "WeekDay",
)
