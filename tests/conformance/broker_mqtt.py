"""The kit's MQTT adapter: ``MqttMessageTrigger`` on a Mosquitto of the kit's own.

A stream is a fresh topic prefix (``<name>/lane<i>`` per lane, the watchers subscribe to
``<name>/#``), a client id for the watchers' persistent session, and a dead-letter topic
kept by an offline persistent session of the adapter's (``dead_lettered`` resumes it up to a
sentinel). Watchers dedup by payload (``dedup="payload"``): MQTT has no stable message
identity, so the kit's redelivery is recognised by the digest of topic and payload (the
kit's messages are unique), the option the docs name; the dedup prefix is
``mqtt:payload:``.

Why a Mosquitto of the kit's own even for the "machine's broker" streams: ``unresolved`` is
read from the broker's side, and MQTT has no request that counts a session's un-acked
messages. A Mosquitto with ``log_type all`` logs every PUBACK it receives, naming the client:
``unresolved`` is what was published minus the PUBACKs the watchers' client sent. The
machine's Mosquitto does not log at that level (and other users share it).
"""

from __future__ import annotations

import json
import uuid
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from tests.services_mqtt import (
    MqttBroker,
    PrivateMosquitto,
    drain_session_sync,
    forget_session,
    open_session_sync,
    publish_sync,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping, Sequence

    import pytest

KIND = "mqtt"


class MqttKitStream:
    """A topic prefix, the watchers' session and a dead-letter topic on one Mosquitto."""

    imports = "from producers import MqttMessageTrigger"

    def __init__(self, mosquitto: PrivateMosquitto, lanes: int) -> None:
        self.mosquitto = mosquitto
        self.lanes = lanes
        self.name = f"kit-{uuid.uuid4().hex[:12]}"
        self.client_id = f"kit-{uuid.uuid4().hex[:16]}"
        self.dead_topic = f"{self.name}-dead"
        self.dead_client_id = f"{self.client_id}-dead"
        self.published = 0
        self._dead: list[bytes] = []

    @property
    def broker(self) -> MqttBroker:
        return self.mosquitto.broker

    async def create(self) -> None:
        """Make both sessions now: MQTT keeps a message only for a session that exists (and
        subscribes to its topic) when it is published, and the kit publishes as soon as the
        engine runs, maybe before its watchers' first connect."""
        sessions = [(self.client_id, f"{self.name}/#"), (self.dead_client_id, self.dead_topic)]
        for client_id, topic in sessions:
            await anyio.to_thread.run_sync(open_session_sync, self.broker, client_id, topic)

    def watcher_source(
        self,
        *,
        match: Mapping[str, Any] | None = None,
        dead_letter: bool = True,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {
            "topic": f"{self.name}/#",
            "host": self.broker.host,
            "port": self.broker.port,
            "client_id": self.client_id,
            "dedup": "payload",
        }
        if match:
            kwargs["body_filter"] = dict(match)
        if dead_letter:
            kwargs["dead_letter_topic"] = self.dead_topic
        kwargs.update(options or {})
        return f"MqttMessageTrigger(**{kwargs!r})"

    async def publish(self, bodies: Sequence[Mapping[str, Any]], *, lane: int = 0) -> None:
        await self._publish([json.dumps(dict(b)).encode() for b in bodies], lane)

    async def publish_raw(self, payload: bytes, *, lane: int = 0) -> None:
        await self._publish([payload], lane)

    async def _publish(self, payloads: list[bytes], lane: int) -> None:
        assert 0 <= lane < self.lanes, lane
        topic = f"{self.name}/lane{lane}"
        await anyio.to_thread.run_sync(lambda: publish_sync(self.broker, topic, payloads))
        self.published += len(payloads)

    async def unresolved(self) -> int:
        """Published minus the PUBACKs the watchers' client sent (the broker's debug log)."""
        marker = f"Received PUBACK from {self.client_id} ("
        text = await anyio.Path(self.mosquitto.log).read_text(errors="replace")
        return self.published - text.count(marker)

    async def dead_lettered(self) -> list[bytes]:
        held = await anyio.to_thread.run_sync(
            drain_session_sync, self.broker, self.dead_client_id, self.dead_topic
        )
        self._dead.extend(bytes(m.payload) for m in held)
        return list(self._dead)

    async def aclose(self) -> None:
        for client_id in (self.client_id, self.dead_client_id):
            await anyio.to_thread.run_sync(forget_session, self.broker, client_id)


@asynccontextmanager
async def _stream(mosquitto: PrivateMosquitto, lanes: int) -> AsyncIterator[MqttKitStream]:
    stream = MqttKitStream(mosquitto, lanes)
    await stream.create()
    try:
        yield stream
    finally:
        await stream.aclose()


class PrivateKitMosquitto:
    """A case's own Mosquitto: stopped gracefully (its persistence file keeps the sessions
    and their queued messages) and started again on the same port."""

    def __init__(self) -> None:
        self.mosquitto = PrivateMosquitto(log_all=True)

    def stream(self, *, lanes: int = 1) -> Any:
        return _stream(self.mosquitto, lanes)

    async def stop(self) -> None:
        await anyio.to_thread.run_sync(self.mosquitto.stop)

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self.mosquitto.start)


class MqttKit:
    kind = KIND
    #: case -> why MQTT cannot meet it
    cannot: Mapping[str, str] = {}
    #: an engine (re)opened the session's consumer (``zombie_owner``: never after it resumed)
    consumer_actions = frozenset({"mqtt.connected"})
    #: another client with the session's client id connected: the broker took it away
    disturbed_actions = frozenset({"mqtt.session_taken_over"})

    def __init__(self, mosquitto: PrivateMosquitto) -> None:
        self.mosquitto = mosquitto

    def stream(self, *, lanes: int = 1) -> Any:
        return _stream(self.mosquitto, lanes)

    @asynccontextmanager
    async def private(self) -> AsyncIterator[PrivateKitMosquitto]:
        private = PrivateKitMosquitto()
        await private.start()
        try:
            yield private
        finally:
            await anyio.to_thread.run_sync(private.mosquitto.close)

    def payload_n(self, payload: Mapping[str, Any]) -> int:
        return int(payload["body"]["n"])

    def dedup_prefix(self) -> str:
        return "mqtt:payload:"


@contextmanager
def kit_broker(request: pytest.FixtureRequest) -> Iterator[MqttKit]:
    """The kit's MQTT broker: a Mosquitto of its own with a debug log (see the docstring)."""
    mosquitto = PrivateMosquitto(log_all=True)
    mosquitto.start()
    try:
        yield MqttKit(mosquitto)
    finally:
        mosquitto.close()
