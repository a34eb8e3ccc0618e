"""Assets updated by watchers: drop a flag file, get a DAG run.

Two sibling ``DirectoryFileDeleteTrigger`` watchers read one inbox directory and share ONE
directory listing per cadence (look for a single ``Shared stream group started`` log line);
a standalone ``FileDeleteTrigger`` watches a file of its own. Each asset schedules a DAG
whose task reports the asset events that triggered its run.

Try it (with ``make run`` going):

    touch "${SLUICE_HOME:-$HOME/.sluice}/inbox/eu.flag"     # -> one run of process_region_eu
    touch "${SLUICE_HOME:-$HOME/.sluice}/orders.flag"       # -> one run of process_orders
    .venv/bin/sluice runs list process_region_eu
"""

from __future__ import annotations

import os
from pathlib import Path

from engine import DAG, Asset, AssetWatcher, task
from triggers import DirectoryFileDeleteTrigger, FileDeleteTrigger

HOME = Path(os.environ.get("SLUICE_HOME", "~/.sluice")).expanduser()
INBOX = HOME / "inbox"
INBOX.mkdir(parents=True, exist_ok=True)
POKE_S = 1.0

region_eu = Asset(
    "region-eu",
    watchers=[
        AssetWatcher(
            "eu-flag",
            DirectoryFileDeleteTrigger(
                directory=str(INBOX), filename="eu.flag", poke_interval=POKE_S
            ),
        )
    ],
)
region_us = Asset(
    "region-us",
    watchers=[
        AssetWatcher(
            "us-flag",
            DirectoryFileDeleteTrigger(
                directory=str(INBOX), filename="us.flag", poke_interval=POKE_S
            ),
        )
    ],
)
orders = Asset(
    "orders",
    watchers=[
        AssetWatcher(
            "orders-flag",
            FileDeleteTrigger(filepath=str(HOME / "orders.flag"), poke_interval=POKE_S),
        )
    ],
)


@task
def report(triggering_asset_events: dict[str, list[dict[str, object]]]) -> dict[str, object]:
    """Return (and log) which flag files triggered this run."""
    seen = {
        name: [e["payload"] for e in events] for name, events in triggering_asset_events.items()
    }
    print(f"triggered by {seen}")
    return seen


for asset in (region_eu, region_us, orders):
    dag_id = "process_" + asset.name.replace("-", "_")
    with DAG(dag_id, schedule=asset, description=f"Runs when {asset.name} is updated") as dag:
        report()
    globals()[dag_id] = dag
