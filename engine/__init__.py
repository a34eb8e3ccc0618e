"""engine package: the authoring API DAG files import, and the engine behind it.

DAG files use ``from engine import dag, task, DAG, Asset, AssetAlias, Metadata, chain,
TaskGroup, task_group, Param, TriggerRule, XComArg, CronTriggerTimetable, ...`` (Airflow's names:
a port changes ``airflow.sdk.X`` to ``engine.X``), sensors from ``engine.sensors`` and
Airflow's exceptions from ``engine.exceptions``. The parts, from the top:
``cli`` and ``supervisor`` (the processes); the runtime parts ``dag_processing``,
``scheduler``, ``executor`` and ``triggerer``, which never import each other; ``db`` (the
metadata database: models, migrations, every query); ``authoring`` (what DAG files import);
and the leaf utilities (``config``, ``crypto``, ``logs``, ``metrics``, ``exceptions``,
``retry``, ``loader``, ``doctor``). Each package's ``__init__`` says what it owns.
"""

from __future__ import annotations

# The authoring API is the package's public surface: one list, kept in engine.authoring,
# plus the @dag decorator (in engine.authoring the name `dag` is the module authoring.dag).
from engine.authoring import *  # noqa: F403
from engine.authoring import __all__ as _authoring_all
from engine.authoring.decorators import dag

__all__: tuple[str, ...] = (*_authoring_all, "dag")
