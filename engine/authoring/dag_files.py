"""Importing a DAG file and collecting its DAGs: what the DAG processor's child and a task's
process share (``engine.execution.loading`` finds one task among the DAGs).

A DAG file runs as a fresh module with a name unique to its path (two ``etl.py`` in
subfolders do not collide), with the dags and plugins folders on ``sys.path`` after the
installed packages. ``collect_dags`` finds its DAGs: the ``with DAG(...)`` blocks that ended
while it ran (``take_registered_dags``) and module-level DAG objects.

A DAG file can also run from given source text (``import_dag_file(path, source=...)``): the
DAG processor's child reads the file once and runs exactly those bytes, so the source it
reports (and the DAG processor stores as the file's last good version) is the code it
parsed; a task whose file is broken now runs that stored version (``load_task(...,
source=...)``). Such a module has the file's name and ``__file__``, and its lines are the
ones tracebacks show.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import linecache
import re
import sys
from typing import TYPE_CHECKING, Final

from engine.authoring.dag import DAG, take_registered_dags
from engine.authoring.errors import DagDefinitionError

if TYPE_CHECKING:
    from pathlib import Path
    from types import ModuleType


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


def source_digest(source: bytes | str) -> str:
    """The sha256 of a DAG file's source (its bytes; text is hashed as UTF-8)."""
    data = source.encode("utf-8") if isinstance(source, str) else source
    return hashlib.sha256(data).hexdigest()


def decode_source(data: bytes) -> str:
    """A DAG file's bytes as text, as Python reads them (a PEP 263 coding line applies)."""
    return importlib.util.decode_source(data)


class _GivenSource(importlib.abc.Loader):
    """Runs given source text as the module of DAG file ``path``."""

    def __init__(self, path: str, source: str) -> None:
        self.path = path
        self.source = source

    def exec_module(self, module: ModuleType) -> None:
        code = compile(self.source, self.path, "exec", dont_inherit=True)
        exec(code, module.__dict__)  # running the DAG file is the point

    def get_source(self, fullname: str) -> str:  # inspect and tracebacks read it
        return self.source


def import_dag_file(path: Path, *, source: str | None = None) -> ModuleType:
    """Execute the DAG file as a fresh module; exceptions from the file propagate.

    The file's current bytes are compiled every time, never a cached ``.pyc``: Python checks
    a cached file by its source's size and whole-second mtime, so a file rewritten within
    the second at the same size would otherwise run its old code (and no ``__pycache__``
    folder appears in the dags folder). ``source``: run this text as the file (e.g. its last
    good version) instead of what is on disk; tracebacks then show its lines.
    """
    if source is None:
        if path.suffix != ".py":
            raise ImportError(f"cannot import {path}: not a Python source file")
        source = decode_source(path.read_bytes())
    name = dag_module_name(path)
    loader = _GivenSource(str(path), source)
    spec = importlib.util.spec_from_loader(name, loader, origin=str(path))
    if spec is None:
        raise ImportError(f"cannot import {path}")
    spec.has_location = True  # __file__ is the DAG file's path
    lines = source.splitlines(keepends=True)
    linecache.cache[str(path)] = (len(source), None, lines, str(path))  # never re-read
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _of_this_run(dag: DAG, module: ModuleType) -> bool:
    """Was ``dag`` defined by this run of the file, not by the same file imported again under
    another module name (``import my_dag_file``, or a callback's dotted path naming a
    function of the file), whose DAGs are that other module's, as Airflow's DagBag keeps only
    the parsed module's?"""
    name = dag.module_name
    if name is None or name == module.__name__:
        return True
    other = sys.modules.get(name)
    return getattr(other, "__file__", None) != getattr(module, "__file__", None)


def collect_dags(module: ModuleType, fileloc: str) -> list[DAG]:
    """The DAGs of the file: ``with DAG(...)`` blocks and module-level DAG objects."""
    registered = [dag for dag in take_registered_dags() if _of_this_run(dag, module)]
    found = [*registered, *(v for v in vars(module).values() if isinstance(v, DAG))]
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
