"""Several assets watching ONE MQTT subscription through ONE persistent session, filtered per
asset.

Every watcher below has the same broker, client id and topic filter, so the triggerer runs a
single MQTT client for all of them; each watcher keeps the messages of its own sub-topic
(``topic_filter``). A QoS 1 message is acknowledged (PUBACK) only once every watcher has
processed it and the asset events derived from it are stored; until then the broker keeps
it in the session and redelivers it after a reconnect. MQTT gives no stable message id, so
the publisher puts one in the payload (``dedup_field="id"``): a redelivered reading is
stored once. A reading without an "id" (or not JSON) goes to the dead-letter topic. With no broker
reachable, the watchers retry with backoff and say so; the rest of the engine runs.

Point it at a broker with SLUICE_EXAMPLE_MQTT_HOST / SLUICE_EXAMPLE_MQTT_PORT (default
127.0.0.1:1883), then publish at QoS 1, e.g.
``mosquitto_pub -q 1 -t sluice-example/sensors/temperature/kitchen -m '{"id": "r1", "c": 21.5}'``.
"""

from __future__ import annotations

import os

from engine import DAG, Asset, AssetWatcher, task
from producers import MqttMessageTrigger

HOST = os.environ.get("SLUICE_EXAMPLE_MQTT_HOST", "127.0.0.1")
PORT = int(os.environ.get("SLUICE_EXAMPLE_MQTT_PORT", "1883"))


def readings_trigger(kind: str) -> MqttMessageTrigger:
    return MqttMessageTrigger(
        topic="sluice-example/sensors/#",
        host=HOST,
        port=PORT,
        client_id="sluice-example-sensors",
        topic_filter=f"sluice-example/sensors/{kind}/+",
        dedup_field="id",
        dead_letter_topic="sluice-example/dead-letters",
    )


temperature = Asset(
    "mqtt-temperature", watchers=[AssetWatcher("temperature", readings_trigger("temperature"))]
)
humidity = Asset("mqtt-humidity", watchers=[AssetWatcher("humidity", readings_trigger("humidity"))])


@task
def count_readings(triggering_asset_events: dict[str, list[dict[str, object]]]) -> int:
    return sum(len(events) for events in triggering_asset_events.values())


with DAG("mqtt_sensor_readings", schedule=temperature | humidity) as dag:
    count_readings()
