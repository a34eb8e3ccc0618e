"""The pure pieces of the MQTT adapter: settings, message types, topic matching, dedup keys.

No I/O here, and no paho: a DAG file that declares an ``MqttMessageTrigger`` imports this
module, never the client (``producers.mqtt``, ``producers.mqtt_errors``).

Message identity. An MQTT packet id (``mid``) names a delivery only while it is unacked:
the broker reuses it afterwards, and a redelivery (``dup``) after a reconnect may carry it
or not. There is no stable broker identity, so ``dedup="none"`` (the default) recognises no
redelivery; ``dedup="payload"`` keys each event by a digest of its topic and payload (equal
messages on one topic are then *one* event), and ``dedup_field`` by a JSON field the
publisher sets as the message's identity. ``dedup_key`` computes the key; ``None`` is no key.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from producers.exceptions import ProducerConfigError

Protocol = Literal["5", "3.1.1"]
PROTOCOLS: Final[tuple[str, ...]] = get_args(Protocol)
Dedup = Literal["none", "payload"]
DEDUP_MODES: Final[tuple[str, ...]] = get_args(Dedup)
DEFAULT_PORT: Final = 1883
DEFAULT_MAX_IN_FLIGHT: Final = 1000
MAX_RECEIVE_MAXIMUM: Final = 65535
DEFAULT_SESSION_EXPIRY_S: Final = 86_400
DEFAULT_KEEPALIVE_S: Final = 30
CONNECT_TIMEOUT_S: Final = 5.0
SUBSCRIBE_TIMEOUT_S: Final = 5.0
PUBLISH_TIMEOUT_S: Final = 10.0
CLOSE_TIMEOUT_S: Final = 5.0
# Reconnects that redeliver a failed message: doubling from the first to the last, reset
# by a clean ack (a message every watcher keeps rejecting must not spin the broker).
REDELIVERY_BACKOFF_S: Final = (0.05, 5.0)
# Longer field identities are hashed so the key fits the 512-character column.
MAX_PLAIN_IDENTITY_CHARS: Final = 200
# MQTT 3.1.1 servers need only accept client ids of 1..23 characters.
CLIENT_ID_PREFIX: Final = "sluice-"
CLIENT_ID_DIGEST_CHARS: Final = 16
DEAD_LETTER_TOPIC_PROPERTY: Final = "sluice-original-topic"
_LEVEL_WILDCARD = re.compile(r"[+#]")


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """Where the broker is, how to log in, what to subscribe to, how the session behaves.

    Secrets are left out of ``repr``. ``client_id`` names the persistent session: the same
    id on the next connect gets back the session's subscriptions and un-acked messages.
    """

    topics: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    client_id: str = ""
    protocol: Protocol = "5"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    qos: int = 1
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    session_expiry_s: int = DEFAULT_SESSION_EXPIRY_S
    keepalive_s: int = DEFAULT_KEEPALIVE_S
    dead_letter_topic: str | None = None

    @property
    def address(self) -> str:
        """The broker as the triggerer's warnings name it."""
        return f"mqtt://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class MqttMessage:
    """The raw event every subscriber gets (shared between them: do not mutate).

    ``body`` is the JSON-decoded payload when it parses, else its UTF-8 text, else
    ``{"base64": ...}``; ``body_is_json`` says which. ``mid`` is the packet id of this
    delivery (0 for QoS 0), ``dup`` the broker's redelivery flag; ``user_properties`` the
    MQTT 5 user properties (a later value of a repeated name wins; empty under 3.1.1).
    ``digest`` is the SHA-256 of topic and payload (``dedup="payload"``).
    """

    topic: str
    payload: bytes
    body: Any
    body_is_json: bool
    qos: int
    retain: bool
    dup: bool
    mid: int
    user_properties: dict[str, str]
    content_type: str | None
    digest: str


@dataclass(frozen=True, slots=True)
class MqttReceipt:
    """The broker payload of one delivery: what ``advance`` needs to ack or dead-letter it.

    ``connection`` numbers the producer's connections: a packet id means something only on
    the connection it came on (a reconnect makes every older receipt stale).
    """

    connection: int
    mid: int
    qos: int
    topic: str
    payload: bytes = field(repr=False)
    user_properties: tuple[tuple[str, str], ...] = ()


def decode_body(payload: bytes) -> tuple[Any, bool]:
    """(decoded body, is JSON): JSON when it parses, else text, else base64."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(payload).decode("ascii")}, False
    try:
        return json.loads(text), True
    except ValueError:
        return text, False


def payload_digest(topic: str, payload: bytes) -> str:
    return hashlib.sha256(topic.encode("utf-8") + b"\0" + payload).hexdigest()


def build_message(
    *,
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    mid: int,
    user_properties: dict[str, str],
    content_type: str | None,
) -> MqttMessage:
    body, is_json = decode_body(payload)
    return MqttMessage(
        topic=topic,
        payload=payload,
        body=body,
        body_is_json=is_json,
        qos=qos,
        retain=retain,
        dup=dup,
        mid=mid,
        user_properties=user_properties,
        content_type=content_type,
        digest=payload_digest(topic, payload),
    )


class NoIdentity(Exception):
    """A message that has no ``dedup_field``; the text says why."""


def dedup_key(message: MqttMessage, dedup: str, dedup_field: str | None) -> str | None:
    """The event's dedup key (None: none); ``NoIdentity`` for a missing ``dedup_field``."""
    if dedup_field is not None:
        value = _field(message, dedup_field)
        identity = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        if len(identity) > MAX_PLAIN_IDENTITY_CHARS:
            return "mqtt:id-sha256:" + hashlib.sha256(identity.encode("utf-8")).hexdigest()
        return f"mqtt:id:{identity}"
    if dedup == "payload":
        return f"mqtt:payload:{message.digest}"
    return None


