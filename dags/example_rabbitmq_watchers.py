"""Several assets watching ONE RabbitMQ queue through ONE shared consumer, filtered per asset.

Both watchers name the same broker and queue, so the triggerer runs a single consumer for
them; each keeps only the messages its filter accepts. A message is acknowledged only once
every watcher has processed it and the asset events derived from it are stored; one a
watcher rejects (a body that is not JSON) goes to the queue's dead-letter exchange, here
the default exchange routing it to "shipments.dead-letter" (declare that queue too to keep
them). With no broker reachable, the watchers retry with backoff and say so once.

Point it at a broker with SLUICE_EXAMPLE_RABBITMQ_URL (default amqp://guest:guest@127.0.0.1:5672/),
then publish JSON bodies such as {"carrier": "dhl", "parcel": 7} to the queue "shipments",
each with a message_id (what makes a redelivery recognisable).
"""

from __future__ import annotations

import os

from engine import DAG, Asset, AssetWatcher, task
from producers import RabbitMQMessageTrigger

URL = os.environ.get("SLUICE_EXAMPLE_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")


def shipments_trigger(carrier: str) -> RabbitMQMessageTrigger:
    return RabbitMQMessageTrigger(
        url=URL,
        queue="shipments",
        declare=True,
        queue_arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "shipments.dead-letter",
        },
        max_deliveries=5,
        body_filter={"carrier": carrier},
    )


dhl = Asset("rabbitmq-shipments-dhl", watchers=[AssetWatcher("dhl", shipments_trigger("dhl"))])
ups = Asset("rabbitmq-shipments-ups", watchers=[AssetWatcher("ups", shipments_trigger("ups"))])


@task
def count_shipments(triggering_asset_events: dict[str, list[dict[str, object]]]) -> int:
    return sum(len(events) for events in triggering_asset_events.values())


with DAG("rabbitmq_shipments", schedule=dhl | ups) as dag:
    count_shipments()
