"""The paho side of one MQTT connection: its handle, a received PUBLISH as the producer's
types, and the close. Imported by ``producers.mqtt`` only (paho is the ``mqtt`` extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from producers.mqtt_core import MqttMessage, MqttReceipt, build_message

if TYPE_CHECKING:
    import paho.mqtt.client as paho


class Link:
    """One connection of the producer: its paho client and its number (``connection``).

    ``closing``: the producer let go of it; its callbacks deliver nothing more (read by
    paho's thread, set by the event loop's under the producer's capacity lock)."""

    __slots__ = ("client", "closing", "number")

    def __init__(self, number: int) -> None:
        self.number = number
        self.client: paho.Client | None = None
        self.closing = False

    def __repr__(self) -> str:
        return f"<Link {self.number} closing={self.closing}>"


def delivery(msg: paho.MQTTMessage, connection: int) -> tuple[MqttMessage, MqttReceipt]:
    """The raw event and the receipt of one PUBLISH paho received."""
    properties = getattr(msg, "properties", None)
    pairs = tuple((str(k), str(v)) for k, v in (getattr(properties, "UserProperty", None) or ()))
    message = build_message(
        topic=msg.topic,
        payload=bytes(msg.payload),
        qos=msg.qos,
        retain=bool(msg.retain),
        dup=bool(msg.dup),
        mid=msg.mid,
        user_properties=dict(pairs),
        content_type=getattr(properties, "ContentType", None),
    )
    receipt = MqttReceipt(connection, msg.mid, msg.qos, msg.topic, message.payload, pairs)
    return message, receipt


def disconnect(client: paho.Client) -> None:
    """Send DISCONNECT after the queued packets, stop paho's thread (in a worker thread)."""
    client.disconnect()
    client.loop_stop()
