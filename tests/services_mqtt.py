"""Session fixture and helpers for MQTT: the machine's Mosquitto, and private ones.

``mqtt_broker`` is the machine's Mosquitto (127.0.0.1:1883, ``../shared/SERVICES.md``); if
it does not answer, the fixture starts it with the machine's command and fails (never
skips) when that does not work. ``PrivateMosquitto`` runs a broker of a test's own on a free
port (persistence in a temporary folder, optionally a password file), which the test may
stop and start again. Tests isolate themselves with unique topic prefixes and client ids
(``mqtt_names``) and forget their sessions afterwards.

The client helpers use paho's blocking API in a worker thread: ``publish`` waits for every
PUBACK; ``drain_session`` reads what a persistent session still holds (un-acked and queued
messages) up to a sentinel published behind them, so it waits on a condition, not a clock.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.waiting import listening

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

HOST = "127.0.0.1"
PORT = 1883
START_COMMAND = ["mosquitto", "-d", "-c", "/etc/mosquitto/mosquitto.conf"]
STARTUP_TIMEOUT_S = 10.0
CLIENT_TIMEOUT_S = 10.0
SENTINEL = b"__sluice_test_sentinel__"


@dataclass(frozen=True)
class MqttBroker:
    host: str
    port: int


@dataclass
class MqttNames:
    """A test's own topic prefix and client id."""

    prefix: str
    client_id: str
    topic: str = field(init=False)

    def __post_init__(self) -> None:
        self.topic = f"{self.prefix}/#"


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _wait_answering(host: str, port: int, proc: subprocess.Popen[bytes] | None = None) -> bool:
    return listening(lambda: answers(host, port), timeout=STARTUP_TIMEOUT_S, proc=proc)


