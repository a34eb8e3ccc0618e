"""Partitioned assets: an hourly producer, a consumer per hour and a daily rollup.

``example_hourly_sales`` runs at the top of every hour (``CronPartitionTimetable``); each
run processes the hour of its tick and its outlet event of ``hourly_sales`` carries that
hour as its partition key (``2026-03-10T09:00:00``). ``example_clean_each_hour`` runs once per
key, with the key in its context; ``example_daily_sales`` rolls the hours up into days and
runs once a day's 24 hours are all in.

Try it (with ``make run`` going): backfill one day and watch the runs.

    .venv/bin/sluice dags backfill example_hourly_sales \\
        --from 2026-03-10T00:00 --to 2026-03-10T23:00     # 24 runs, one key each
    .venv/bin/sluice assets partitions hourly_sales       # each hour and its consumers' runs
    .venv/bin/sluice runs list example_clean_each_hour    # 24 runs, one per hour
    .venv/bin/sluice runs list example_daily_sales        # one run: 2026-03-10
    .venv/bin/sluice dags why example_daily_sales         # a day still waiting names its hours
"""

from __future__ import annotations

from datetime import datetime

from engine import (
    DAG,
    Asset,
    CronPartitionTimetable,
    DayWindow,
    PartitionedAssetTimetable,
    RollupMapper,
    StartOfDayMapper,
    task,
)

hourly_sales = Asset("hourly_sales", uri="file:///tmp/sluice/hourly_sales")

with DAG(
    "example_hourly_sales",
    schedule=CronPartitionTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    tags=["example", "partitions"],
):

    @task(outlets=[hourly_sales])
    def ingest(partition_key=None):
        print(f"ingested the sales of the hour {partition_key}")

    ingest()

with DAG(
    "example_clean_each_hour",
    schedule=PartitionedAssetTimetable(assets=hourly_sales),
    tags=["example", "partitions"],
):

    @task
    def clean(dag_run=None):
        print(f"cleaned the hour {dag_run.partition_key}")

    clean()

with DAG(
    "example_daily_sales",
    schedule=PartitionedAssetTimetable(
        assets=hourly_sales,
        default_partition_mapper=RollupMapper(
            upstream_mapper=StartOfDayMapper(), window=DayWindow()
        ),
    ),
    tags=["example", "partitions"],
):

    @task
    def summarise(partition_key=None):
        print(f"summed up the day {partition_key} from its 24 hours")

    summarise()
