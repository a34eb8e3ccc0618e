"""DAGs for the Airflow side of bench/compare_airflow.py (parsed into the template DB once).

* ``bench_idle``: one task whose deferred instances wait on TimeDeltaTriggers (claim rate, RSS).
* ``bench_defer_loop``: one task that defers ``CYCLES`` times on ``TimeDeltaTrigger(0)``
  (defer -> fire -> resume cycle time), the same shape as bench/engine_bench.py's ``Loop``.
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from airflow.sdk import DAG, BaseOperator

CYCLES = int(os.environ.get("BENCH_CYCLES", "10"))


class Wait(BaseOperator):
    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(timedelta(days=1)), method_name="done")

    def done(self, context, event=None):
        return None


class Loop(BaseOperator):
    def execute(self, context):
        self.defer(
            trigger=TimeDeltaTrigger(timedelta(0)),
            method_name="again",
            kwargs={"left": CYCLES - 1},
        )

    def again(self, context, event=None, left=0):
        if left:
            self.defer(
                trigger=TimeDeltaTrigger(timedelta(0)),
                method_name="again",
                kwargs={"left": left - 1},
            )


with DAG("bench_idle", schedule=None, catchup=False):
    Wait(task_id="wait")

with DAG("bench_defer_loop", schedule=None, catchup=False):
    Loop(task_id="loop")
