"""The sensors DAG files import as ``engine.sensors`` (Airflow's ``...sensors`` module).

They are defined in ``engine.authoring.sensors``; this module keeps the public import path.
"""

from __future__ import annotations

from engine.authoring.context import SensorTimeout
from engine.authoring.sensors import (
    DEFAULT_POKE_INTERVAL_S,
    DEFAULT_SENSOR_TIMEOUT_S,
    EXECUTE_COMPLETE,
    BaseSensorOperator,
    DateTimeSensor,
    FileSensor,
    TimeDeltaSensor,
)

__all__: tuple[str, ...] = (
    "DEFAULT_POKE_INTERVAL_S",
    "DEFAULT_SENSOR_TIMEOUT_S",
    "EXECUTE_COMPLETE",
    "BaseSensorOperator",
    "DateTimeSensor",
    "FileSensor",
    "SensorTimeout",
    "TimeDeltaSensor",
)
