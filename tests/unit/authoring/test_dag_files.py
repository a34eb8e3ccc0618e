"""Importing a DAG file runs the file's current bytes (engine.authoring.dag_files)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import pytest

from engine.authoring.dag import take_registered_dags
from engine.authoring.dag_files import collect_dags, dag_module_name, import_dag_file
from engine.authoring.errors import DagDefinitionError

if TYPE_CHECKING:
    from pathlib import Path


def test_a_file_rewritten_in_the_same_second_at_the_same_size_runs_its_new_code(
    tmp_path: Path,
) -> None:
    # Python's bytecode cache trusts a .pyc whose source has the same size and whole-second
    # mtime: a DAG file edited twice within a second would run its first version again.
    path = tmp_path / "versions.py"
    path.write_text("VERSION = 1\n")
    stamp = path.stat().st_mtime_ns
    try:
        assert import_dag_file(path).VERSION == 1
        path.write_text("VERSION = 2\n")
        os.utime(path, ns=(stamp, stamp))
        assert import_dag_file(path).VERSION == 2
    finally:
        sys.modules.pop(dag_module_name(path), None)
    assert not (tmp_path / "__pycache__").exists(), "no bytecode is written beside DAG files"


def test_a_file_that_is_not_python_source_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("VERSION = 1\n")
    with pytest.raises(ImportError, match="not a Python source file"):
        import_dag_file(path)


def test_tracebacks_show_the_lines_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("X = 1\nraise ValueError('line two')\n")
    with pytest.raises(ValueError) as caught:
        import_dag_file(path)
    frames = [f for f in caught.traceback if str(f.path) == str(path)]
    assert frames and frames[-1].lineno == 1  # 0-based: the second line
    assert "raise ValueError" in str(frames[-1].statement)
    assert dag_module_name(path) not in sys.modules


def test_a_file_that_imports_itself_by_name_has_its_dags_once(tmp_path: Path) -> None:
    # Airflow's example_deadline_callback names a function of its own file by dotted path
    # (SyncCallback("example_deadline_callback.deadline_callback")): resolving it imports the
    # file again under its plain name, which runs its `with DAG(...)` a second time.
    path = tmp_path / "self_import.py"
    path.write_text(
        "import importlib\n"
        "from engine import DAG, EmptyOperator\n"
        "def hello():\n"
        "    return 'hi'\n"
        "with DAG('self_import', schedule=None):\n"
        "    EmptyOperator(task_id='t')\n"
        "assert importlib.import_module('self_import').hello() == 'hi'\n"
    )
    sys.path.insert(0, str(tmp_path))
    take_registered_dags()
    try:
        dags = collect_dags(import_dag_file(path), str(path))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(dag_module_name(path), None)
        sys.modules.pop("self_import", None)
        take_registered_dags()
    assert [dag.dag_id for dag in dags] == ["self_import"]


def test_two_dags_with_one_dag_id_in_one_file_are_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "twice.py"
    path.write_text(
        "from engine import DAG, EmptyOperator\n"
        "for _ in range(2):\n"
        "    with DAG('twice', schedule=None):\n"
        "        EmptyOperator(task_id='t')\n"
    )
    take_registered_dags()
    try:
        with pytest.raises(DagDefinitionError, match="two DAGs have the dag_id 'twice'"):
            collect_dags(import_dag_file(path), str(path))
    finally:
        sys.modules.pop(dag_module_name(path), None)
        take_registered_dags()
