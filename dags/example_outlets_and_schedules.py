"""A pipeline to watch: a task on a cron schedule updates an asset, and a DAG runs after it.

``example_report_producer`` runs every two minutes (cron ``*/2 * * * *``, catchup off as in
Airflow 3: it starts with the latest tick, not with every tick since ``start_date``). Its task
declares ``outlets=[daily_report]``: when it succeeds, the engine records one asset event
for ``daily_report``, with the ``extra`` the task set, in the same transaction as the
success. ``example_report_consumer`` is scheduled on ``daily_report | report_requested``: it
runs after each producer run, and also when someone drops a flag file (a watcher asset) or
emits an event by hand.

Try it (with ``make run`` going):

    .venv/bin/sluice dags show example_report_producer   # schedule and next run time
    .venv/bin/sluice runs list example_report_consumer   # a run after each producer run
    .venv/bin/sluice assets events daily_report          # source: task, with its extra
    touch "${SLUICE_HOME:-$HOME/.sluice}/report.flag"    # -> a consumer run (watcher)
    .venv/bin/sluice assets emit daily_report --extra '{"rows": 1}'   # -> a consumer run
    .venv/bin/sluice dags backfill example_report_producer \\
        --from 2026-01-01T00:00 --to 2026-01-01T00:10    # six past ticks, one run each
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from engine import Asset, AssetWatcher, dag, task
from triggers import FileDeleteTrigger

HOME = Path(os.environ.get("SLUICE_HOME", "~/.sluice")).expanduser()

daily_report = Asset("daily_report", uri="file:///tmp/sluice/daily_report.json")
report_requested = Asset(
    "report_requested",
    watchers=[
        AssetWatcher(
            "report-flag",
            FileDeleteTrigger(filepath=str(HOME / "report.flag"), poke_interval=1.0),
        )
    ],
)


@dag(
    schedule="*/2 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["example", "outlets"],
)
def example_report_producer() -> None:
    """Builds the report for its interval and says so through an outlet."""

    @task(outlets=[daily_report])
    def build_report(logical_date: datetime, outlet_events: dict) -> None:  # type: ignore[type-arg]
        rows = logical_date.minute + 1  # stands in for the real work
        print(f"built the report for {logical_date.isoformat()}: {rows} rows")
        outlet_events[daily_report].extra = {"rows": rows, "for": logical_date.isoformat()}

    build_report()


@dag(schedule=daily_report | report_requested, tags=["example", "outlets"])
def example_report_consumer() -> None:
    """Publishes the report each time it is updated or requested."""

    @task
    def publish(triggering_asset_events: dict) -> list[str]:  # type: ignore[type-arg]
        seen = [
            f"{event.asset.name} from {event.source}: {event.extra}"
            for events in triggering_asset_events.values()
            for event in events
        ]
        print("publishing after", seen)
        return seen

    publish()


example_report_producer()
example_report_consumer()
