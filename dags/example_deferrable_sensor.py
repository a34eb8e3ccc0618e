"""Deferrable sensors: while they wait, the worker slot is free.

``wait_a_bit`` hands its wait to a ``TimeDeltaTrigger`` on the triggerer; ``wait_for_file``
waits for a file the same way. Runs when the ``orders`` asset is updated
(``touch "${SLUICE_HOME:-$HOME/.sluice}/orders.flag"``), then waits 5 s and for
``$SLUICE_HOME/ready.flag``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from engine import DAG, Asset, task
from engine.sensors import FileSensor, TimeDeltaSensor

HOME = Path(os.environ.get("SLUICE_HOME", "~/.sluice")).expanduser()

with DAG("example_deferrable_sensor", schedule=Asset("orders")) as dag:
    wait_a_bit = TimeDeltaSensor(task_id="wait_a_bit", delta=timedelta(seconds=5), deferrable=True)
    wait_for_file = FileSensor(
        task_id="wait_for_file", filepath=str(HOME / "ready.flag"), deferrable=True
    )

    @task
    def done() -> str:
        return "waited without holding a worker slot"

    wait_a_bit >> wait_for_file >> done()
