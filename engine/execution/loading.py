"""Loading what a task (or callback) process runs from its DAG file: one task, or the DAG.

The process imports the DAG file (``engine.authoring.dag_files``) fresh from disk and takes
the DAG it was sent for, and from it a fresh instance of the task (``load_dag``,
``load_task``). For a spec, ``dag_for`` / ``task_for`` do so from the file's last good version
when it fails to import now and the DAG processor recorded a parse error for it
(``engine.execution.last_good``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from engine.authoring.dag import take_registered_dags
from engine.authoring.dag_files import add_import_paths, collect_dags, import_dag_file
from engine.authoring.errors import DagDefinitionError
from engine.authoring.parsing_context import parsing_for
from engine.execution.last_good import load_or_last_good

if TYPE_CHECKING:
    from engine.authoring.baseoperator import BaseOperator
    from engine.authoring.dag import DAG


class TaskNames(Protocol):
    """What names a task to load: a ``TaskSpec``, or the ``TaskPrelude`` sent before it."""

    @property
    def fileloc(self) -> str: ...
    @property
    def dag_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def dags_folder(self) -> str | None: ...
    @property
    def plugins_folder(self) -> str | None: ...


def load_dag(
    fileloc: Path,
    dag_id: str,
    *,
    dags_folder: Path | None = None,
    plugins_folder: Path | None = None,
    source: str | None = None,
    task_id: str | None = None,
) -> DAG:
    """Import ``fileloc`` and return its DAG ``dag_id``.

    ``source``: the file's text to run instead of what is on disk (its last good version).
    The import's ``get_parsing_context()`` names ``dag_id`` (and ``task_id``).
    """
    add_import_paths(dags_folder, plugins_folder)
    take_registered_dags()  # nothing a failed import before this one left behind
    with parsing_for(dag_id, task_id):
        module = import_dag_file(fileloc, source=source)
    for dag in collect_dags(module, str(fileloc)):
        if dag.dag_id == dag_id:
            return dag
    raise DagDefinitionError(f"{fileloc} defines no DAG {dag_id!r}")


def load_task(
    fileloc: Path,
    dag_id: str,
    task_id: str,
    *,
    dags_folder: Path | None = None,
    plugins_folder: Path | None = None,
    source: str | None = None,
) -> BaseOperator:
    """Import ``fileloc`` and return a fresh instance of one task."""
    folders = {"dags_folder": dags_folder, "plugins_folder": plugins_folder}
    return load_dag(fileloc, dag_id, source=source, task_id=task_id, **folders).get_task(task_id)


def _folders(spec: TaskNames) -> dict[str, Path | None]:
    return {
        "dags_folder": Path(spec.dags_folder) if spec.dags_folder else None,
        "plugins_folder": Path(spec.plugins_folder) if spec.plugins_folder else None,
    }


def dag_for(spec: TaskNames) -> DAG:
    """The DAG of ``spec``, from its file or the file's last good version."""

    def load(source: str | None) -> DAG:
        folders = _folders(spec)
        return load_dag(
            Path(spec.fileloc),
            spec.dag_id,
            source=source,
            dags_folder=folders["dags_folder"],
            plugins_folder=folders["plugins_folder"],
        )

    return load_or_last_good(spec.fileloc, load)


def task_for(spec: TaskNames) -> BaseOperator:
    """The task of ``spec``, from its file or the file's last good version."""

    def load(source: str | None) -> BaseOperator:
        path = Path(spec.fileloc)
        return load_task(path, spec.dag_id, spec.task_id, source=source, **_folders(spec))

    return load_or_last_good(spec.fileloc, load)