@pytest.fixture(scope="session")
def mqtt_broker() -> MqttBroker:
    """The machine's Mosquitto, started with the machine's command if it is down."""
    if not answers(HOST, PORT):
        try:
            subprocess.run(START_COMMAND, check=False, timeout=10, capture_output=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.fail(f"cannot start Mosquitto ({' '.join(START_COMMAND)}): {exc}", pytrace=False)
        if not _wait_answering(HOST, PORT):
            pytest.fail(
                f"Mosquitto does not answer on {HOST}:{PORT}, even after "
                f"`{' '.join(START_COMMAND)}`; install it (apt-get install mosquitto)",
                pytrace=False,
            )
    return MqttBroker(HOST, PORT)


@pytest.fixture
def mqtt_names(mqtt_broker: MqttBroker) -> Iterator[MqttNames]:
    names = MqttNames(prefix=f"t-{uuid.uuid4().hex[:12]}", client_id=f"t-{uuid.uuid4().hex[:16]}")
    yield names
    forget_session(mqtt_broker, names.client_id)


class PrivateMosquitto:
    """A Mosquitto of the test's own on a free port: persistence in a temporary folder (a
    graceful stop saves the sessions' queued messages), an optional password file, and with
    ``log_all`` a debug log (``log``) that names every packet, e.g. each PUBACK a client sent."""

    def __init__(
        self,
        *,
        users: dict[str, str] | None = None,
        log_all: bool = False,
        extra: Sequence[str] = (),
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="mosquitto-"))
        self.log = self.folder / "mosquitto.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        lines = [
            f"listener {self.port} {HOST}",
            "user root",  # as root: no switch to the mosquitto user, who cannot write here
            "persistence true",
            f"persistence_location {self.folder}/",
            "autosave_interval 1",
            f"log_dest file {self.log}",
        ]
        if log_all:
            lines.append("log_type all")
        lines.extend(extra)
        if users:
            passwords = self.folder / "passwords"
            for index, (user, password) in enumerate(users.items()):
                create = ["-c"] if index == 0 else []
                subprocess.run(
                    ["mosquitto_passwd", *create, "-b", str(passwords), user, password],
                    check=True,
                    capture_output=True,
                )
            lines += ["allow_anonymous false", f"password_file {passwords}"]
        else:
            lines.append("allow_anonymous true")
        self.config = self.folder / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")

    @property
    def broker(self) -> MqttBroker:
        return MqttBroker(HOST, self.port)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["mosquitto", "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not _wait_answering(HOST, self.port, self.proc):
            self.stop()
            text = self.log.read_text() if self.log.exists() else ""
            pytest.fail(f"a private Mosquitto did not start on port {self.port}: {text[-500:]}")

    def stop(self) -> None:
        """Stop it gracefully (SIGTERM: it saves its persistence file)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def private_mosquitto(
    *, users: dict[str, str] | None = None, log_all: bool = False
) -> Iterator[PrivateMosquitto]:
    broker = PrivateMosquitto(users=users, log_all=log_all)
    try:
        broker.start()
        yield broker
    finally:
        broker.close()


# -- client helpers (paho's blocking API; call them through anyio.to_thread) ----------------


def _client(
    client_id: str = "", *, protocol: int = paho.MQTTv5, manual_ack: bool = False
) -> paho.Client:
    return paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=protocol,
        reconnect_on_failure=False,
        manual_ack=manual_ack,
    )


def _connected(
    broker: MqttBroker, client: paho.Client, *, clean_start: bool, expiry_s: int = 0
) -> None:
    ready = threading.Event()
    client.on_connect = lambda *_args: ready.set()
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = expiry_s
    client.connect(broker.host, broker.port, clean_start=clean_start, properties=properties)
    client.loop_start()
    if not ready.wait(CLIENT_TIMEOUT_S):
        raise TimeoutError(f"no CONNACK from {broker}")


def _close(client: paho.Client) -> None:
    client.disconnect()
    client.loop_stop()


def publish_sync(
    broker: MqttBroker,
    topic: str,
    payloads: Sequence[bytes],
    *,
    qos: int = 1,
    user_properties: Sequence[Sequence[tuple[str, str]]] | None = None,
) -> None:
    """Publish each payload in order; returns once the broker acknowledged every one."""
    client = _client()
    _connected(broker, client, clean_start=True)
    try:
        infos = []
        for index, payload in enumerate(payloads):
            properties = None
            if user_properties is not None and user_properties[index]:
                properties = Properties(PacketTypes.PUBLISH)
                properties.UserProperty = list(user_properties[index])
            infos.append(client.publish(topic, payload, qos=qos, properties=properties))
        for info in infos:
            info.wait_for_publish(CLIENT_TIMEOUT_S)
    finally:
        _close(client)


async def publish(broker: MqttBroker, topic: str, payloads: Sequence[bytes], **kwargs: Any) -> None:
    await anyio.to_thread.run_sync(lambda: publish_sync(broker, topic, payloads, **kwargs))


def drain_session_sync(broker: MqttBroker, client_id: str, sentinel_topic: str) -> list[Any]:
    """What the persistent session ``client_id`` held when the call began (messages, in
    order), acked: each message comes from exactly one call.

    Publishes a sentinel of this call's own on ``sentinel_topic`` (which the session
    subscribes to) while the session is offline, then resumes the session and reads until
    the sentinel arrives. Acks are manual: a message is acked only when it is taken (before
    the sentinel), so one published while the session is resumed, which arrives after the
    sentinel, is neither taken nor acked and comes with the next call. (With paho's
    automatic acks its PUBACK could be queued behind the DISCONNECT and never sent: the
    next call got it again, a message the engine dead-lettered once read twice.) Before the
    DISCONNECT, an UNSUBSCRIBE's answer says the broker read every PUBACK sent before it.
    """
    sentinel = SENTINEL + uuid.uuid4().hex.encode()
    publish_sync(broker, sentinel_topic, [sentinel])
    held: list[Any] = []
    done = threading.Event()
    client = _client(client_id, manual_ack=True)

    def on_message(_c: Any, _u: Any, message: Any) -> None:
        if done.is_set():
            return  # after the sentinel: not acked, the session keeps it for the next call
        client.ack(message.mid, message.qos)
        if message.payload == sentinel:
            done.set()
        elif not message.payload.startswith(SENTINEL):  # an earlier call's sentinel
            held.append(message)

    client.on_message = on_message
    _connected(broker, client, clean_start=False, expiry_s=60)
    try:
        if not done.wait(CLIENT_TIMEOUT_S):
            raise TimeoutError(f"the session {client_id!r} did not deliver the sentinel")
        _flush(client)
    finally:
        _close(client)
    return held


def _flush(client: paho.Client) -> None:
    """Wait until the broker processed every packet sent so far (it answers in order: the
    UNSUBACK of a filter nobody uses comes after them)."""
    answered = threading.Event()
    client.on_unsubscribe = lambda *_args: answered.set()
    client.unsubscribe(f"sluice-test-flush/{uuid.uuid4().hex}")
    if not answered.wait(CLIENT_TIMEOUT_S):
        raise TimeoutError("no UNSUBACK: the broker may not have read the PUBACKs")


async def drain_session(broker: MqttBroker, client_id: str, sentinel_topic: str) -> list[Any]:
    return await anyio.to_thread.run_sync(drain_session_sync, broker, client_id, sentinel_topic)


def open_session_sync(broker: MqttBroker, client_id: str, topic: str) -> None:
    """Make a persistent session ``client_id`` subscribed to ``topic`` (QoS 1), offline: it
    keeps what is published there for ``drain_session``."""
    client = _client(client_id)
    subscribed = threading.Event()
    client.on_subscribe = lambda *_args: subscribed.set()
    _connected(broker, client, clean_start=True, expiry_s=3600)
    try:
        client.subscribe(topic, qos=1)
        if not subscribed.wait(CLIENT_TIMEOUT_S):
            raise TimeoutError(f"no SUBACK for {topic}")
    finally:
        _close(client)


def forget_session(broker: MqttBroker, client_id: str) -> None:
    """End the persistent session ``client_id`` (clean start, no expiry)."""
    if not answers(broker.host, broker.port):
        return
    client = _client(client_id)
    try:
        _connected(broker, client, clean_start=True, expiry_s=0)
    except (OSError, TimeoutError):
        return
    _close(client)


class Collector:
    """A subscriber that records what arrives on a topic (e.g. a dead-letter topic)."""

    def __init__(self, broker: MqttBroker, topic: str) -> None:
        self.messages: list[Any] = []
        self._lock = threading.Lock()
        self._client = _client()
        self._client.on_message = self._on_message
        subscribed = threading.Event()
        self._client.on_subscribe = lambda *_args: subscribed.set()
        _connected(broker, self._client, clean_start=True)
        self._client.subscribe(topic, qos=1)
        if not subscribed.wait(CLIENT_TIMEOUT_S):
            raise TimeoutError(f"no SUBACK for {topic}")

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        with self._lock:
            self.messages.append(message)

    def close(self) -> None:
        _close(self._client)
