"""engine package: the authoring API DAG files import, and the engine behind it.

DAG files use ``from engine import dag, task, DAG, Asset, AssetAlias, Metadata, chain,
TaskGroup, task_group, Param, TriggerRule, XComArg, CronTriggerTimetable, ...`` (Airflow's names:
a port changes ``airflow.sdk.X`` to ``engine.X``), sensors from ``engine.sensors`` and
Airflow's exceptions from ``engine.exceptions``. The parts, from the top:
``cli`` and ``supervisor`` (the processes); the runtime parts ``dag_processing``,
``scheduler``, ``executor``, ``triggerer`` and ``api``, which never import each other;
``views`` (the read model ``api`` and ``cli`` show); ``db`` (the metadata database: models,
migrations, every statement) and ``execution`` (what a task process runs, which only the
executor imports), which never import each other; ``authoring`` (what DAG files import); and
the leaves: ``states`` (the stored states every part reads) and the utilities (``config``,
``crypto``, ``logs``, ``metrics``, ``exceptions``, ``retry``, ``task_retries``, ``loader``,
``doctor``). Each package's ``__init__`` says what it owns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The authoring API is the package's public surface: one list, kept in engine.authoring,
# plus the @dag decorator (in engine.authoring the name `dag` is the module authoring.dag).
# Its names load on first use (PEP 562): `import engine.execution.task_runner` or `import
# engine.db` does not import the whole authoring API first. Type checkers read the imports
# below; the `__getattr__` is hidden from them, so a misspelt name stays an error.
if TYPE_CHECKING:
    from engine.authoring import *  # noqa: F403
    from engine.authoring import macros as macros
    from engine.authoring.decorators import dag
    from engine.hooks.base import BaseHook

    __version__: str

from engine.authoring import __all__ as _authoring_all
from triggers.lazy import submodule

# Airflow's airflow.sdk names that live outside the authoring API: ``BaseHook`` (engine.hooks
# builds on authoring's connections), the ``macros`` module and the distribution's version.
__all__: tuple[str, ...] = (*_authoring_all, "BaseHook", "__version__", "dag", "macros")

if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        import importlib

        if name == "dag":
            from engine.authoring.decorators import dag as value
        elif name == "BaseHook":
            from engine.hooks.base import BaseHook as value
        elif name == "macros":
            from engine.authoring import macros as value
        elif name == "__version__":
            from importlib.metadata import version

            value = version("sluice")
        elif name in _authoring_all:
            value = getattr(importlib.import_module("engine.authoring"), name)
        else:  # a subpackage or module not imported yet (engine.db, engine.config, ...)
            return submodule(__name__, name)
        globals()[name] = value  # the next access is a plain attribute
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
