"""Several assets watching ONE Kafka topic through ONE shared consumer, filtered per asset.

Every watcher below has the same (bootstrap servers, group, topics), so the triggerer runs a
single consumer for all of them; each watcher keeps only the messages its filter accepts. An
offset is committed only once every watcher has processed the message and the asset events
derived from it are stored. With no broker reachable, the watchers retry with backoff and
say so; the rest of the engine runs.

Point it at a broker with SLUICE_EXAMPLE_KAFKA (default 127.0.0.1:9092), then produce JSON
messages such as {"region": "eu", "order": 42} to the topic "orders".
"""

from __future__ import annotations

import os

from engine import DAG, Asset, AssetWatcher, task
from producers import KafkaMessageTrigger

BOOTSTRAP = os.environ.get("SLUICE_EXAMPLE_KAFKA", "127.0.0.1:9092")


def orders_trigger(region: str) -> KafkaMessageTrigger:
    return KafkaMessageTrigger(
        topics=["orders"],
        bootstrap_servers=BOOTSTRAP,
        group_id="sluice-example-orders",
        match_fields={"region": region},
        dead_letter_topic="orders-dead-letter",
    )


orders_eu = Asset("kafka-orders-eu", watchers=[AssetWatcher("eu", orders_trigger("eu"))])
orders_us = Asset("kafka-orders-us", watchers=[AssetWatcher("us", orders_trigger("us"))])


@task
def count_orders(triggering_asset_events: dict[str, list[dict[str, object]]]) -> int:
    return sum(len(events) for events in triggering_asset_events.values())


with DAG("kafka_orders", schedule=orders_eu | orders_us) as dag:
    count_orders()
