"""Importing a DAG file: what the DAG processor's child and the task runner's child share.

A DAG file runs as a fresh module with a name unique to its path (two ``etl.py`` in
subfolders do not collide), with the dags and plugins folders on ``sys.path`` after the
installed packages. ``collect_dags`` finds its DAGs; ``load_task`` returns a fresh instance
of one task, for the child that runs it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from typing import TYPE_CHECKING, Final

from engine.authoring.context import DagDefinitionError
from engine.authoring.dag import DAG, take_registered_dags

if TYPE_CHECKING:
    from pathlib import Path
    from types import ModuleType

    from engine.authoring.dag import BaseOperator


DAG_MODULE_PREFIX: Final = "sluice_dag_"


def dag_module_name(path: Path) -> str:
    """A module name unique to the file, so two ``etl.py`` in subfolders do not collide."""
    digest = hashlib.sha256(str(path).encode("utf-8")).hexdigest()[:16]
    stem = re.sub(r"\W", "_", path.stem)
    return f"{DAG_MODULE_PREFIX}{digest}_{stem}"


def add_import_paths(dags_folder: Path | None, plugins_folder: Path | None) -> None:
    """Append the dags and plugins folders to ``sys.path`` (after the installed packages)."""
    for folder in (dags_folder, plugins_folder):
        if folder is not None and str(folder) not in sys.path:
            sys.path.append(str(folder))


def import_dag_file(path: Path) -> ModuleType:
    """Execute the DAG file as a fresh module; exceptions from the file propagate."""
    name = dag_module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def collect_dags(module: ModuleType, fileloc: str) -> list[DAG]:
    """The DAGs of the file: ``with DAG(...)`` blocks and module-level DAG objects."""
    found = [*take_registered_dags(), *(v for v in vars(module).values() if isinstance(v, DAG))]
    by_id: dict[str, DAG] = {}
    for dag in found:
        other = by_id.setdefault(dag.dag_id, dag)
        if other is not dag:
            raise DagDefinitionError(
                f"{fileloc}: two DAGs have the dag_id {dag.dag_id!r} (lines {other.lineno} and "
                f"{dag.lineno}); dag ids must be unique",
                lineno=dag.lineno,
            )
    for dag in by_id.values():
        dag.check_cycles()
    return list(by_id.values())


def load_task(
    fileloc: Path,
    dag_id: str,
    task_id: str,
    *,
    dags_folder: Path | None = None,
    plugins_folder: Path | None = None,
) -> BaseOperator:
    """Import ``fileloc`` and return a fresh instance of one task (for the executor's child)."""
    add_import_paths(dags_folder, plugins_folder)
    module = import_dag_file(fileloc)
    for dag in collect_dags(module, str(fileloc)):
        if dag.dag_id == dag_id:
            return dag.get_task(task_id)
    raise DagDefinitionError(f"{fileloc} defines no DAG {dag_id!r}")
