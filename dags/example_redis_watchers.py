"""Several assets watching ONE Redis stream through ONE consumer, filtered per asset.

Every watcher below has the same (server, group, streams), so the triggerer runs a single
consumer of the group for all of them (one per engine process, named "<host>-<pid>"); each
watcher keeps only the entries its filter accepts. An entry is acked (XACK) only once every
watcher has processed it and the asset events derived from it are stored; an entry a watcher
rejects (its body is not JSON) goes to the dead stream "shipments:dead". With no server
reachable, the watchers retry with backoff and say so once; the rest of the engine runs.

Point it at a server with SLUICE_EXAMPLE_REDIS_URL (default redis://127.0.0.1:6379/0), then
add entries whose "body" field holds JSON:

    redis-cli XADD shipments '*' body '{"carrier": "dhl", "parcel": 42}'
"""

from __future__ import annotations

import os

from engine import DAG, Asset, AssetWatcher, task
from producers import RedisStreamTrigger

URL = os.environ.get("SLUICE_EXAMPLE_REDIS_URL", "redis://127.0.0.1:6379/0")


def shipments_trigger(carrier: str) -> RedisStreamTrigger:
    return RedisStreamTrigger(
        stream="shipments",
        group="sluice-example-shipments",
        url=URL,
        body_filter={"carrier": carrier},
    )


dhl = Asset("redis-shipments-dhl", watchers=[AssetWatcher("dhl", shipments_trigger("dhl"))])
ups = Asset("redis-shipments-ups", watchers=[AssetWatcher("ups", shipments_trigger("ups"))])


@task
def count_shipments(triggering_asset_events: dict[str, list[dict[str, object]]]) -> int:
    return sum(len(events) for events in triggering_asset_events.values())


with DAG("redis_shipments", schedule=dhl | ups) as dag:
    count_shipments()
