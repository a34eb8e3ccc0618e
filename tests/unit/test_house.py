"""The house's promises that the import contracts (pyproject.toml, ``lint-imports``) cannot
check: the child processes stay light, and the public authoring imports keep working."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Modules a child process starts from: each task step and each DAG file runs in a fresh
# interpreter, so what they import is paid on every task start and every parse.
CHILD_ENTRY_POINTS = (
    "engine.execution.task_runner",
    "engine.execution.callback_runner",
    "engine.dag_processing.parsing",
)
HEAVY = ("sqlalchemy", "alembic", "prometheus_client", "aiokafka", "click")


@pytest.mark.parametrize("module", CHILD_ENTRY_POINTS)
def test_a_child_entry_point_imports_no_heavy_library(module: str) -> None:
    probe = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == [], f"{module} pulls in {out.stdout.strip()}"


def test_the_public_authoring_imports_work() -> None:
    from engine import (  # noqa: F401
        DAG,
        Asset,
        AssetAll,
        AssetAny,
        AssetWatcher,
        BaseOperator,
        BaseSensorOperator,
        PythonOperator,
        TaskDeferred,
        task,
    )
    from engine.sensors import DateTimeSensor, FileSensor, TimeDeltaSensor  # noqa: F401

    assert callable(task) and isinstance(DAG, type)
