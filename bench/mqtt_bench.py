"""MQTT end-to-end throughput: watchers through the real triggerer vs a bare paho loop.

Run by hand (never in tests):  .venv/bin/python bench/mqtt_bench.py [--messages 2000]
                                   [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

A Mosquitto of the bench's own is started on a free loopback port (``max_queued_messages 0``:
the machine's default of 1000 queued messages per offline session would drop a larger
preload). Each case makes a fresh persistent session (its own client id, subscribed to its
own topic at QoS 1), publishes M messages into it while it is offline, then drains it:

* bare: one paho client (MQTT 5, ``clean_start=False``, ``manual_ack=True``, Receive Maximum
  1000, the trigger's default), its network thread acking each message as it arrives, from
  the connect until M PUBACKs are queued: what the broker and the client allow.
* sluice N=1 / N=10: N ``MqttMessageTrigger`` watchers (no filter, ``max_in_flight=1000``)
  on the session, run by the real ``Triggerer`` in-process on SQLite (and PostgreSQL with
  ``--pg``), from the producer's connection (after a 0.5 s cohort grace, so all N watchers
  see every message) until all M x N asset events are committed and all M messages acked.

Figures: messages/s (M / seconds) and asset events/s, min / median / max of ``--repeat``
(>= 3) runs, each case alternating with the bare loop so both see the same load; the ratio
is of medians of the same run. What every broker bench shares is in ``broker_harness.py``.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import broker_harness
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from producers import MqttMessageTrigger
from producers.mqtt_core import DEFAULT_MAX_IN_FLIGHT

# The broker launcher and clients are the test fixtures' own (tests/services_mqtt.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.services_mqtt import MqttBroker, PrivateMosquitto, open_session_sync, publish_sync

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Iterator

    from engine.triggerer.triggerer import Triggerer

MAX_IN_FLIGHT = DEFAULT_MAX_IN_FLIGHT  # the trigger's default: Receive Maximum of both sides
TIMEOUT_S = 300.0
#: every producer the triggerer built (``record_producers``), to read its ack count
BUILT: list[Any] = []


# -- the broker -------------------------------------------------------------------------


def preload(broker: MqttBroker, messages: int) -> tuple[str, str]:
    """A fresh offline session holding ``messages`` messages: (client id, topic filter)."""
    name = f"bench-{uuid.uuid4().hex[:12]}"
    client_id = f"bench-{uuid.uuid4().hex[:12]}"
    open_session_sync(broker, client_id, f"{name}/#")
    payloads = [json.dumps({"n": n}).encode() for n in range(messages)]
    for start in range(0, messages, 500):
        publish_sync(broker, f"{name}/x", payloads[start : start + 500])
    return client_id, f"{name}/#"


def bare_loop_sync(broker: MqttBroker, messages: int) -> float:
    client_id, _topic = preload(broker, messages)
    done = threading.Event()
    acked = 0

    def on_message(client: paho.Client, _u: Any, message: paho.MQTTMessage) -> None:
        nonlocal acked
        client.ack(message.mid, message.qos)
        acked += 1
        if acked >= messages:
            done.set()

    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=paho.MQTTv5,
        reconnect_on_failure=False,
        manual_ack=True,
    )
    client.on_message = on_message
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 60
    properties.ReceiveMaximum = MAX_IN_FLIGHT
    started = time.perf_counter()
    client.connect(broker.host, broker.port, clean_start=False, properties=properties)
    client.loop_start()
    try:
        if not done.wait(TIMEOUT_S):
            raise SystemExit(f"the bare loop acked {acked} of {messages}")
        return time.perf_counter() - started
    finally:
        client.disconnect()
        client.loop_stop()


def record_producers() -> None:
    """Keep every producer the triggerer builds in ``BUILT`` (to read its ack count)."""
    create = MqttMessageTrigger.create_shared_stream_producer.__func__  # type: ignore[attr-defined]

    def recording(cls: Any, kwargs: dict[str, Any]) -> Any:
        producer = create(cls, kwargs)
        BUILT.append(producer)
        return producer

    MqttMessageTrigger.create_shared_stream_producer = classmethod(recording)  # type: ignore[method-assign,assignment]


# -- the bench --------------------------------------------------------------------------


class MqttBench(broker_harness.BrokerBench):
    """A source is a preloaded offline session (client id, topic filter); "acked" is the
    ack count of the producer the triggerer built last."""

    kind = "mqtt"
    ack_poll_s = 0.005

    def __init__(self, broker: MqttBroker) -> None:
        self.broker = broker
        record_producers()

    @property
    def where(self) -> str:
        return f"Mosquitto on port {self.broker.port}"

    @contextlib.asynccontextmanager
    async def preloaded(self, messages: int) -> AsyncIterator[tuple[str, str]]:
        yield await anyio.to_thread.run_sync(preload, self.broker, messages)

    def watcher(self, source: tuple[str, str]) -> MqttMessageTrigger:
        client_id, topic = source
        return MqttMessageTrigger(
            topic=topic,
            host=self.broker.host,
            port=self.broker.port,
            client_id=client_id,
            max_in_flight=MAX_IN_FLIGHT,
        )

    async def all_acked(self, _source: tuple[str, str], _t: Triggerer, messages: int) -> bool:
        return bool(BUILT[-1].acked >= messages)

    async def bare_loop(self, messages: int) -> float:
        return await anyio.to_thread.run_sync(bare_loop_sync, self.broker, messages)


@contextlib.contextmanager
def open_bench(_args: argparse.Namespace) -> Iterator[MqttBench]:
    mosquitto = PrivateMosquitto(extra=["max_queued_messages 0", "autosave_interval 0"])
    mosquitto.start()
    try:
        yield MqttBench(mosquitto.broker)
    finally:
        mosquitto.close()


if __name__ == "__main__":
    broker_harness.main(__doc__, open_bench)
