"""``macros``: Airflow's ``airflow.sdk.macros`` module, the ``macros`` of every template.

``{{ macros.ds_add(ds, 7) }}``, ``{{ macros.ds_format(ds, "%Y-%m-%d", "%d/%m/%Y") }}``,
``{{ macros.datetime.now() }}``, ``{{ macros.timedelta(hours=1) }}``, and in task code
``from engine import macros``. The names are Airflow's: ``ds_add``, ``ds_format``,
``datetime_diff_for_humans`` (needs pendulum), ``datetime`` and ``timedelta`` (the classes),
and the modules ``time``, ``uuid``, ``json``, ``dateutil``; ``random`` is
``random.random``, as there.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta
from random import random
from typing import Any

import dateutil  # type: ignore[import-untyped]  # Airflow's macros.dateutil (croniter's dep)

__all__ = (
    "datetime",
    "datetime_diff_for_humans",
    "dateutil",
    "ds_add",
    "ds_format",
    "json",
    "random",
    "time",
    "timedelta",
    "uuid",
)


def ds_add(ds: str, days: int) -> str:
    """``ds`` (``YYYY-MM-DD``) plus ``days`` (negative to subtract): ``ds_add(ds, -1)``."""
    if not days:
        return str(ds)
    moved = datetime.strptime(str(ds), "%Y-%m-%d") + timedelta(days=days)
    return moved.strftime("%Y-%m-%d")


def ds_format(ds: str, input_format: str, output_format: str) -> str:
    """``ds`` read with ``input_format`` and written with ``output_format`` (strftime)."""
    return datetime.strptime(str(ds), input_format).strftime(output_format)


def datetime_diff_for_humans(dt: Any, since: Any = None) -> str:
    """How far ``dt`` is from ``since`` (now by default) in words ("2 days ago"); needs
    pendulum, as Airflow's."""
    try:
        import pendulum
    except ImportError as exc:  # pragma: no cover - pendulum is an optional extra
        raise RuntimeError("macros.datetime_diff_for_humans needs pendulum installed") from exc
    other = None if since is None else pendulum.instance(since)
    return str(pendulum.instance(dt).diff_for_humans(other))
