"""engine package: the authoring API DAG files import, and the engine behind it.

DAG files use ``from engine import DAG, Asset, AssetWatcher, task, BaseOperator,
BaseSensorOperator, TaskDeferred`` (sensors: ``engine.sensors``). The parts, from the top:
``cli`` and ``supervisor`` (the processes); the runtime parts ``dag_processing``,
``scheduler``, ``executor`` and ``triggerer``, which never import each other; ``db`` (the
metadata database: models, migrations, every query); ``authoring`` (what DAG files import);
and the leaf utilities (``config``, ``crypto``, ``logs``, ``metrics``, ``exceptions``,
``retry``, ``loader``, ``doctor``). Each package's ``__init__`` says what it owns.
"""

from __future__ import annotations

# The authoring API is the package's public surface: one list, kept in engine.authoring.
from engine.authoring import *  # noqa: F403
from engine.authoring import __all__ as __all__
