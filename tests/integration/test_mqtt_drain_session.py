"""The tests' reader of a persistent MQTT session (``tests.services_mqtt.drain_session``),
which the MQTT tests and the conformance kit's ``dead_lettered`` rely on to count what the
engine dead-lettered: read while messages keep arriving, each message comes from exactly
one call (none read twice, none lost). With paho's automatic acks a message that arrived
after the sentinel was taken but its PUBACK could be queued behind the DISCONNECT: the
next call read it again (the kit's ``test_dead_letter[mqtt]`` saw a message twice)."""

from __future__ import annotations

import threading
from collections import Counter

import anyio
import anyio.to_thread
import pytest

from tests.services_mqtt import (
    MqttBroker,
    drain_session_sync,
    open_session_sync,
    private_mosquitto,
    publish_sync,
)

pytestmark = pytest.mark.integration

MESSAGES = 150


def _drain_while_publishing(broker: MqttBroker, client_id: str, topic: str) -> list[bytes]:
    published = threading.Event()

    def publisher() -> None:
        try:
            for n in range(MESSAGES):  # one connection each: they trickle in during the reads
                publish_sync(broker, topic, [str(n).encode()])
        finally:
            published.set()

    thread = threading.Thread(target=publisher)
    thread.start()
    read: list[bytes] = []
    try:
        while not published.is_set():
            read += [bytes(m.payload) for m in drain_session_sync(broker, client_id, topic)]
    finally:
        thread.join()
    # everything is published now, before this call's sentinel: it reads the rest
    read += [bytes(m.payload) for m in drain_session_sync(broker, client_id, topic)]
    return read


async def test_a_session_read_while_messages_arrive_gives_each_message_once() -> None:
    with private_mosquitto() as mosquitto:
        client_id, topic = "drained", "dead-letters"
        await anyio.to_thread.run_sync(open_session_sync, mosquitto.broker, client_id, topic)
        with anyio.fail_after(60):
            read = await anyio.to_thread.run_sync(
                _drain_while_publishing, mosquitto.broker, client_id, topic
            )
    counts = Counter(read)
    assert {m: c for m, c in counts.items() if c > 1} == {}, "read more than once"
    assert set(counts) == {str(n).encode() for n in range(MESSAGES)}
