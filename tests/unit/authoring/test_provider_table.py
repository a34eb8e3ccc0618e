"""The porting guide's standard-provider table (docs/porting-from-airflow.md, "The standard
provider, name by name") is true: every Sluice path it names imports, and every name of the
provider listed below has a row (a Sluice path, or "not provided" with a reason)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Final

import pytest

GUIDE: Final = Path(__file__).resolve().parents[3] / "docs" / "porting-from-airflow.md"
SECTION: Final = "## The standard provider, name by name"

#: The operators, sensors, triggers and task decorators of Airflow's standard provider
#: (apache-airflow-providers-standard, as Airflow 3.3 ships it), by module.
PROVIDER_NAMES: Final = (
    "operators.bash.BashOperator",
    "operators.branch.BaseBranchOperator",
    "operators.branch.BranchMixIn",
    "operators.datetime.BranchDateTimeOperator",
    "operators.empty.EmptyOperator",
    "operators.latest_only.LatestOnlyOperator",
    "operators.python.PythonOperator",
    "operators.python.BranchPythonOperator",
    "operators.python.ShortCircuitOperator",
    "operators.python.PythonVirtualenvOperator",
    "operators.python.BranchPythonVirtualenvOperator",
    "operators.python.ExternalPythonOperator",
    "operators.python.BranchExternalPythonOperator",
    "operators.smooth.SmoothOperator",
    "operators.trigger_dagrun.TriggerDagRunOperator",
    "operators.weekday.BranchDayOfWeekOperator",
    "operators.hitl.HITLOperator",
    "sensors.bash.BashSensor",
    "sensors.date_time.DateTimeSensor",
    "sensors.date_time.DateTimeSensorAsync",
    "sensors.external_task.ExternalTaskSensor",
    "sensors.external_task.ExternalTaskMarker",
    "sensors.filesystem.FileSensor",
    "sensors.python.PythonSensor",
    "sensors.time.TimeSensor",
    "sensors.time.TimeSensorAsync",
    "sensors.time_delta.TimeDeltaSensor",
    "sensors.time_delta.TimeDeltaSensorAsync",
    "sensors.time_delta.WaitSensor",
    "sensors.weekday.DayOfWeekSensor",
    "triggers.temporal.DateTimeTrigger",
    "triggers.temporal.TimeDeltaTrigger",
    "triggers.file.FileTrigger",
    "triggers.file.FileDeleteTrigger",
    "triggers.external_task.WorkflowTrigger",
    "triggers.hitl.HITLTrigger",
    "@task.bash",
    "@task.branch",
    "@task.short_circuit",
    "@task.sensor",
    "@task.virtualenv",
    "@task.external_python",
)


def _rows() -> list[tuple[str, str]]:
    text = GUIDE.read_text()
    assert SECTION in text, f"{GUIDE} lost its section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`") and not cells[0].startswith("`airflow"):
            rows.append((cells[0], cells[1]))
    return rows


def _resolve(path: str) -> object:
    """``engine.sensors.FileSensor`` -> the object; ``engine.task.bash`` -> the decorator."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            value = getattr(value, attr)
        return value
    raise ImportError(path)


def test_every_provider_name_has_a_row() -> None:
    listed = " ".join(name for name, _ in _rows())
    missing = [
        name
        for name in PROVIDER_NAMES
        if f"`{name}`" not in listed
        and f"`{name.rsplit('.', 1)[-1]}`" not in listed
        and f"`{name}` (" not in listed
    ]
    assert missing == [], f"standard-provider names without a row in {GUIDE.name}: {missing}"


@pytest.mark.parametrize(("name", "target"), _rows(), ids=[name for name, _ in _rows()])
def test_each_row_names_a_sluice_path_that_imports_or_a_reason(name: str, target: str) -> None:
    if target.startswith("not provided: "):
        assert len(target) > len("not provided: ") + 10, f"{name}: give the reason"
        return
    path = re.match(r"`([\w.]+)`", target)
    assert path is not None, f"{name}: {target!r} is neither a Sluice path nor 'not provided'"
    assert _resolve(path[1]) is not None