def _field(message: MqttMessage, path: str) -> Any:
    node = message.body
    if not message.body_is_json:
        raise NoIdentity(f"dedup_field {path!r}: the payload is not JSON")
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise NoIdentity(f"dedup_field {path!r} is missing")
        node = node[part]
    if node is None or isinstance(node, dict | list) or node == "":
        raise NoIdentity(f"dedup_field {path!r} is {node!r}, not an identity")
    return node


def topic_matches(topic_filter: str, topic: str) -> bool:
    """True when ``topic`` matches the MQTT ``topic_filter`` (``+`` one level, ``#`` the rest;
    a wildcard first level never matches a ``$`` topic)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    wanted = topic_filter.split("/")
    levels = topic.split("/")
    for index, part in enumerate(wanted):
        if part == "#":
            return True
        if index >= len(levels) or (part != "+" and part != levels[index]):
            return False
    return len(levels) == len(wanted)


def topic_filter_problem(topic_filter: Any) -> str | None:
    """Why ``topic_filter`` is not a valid MQTT topic filter (None: it is)."""
    if not isinstance(topic_filter, str) or not topic_filter:
        return f"{topic_filter!r} is not a non-empty topic filter"
    if "\0" in topic_filter or len(topic_filter.encode("utf-8")) > MAX_RECEIVE_MAXIMUM:
        return f"{topic_filter!r} has a NUL character or is too long"
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if level == "#" and index != len(levels) - 1:
            return f"{topic_filter!r}: '#' must be the last level"
        if level not in ("+", "#") and _LEVEL_WILDCARD.search(level):
            return f"{topic_filter!r}: a wildcard must be a whole level"
    return None


def topic_problem(topic: Any) -> str | None:
    """Why ``topic`` is not a topic one may publish to (None: it is)."""
    if not isinstance(topic, str) or not topic:
        return f"{topic!r} is not a non-empty topic"
    if _LEVEL_WILDCARD.search(topic) or "\0" in topic:
        return f"{topic!r} has a wildcard or a NUL character"
    return None


def default_client_id(where: str, topics: tuple[str, ...]) -> str:
    """A stable client id for a subscription (``where``: the broker's address or the
    connection id) of 23 characters, the size every MQTT 3.1.1 server accepts."""
    seed = json.dumps([where, sorted(topics)]).encode("utf-8")
    return CLIENT_ID_PREFIX + hashlib.sha256(seed).hexdigest()[:CLIENT_ID_DIGEST_CHARS]


def check_settings(settings: MqttSettings, *, where: str) -> None:
    """Raise ``ProducerConfigError`` for settings that cannot work."""
    problems = [*_session_problems(settings), *_topic_problems(settings)]
    if problems:
        raise ProducerConfigError(f"{where}: " + "; ".join(problems))


def _topic_problems(settings: MqttSettings) -> list[str]:
    problems = [p for t in settings.topics if (p := topic_filter_problem(t))]
    if not settings.topics:
        problems.append("give topic= or topics=[...] (MQTT topic filters)")
    if settings.dead_letter_topic is not None and (p := topic_problem(settings.dead_letter_topic)):
        problems.append(f"dead_letter_topic {p}")
    elif settings.dead_letter_topic is not None and any(
        topic_matches(t, settings.dead_letter_topic) for t in settings.topics
    ):
        problems.append(
            f"dead_letter_topic {settings.dead_letter_topic!r} matches a subscribed topic "
            "filter: dead letters would come back as messages"
        )
    return problems


def _session_problems(settings: MqttSettings) -> list[str]:
    problems = []
    if settings.protocol not in PROTOCOLS:
        problems.append(f"protocol={settings.protocol!r} is not one of {list(PROTOCOLS)}")
    if settings.qos != 1:
        problems.append(
            f"qos={settings.qos}: only QoS 1 is supported (QoS 0 is never acked, so a message "
            "is lost if the engine stops; QoS 2's handshake acks before the event is stored)"
        )
    if not 1 <= settings.max_in_flight <= MAX_RECEIVE_MAXIMUM:
        problems.append(f"max_in_flight={settings.max_in_flight} must be 1..{MAX_RECEIVE_MAXIMUM}")
    if settings.session_expiry_s < 1:
        problems.append(
            f"session_expiry_s={settings.session_expiry_s}: a persistent session needs >= 1 s"
        )
    if settings.keepalive_s < 1:
        problems.append(f"keepalive_s={settings.keepalive_s} must be at least 1")
    if not 1 <= settings.port <= 65535:
        problems.append(f"port={settings.port} is not a TCP port")
    if not settings.client_id:
        problems.append("client_id must be a non-empty string")
    if settings.password is not None and settings.username is None:
        problems.append("a password needs a username")
    return problems
