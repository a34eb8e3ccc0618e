"""Airflow side of workload 2: yield-to-advance latency with real persistence.

Run by bench/compare_airflow.py with the Airflow venv's python; one JSON line on stdout.

Airflow's real ``airflow triggerer`` runs on SQLite (a copy of the migrated template DB, at
its default log level INFO, output to a file). N asset watchers are inserted (asset,
asset_active, trigger and asset_watcher rows), all sharing one ack-mode shared stream whose
producer yields events at a steady rate. Latency = time from the producer yielding an event
to ``advance`` receiving it, both taken in the trigger-runner process; in between, every
subscriber's trigger event went to the supervisor at a state sync, ``Trigger.submit_event``
committed its asset event, and the persisted sequence number came back at a later sync.
The same shape as bench/shared_stream_latency.py's ``yield_to_advance`` for Sluice.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import common

PLUGIN = """
import json
import os
import time

import anyio

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import SharedStreamProducer

RATE = float(os.environ["BENCH_RATE"])
TOTAL = int(os.environ["BENCH_EVENTS"])
YIELDED = {}
ADVANCED = {}


class TimedProducer(SharedStreamProducer):
    async def open_stream(self):
        for n in range(TOTAL):
            await anyio.sleep(1 / RATE)
            YIELDED[n] = time.perf_counter()
            yield {"n": n}, n
        await anyio.sleep_forever()

    async def advance(self, batch):
        now = time.perf_counter()
        for n, _outcome in batch:
            ADVANCED[n] = now
        if len(ADVANCED) >= TOTAL:
            lat = [(ADVANCED[n] - YIELDED[n]) * 1000 for n in range(TOTAL)]
            out = os.environ["BENCH_RESULT_FILE"]
            with open(out + ".tmp", "w") as f:
                json.dump(lat, f)
            os.replace(out + ".tmp", out)


class TimedTrigger(BaseEventTrigger):
    def __init__(self, tag):
        super().__init__()
        self.tag = tag

    def serialize(self):
        return ("afbench_plugin.TimedTrigger", {"tag": self.tag})

    def shared_stream_key(self):
        return ("timed",)

    @classmethod
    def create_shared_stream_producer(cls, kwargs):
        return TimedProducer()

    async def filter_shared_stream(self, shared_stream):
        async for raw in shared_stream:
            yield TriggerEvent(raw)

    async def run(self):
        raise RuntimeError("subscriber only")
        yield
"""


def seed_watchers(subscribers: int) -> None:
    from airflow.models.asset import AssetActive, AssetModel, AssetWatcherModel
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session

    with create_session() as session:
        for i in range(subscribers):
            asset = AssetModel(name=f"a{i}", uri=f"bench://{i}", group="asset")
            session.add(asset)
            session.add(AssetActive.for_asset(asset))
            trigger = Trigger(classpath="afbench_plugin.TimedTrigger", kwargs={"tag": f"t{i}"})
            session.add(trigger)
            session.flush()
            session.add(AssetWatcherModel(name="w", asset_id=asset.id, trigger_id=trigger.id))


def run(template: Path, subscribers: int, rate: float, total: int) -> dict[str, float]:
    home = common.prepare_home(template, "INFO")
    plugin_dir = home / "bench_plugin"
    plugin_dir.mkdir()
    (plugin_dir / "afbench_plugin.py").write_text(PLUGIN)
    result = home / "latency.json"
    os.environ.update(
        {
            "PYTHONPATH": str(plugin_dir),
            "BENCH_RATE": str(rate),
            "BENCH_EVENTS": str(total),
            "BENCH_RESULT_FILE": str(result),
        }
    )
    seed_watchers(subscribers)
    proc = common.start(["triggerer"], home, "triggerer")
    try:
        common.wait_for(result.exists, 120 + total / rate * 5, "every event advanced", 0.1)
    finally:
        common.stop(proc)
    lat = sorted(json.loads(result.read_text()))
    common.remove_home(home)
    return {
        "p50_ms": statistics.median(lat),
        "p99_ms": lat[int(len(lat) * 0.99) - 1],
        "max_ms": lat[-1],
        "events": total,
        "subscribers": subscribers,
        "rate_per_s": rate,
        "log_level": "INFO",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--subscribers", type=int, default=1)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--events", type=int, default=1000)
    args = parser.parse_args()
    common.exit_on_signal()
    fig = run(args.template, args.subscribers, args.rate, args.events)
    print(json.dumps({"system": "airflow", "workload": "latency", **fig}), flush=True)
    time.sleep(0)
    os._exit(0)


if __name__ == "__main__":
    main()
