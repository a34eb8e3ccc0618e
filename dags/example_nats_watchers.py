"""Several assets watching ONE NATS JetStream stream through ONE durable pull consumer.

Every watcher below has the same (servers, stream, durable), so the triggerer runs a single
consumer for all of them; each keeps only the messages its filter accepts. A message is
acked only once every watcher has processed it and the asset events derived from it are
stored; one no watcher could process is redelivered at once (``nak``), and one a watcher
rejects (a body that is not JSON, say) is copied to the dead-letter subject, then
terminated. With no server reachable, the watchers retry with backoff and say so once.

Point it at a server with SLUICE_EXAMPLE_NATS (default nats://127.0.0.1:4222, the one
``nats-server -js`` listens on). The stream is created on first use; then publish JSON
messages such as {"region": "eu", "order": 42}:

    nats pub orders.created '{"region": "eu", "order": 42}'
"""

from __future__ import annotations

import os

from engine import DAG, Asset, AssetWatcher, task
from producers import NatsJetStreamTrigger

SERVERS = os.environ.get("SLUICE_EXAMPLE_NATS", "nats://127.0.0.1:4222")


def orders_trigger(region: str) -> NatsJetStreamTrigger:
    return NatsJetStreamTrigger(
        servers=SERVERS,
        stream="SLUICE_EXAMPLE_ORDERS",
        subjects="orders.>",
        durable="sluice-example-orders",
        # Created if missing; it also keeps the dead letters, outside the consumer's subjects.
        create_stream=True,
        stream_subjects=["orders.>", "orders-dead-letter"],
        dead_letter_subject="orders-dead-letter",
        body_filter={"region": region},
    )


orders_eu = Asset("nats-orders-eu", watchers=[AssetWatcher("eu", orders_trigger("eu"))])
orders_us = Asset("nats-orders-us", watchers=[AssetWatcher("us", orders_trigger("us"))])


@task
def count_orders(triggering_asset_events: dict[str, list[dict[str, object]]]) -> int:
    return sum(len(events) for events in triggering_asset_events.values())


with DAG("nats_orders", schedule=orders_eu | orders_us) as dag:
    count_orders()
