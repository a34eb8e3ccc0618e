"""``engine`` covers ``airflow.sdk``: each name of Airflow 3.3.2's ``airflow.sdk.__all__`` is
exported by ``engine`` or named "not applicable" with a reason in the porting guide's table
(docs/porting-from-airflow.md, "``airflow.sdk``, name by name"), and that table lists every
name.

The names are vendored below as a plain list (not the package): ``airflow.sdk.__all__`` of
task SDK 1.3.0 (the source's ``__init__``), plus ``BaseDeadlineReference``, which the 1.3.2
API index lists among ``airflow.sdk``'s classes. A name missing from ``engine`` fails the
test by name until the part that adds it is merged.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import engine

AIRFLOW_SDK_ALL: Final = (
    "__version__",
    "AllowedKeyMapper",
    "asset",
    "Asset",
    "AssetAccessControl",
    "AssetAlias",
    "AssetAll",
    "AssetAny",
    "AssetOrTimeSchedule",
    "AssetWatcher",
    "AsyncCallback",
    "BaseAsyncOperator",
    "BaseBranchOperator",
    "BaseDeadlineReference",
    "BaseHook",
    "BaseNotifier",
    "BaseOperator",
    "BaseOperatorLink",
    "BaseSensorOperator",
    "BaseXCom",
    "BranchMixIn",
    "chain",
    "chain_linear",
    "ChainMapper",
    "conf",
    "Connection",
    "Context",
    "CronDataIntervalTimetable",
    "CronPartitionTimetable",
    "CronTriggerTimetable",
    "cross_downstream",
    "DAG",
    "dag",
    "DagRunState",
    "DayWindow",
    "DeadlineAlert",
    "DeadlineReference",
    "DeltaDataIntervalTimetable",
    "DeltaTriggerTimetable",
    "EdgeModifier",
    "EventsTimetable",
    "ExceptionRetryPolicy",
    "FanOutMapper",
    "FixedKeyMapper",
    "get_current_context",
    "get_parsing_context",
    "HourWindow",
    "IdentityMapper",
    "Label",
    "lineage",
    "literal",
    "macros",
    "Metadata",
    "MinimumCount",
    "MonthWindow",
    "MultipleCronTriggerTimetable",
    "NEVER_EXPIRE",
    "ObjectStoragePath",
    "Param",
    "ParamsDict",
    "PartitionAtRuntime",
    "PartitionedAssetTimetable",
    "PartitionMapper",
    "PokeReturnValue",
    "ProductMapper",
    "QuarterWindow",
    "ResumableJobMixin",
    "RetryAction",
    "RetryDecision",
    "RetryPolicy",
    "RetryRule",
    "RollupMapper",
    "SegmentWindow",
    "setup",
    "SkipMixin",
    "StartOfDayMapper",
    "StartOfHourMapper",
    "StartOfMonthMapper",
    "StartOfQuarterMapper",
    "StartOfWeekMapper",
    "StartOfYearMapper",
    "SyncCallback",
    "task",
    "task_group",
    "TaskGroup",
    "TaskInstance",
    "TaskInstanceState",
    "teardown",
    "TriggerRule",
    "Variable",
    "WaitForAll",
    "WeekWindow",
    "WeightRule",
    "Window",
    "XComArg",
    "YearWindow",
)

GUIDE: Final = Path(__file__).resolve().parents[3] / "docs" / "porting-from-airflow.md"
NOT_APPLICABLE: Final = "not applicable:"
_ROW: Final = re.compile(r"^\| `([^`]+)` \| (.+) \|$")


def _table() -> dict[str, str]:
    """Name -> its cell, from the guide's ``airflow.sdk`` table."""
    text = GUIDE.read_text()
    start = text.index("## `airflow.sdk`, name by name")
    end = text.find("\n## ", start + 1)
    rows: dict[str, str] = {}
    for line in text[start : end if end > 0 else None].splitlines():
        match = _ROW.match(line.strip())
        if match and match.group(1) != "airflow.sdk":
            rows[match.group(1)] = match.group(2).strip()
    return rows


def _not_applicable() -> dict[str, str]:
    return {
        name: cell[len(NOT_APPLICABLE) :].strip()
        for name, cell in _table().items()
        if cell.startswith(NOT_APPLICABLE)
    }


def test_the_vendored_list_has_no_duplicates() -> None:
    assert len(set(AIRFLOW_SDK_ALL)) == len(AIRFLOW_SDK_ALL)


def test_the_guide_has_one_row_per_airflow_sdk_name() -> None:
    table = _table()
    assert sorted(set(AIRFLOW_SDK_ALL) - set(table)) == [], "names without a row"
    assert sorted(set(table) - set(AIRFLOW_SDK_ALL)) == [], "rows for names not in airflow.sdk"


def test_not_applicable_names_say_why_and_stay_few() -> None:
    reasons = _not_applicable()
    assert all(len(reason) > 20 for reason in reasons.values()), reasons
    assert len(reasons) < 10, sorted(reasons)
    exported = sorted(set(reasons) & set(engine.__all__))
    assert exported == [], "exported by engine yet listed as not applicable"


def test_rows_of_exported_names_point_at_engine() -> None:
    table = _table()
    wrong = [
        name
        for name in AIRFLOW_SDK_ALL
        if name in engine.__all__ and not table.get(name, "").startswith(f"`engine.{name}`")
    ]
    assert wrong == []


def test_every_airflow_sdk_name_is_exported_by_engine_or_not_applicable() -> None:
    not_applicable = _not_applicable()
    missing = [n for n in AIRFLOW_SDK_ALL if n not in engine.__all__ and n not in not_applicable]
    assert missing == [], f"airflow.sdk names engine does not export yet: {missing}"


def test_every_exported_name_imports() -> None:
    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
