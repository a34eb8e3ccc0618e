"""An Airflow 3.3 partitioned DAG file, ported by its imports, parses in the DAG processor;
the stored schedules it gives rebuild timetables that key and plan runs as the file says."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest

from engine.authoring.dag_files import DAG_MODULE_PREFIX
from engine.authoring.partition_planning import QueuedPartitionEvent, plan_partitioned_runs
from engine.authoring.partition_timetables import CronPartitionTimetable, PartitionedAssetTimetable
from engine.authoring.schedules import timetable_from_json
from engine.authoring.timetables import TimeRestriction
from engine.dag_processing.parsing import parse_file

if TYPE_CHECKING:
    from pathlib import Path

# As Airflow 3.3's docs write it (hourly producer, daily rollup, regional product); only
# `from airflow.sdk import` became `from engine import`.
DAG_FILE = """
from engine import (
    DAG, Asset, CronPartitionTimetable, DayWindow, IdentityMapper, MinimumCount,
    PartitionedAssetTimetable, ProductMapper, RollupMapper, StartOfDayMapper, task,
)

hourly_sales = Asset("hourly_sales")
regional = Asset("regional_sales")

with DAG(dag_id="produce_hourly", schedule=CronPartitionTimetable("0 * * * *", timezone="UTC")):
    @task(outlets=[hourly_sales])
    def produce(dag_run=None):
        print(dag_run.partition_key)
    produce()

with DAG(
    dag_id="daily_summary",
    schedule=PartitionedAssetTimetable(
        assets=hourly_sales,
        default_partition_mapper=RollupMapper(
            upstream_mapper=StartOfDayMapper(), window=DayWindow(), wait_policy=MinimumCount(-1)
        ),
    ),
):
    @task
    def summarize(dag_run=None):
        print(dag_run.partition_key)
    summarize()

with DAG(
    dag_id="regional_daily",
    schedule=PartitionedAssetTimetable(
        assets=regional & hourly_sales,
        partition_mapper_config={regional: ProductMapper(IdentityMapper(), StartOfDayMapper())},
        default_partition_mapper=StartOfDayMapper(),
    ),
):
    @task
    def aggregate():
        pass
    aggregate()
"""


@pytest.fixture(autouse=True)
def _forget_dag_modules():
    yield
    for name in [n for n in sys.modules if n.startswith(DAG_MODULE_PREFIX)]:
        del sys.modules[name]


def stored_timetables(tmp_path: Path) -> dict[str, object]:
    path = tmp_path / "partitions.py"
    path.write_text(DAG_FILE)
    result = parse_file(path)
    assert result.error is None, result.error
    return {dag.dag_id: timetable_from_json(dag.timetable) for dag in result.dags}


def test_the_producers_stored_timetable_keys_its_runs(tmp_path: Path) -> None:
    producer = stored_timetables(tmp_path)["produce_hourly"]
    assert isinstance(producer, CronPartitionTimetable)
    restriction = TimeRestriction(earliest=None, latest=None, catchup=True)
    day = datetime(2026, 3, 10, tzinfo=UTC)
    runs = producer.runs_between(day, day.replace(hour=23), restriction=restriction)
    assert [producer.partition_key_for(run) for run in runs][-2:] == [
        "2026-03-10T22:00:00",
        "2026-03-10T23:00:00",
    ]


def test_the_consumers_stored_timetables_plan_per_key(tmp_path: Path) -> None:
    stored = stored_timetables(tmp_path)
    daily, regional = stored["daily_summary"], stored["regional_daily"]
    assert isinstance(daily, PartitionedAssetTimetable)
    assert isinstance(regional, PartitionedAssetTimetable)
    hours = [
        QueuedPartitionEvent(hour, "hourly_sales", f"2026-03-10T{hour:02d}:00:00")
        for hour in range(23)
    ]
    assert [run.partition_key for run in plan_partitioned_runs(daily, hours).runs] == [
        "2026-03-10"
    ]  # MinimumCount(-1): one hour may be missing
    sales = QueuedPartitionEvent(99, "regional_sales", "us|2026-03-10T10:00:00")
    plan = plan_partitioned_runs(regional, [sales, *hours])
    assert plan.runs == ()  # "us|2026-03-10" and "2026-03-10" are different keys
    assert {wait.partition_key for wait in plan.waiting} == {"us|2026-03-10", "2026-03-10"}
