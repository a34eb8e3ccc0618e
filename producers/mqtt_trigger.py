"""``MqttMessageTrigger``: an asset watcher's event trigger on MQTT topics (ack mode).

Every watcher of one subscription (broker or connection, ``client_id``, topic filters)
shares one ``MqttSharedStreamProducer``: one paho client, one persistent QoS 1 session. Each
watcher filters the shared messages (``topic_filter``, ``user_property_filter``,
``body_filter``, ``apply_function``) and fires one ``TriggerEvent`` per accepted message. A
filter that cannot judge a message (a ``body_filter`` on a payload that is not a JSON object,
an ``apply_function`` that raises, no ``dedup_field``, no partition key) rejects it: the
producer publishes it to ``dead_letter_topic`` and acks it.

The producer is built from the kwargs of the group's first watcher: give every watcher of a
subscription the same connection and producer settings. Credentials are trigger kwargs,
stored encrypted and never logged; ``conn_id`` takes them (and host, port) from a named
connection instead (``mqtt://user:password@host:1883?protocol=5``), resolved by the
triggerer.

Redeliveries. MQTT gives no stable message identity (packet ids are reused), so by default
a redelivered message fires again. ``dedup="payload"`` keys each event by a digest of topic
and payload (equal messages on one topic become one event), ``dedup_field`` by a JSON field
the publisher sets as the message identity. See docs/brokers/mqtt.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from producers.ack_mode_trigger import AckModeMessageTrigger
from producers.exceptions import ProducerConfigError
from producers.message_filters import Rejected
from producers.mqtt_core import (
    DEDUP_MODES,
    DEFAULT_KEEPALIVE_S,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_PORT,
    DEFAULT_SESSION_EXPIRY_S,
    MqttMessage,
    MqttSettings,
    NoIdentity,
    check_settings,
    dedup_key,
    default_client_id,
)
from producers.mqtt_filter import MessageFilter
from producers.partition_keys import (
    PartitionKeyRule,
    field_key,
    function_key,
    named_key,
    partition_key_rule,
    rule_kwargs,
)
from triggers.base import classpath_of
from triggers.extras import importing_extra, require_extra

if TYPE_CHECKING:
    from collections.abc import Hashable, Mapping, Sequence

    from producers.mqtt import MqttSharedStreamProducer
    from producers.mqtt_core import Dedup, Protocol


#: connection extra keys the trigger takes (the URI's query: ``?protocol=3.1.1``)
CONNECTION_EXTRA_KEYS = ("protocol", "session_expiry_s", "keepalive_s")


class MqttMessageTrigger(AckModeMessageTrigger[MqttMessage]):
    """Fires for each message of ``topic`` / ``topics`` that passes this watcher's filters.

    ``topic_filter``: an MQTT filter (or list) the message's topic must match, so siblings
    can share one ``sensors/#`` subscription; ``user_property_filter``: MQTT 5 user property
    -> required value(s); ``body_filter``: dotted JSON path -> required value(s);
    ``apply_function``: dotted path of ``f(message, *args, **kwargs)`` returning truthy.
    Payload: ``topic``, ``mid``, ``dup``, ``qos``, ``retain``, ``body`` (JSON-decoded when it
    parses, else text), ``user_properties``, ``content_type``, ``payload_sha256``.
    """

    connection_kwargs = ("conn_id",)
    rejected_action = "mqtt.message_rejected"

    def __init__(
        self,
        *,
        topic: str | None = None,
        topics: Sequence[str] | None = None,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        conn_id: str | None = None,
        client_id: str | None = None,
        qos: int = 1,
        protocol: Protocol = "5",
        username: str | None = None,
        password: str | None = None,
        body_filter: dict[str, Any] | None = None,
        topic_filter: str | Sequence[str] | None = None,
        user_property_filter: dict[str, Any] | None = None,
        apply_function: str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        dedup: Dedup = "none",
        dedup_field: str | None = None,
        dead_letter_topic: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        session_expiry_s: int = DEFAULT_SESSION_EXPIRY_S,
        keepalive_s: int = DEFAULT_KEEPALIVE_S,
        partition_key_field: str | None = None,
        partition_key_header: str | None = None,
        partition_key_function: str | None = None,
    ) -> None:
        super().__init__()
        require_extra("paho", needed_by="MqttMessageTrigger")
        names = [*_names(topic), *_names(topics)]
        where = f"MqttMessageTrigger on {names}"
        if dedup not in DEDUP_MODES:
            raise ProducerConfigError(f"{where}: dedup={dedup!r} is not one of {list(DEDUP_MODES)}")
        if dedup_field is not None and (not isinstance(dedup_field, str) or not dedup_field):
            raise ProducerConfigError(f"{where}: dedup_field must be a dotted JSON path")
        sorted_topics = tuple(sorted(dict.fromkeys(names)))
        self.conn_id = conn_id
        self.client_id = client_id
        self.settings = MqttSettings(
            topics=sorted_topics,
            host=host,
            port=int(port),
            client_id=client_id or default_client_id(self._where_key(host, port), sorted_topics),
            protocol=protocol,
            username=username,
            password=password,
            qos=qos,
            max_in_flight=max_in_flight,
            session_expiry_s=int(session_expiry_s),
            keepalive_s=int(keepalive_s),
            dead_letter_topic=dead_letter_topic,
        )
        check_settings(self.settings, where=where)
        self.filter = MessageFilter(
            topic_filters=tuple(
                [topic_filter] if isinstance(topic_filter, str) else topic_filter or ()
            ),
            user_property_filter=dict(user_property_filter or {}),
            body_filter=dict(body_filter or {}),
            apply_function=apply_function,
            apply_function_args=list(apply_function_args or ()),
            apply_function_kwargs=dict(apply_function_kwargs or {}),
        )
        self.filter.check(where)
        self.dedup: Dedup = dedup
        self.dedup_field = dedup_field
        self.partition_key_rule = partition_key_rule(
            where,
            partition_key_field=partition_key_field,
            partition_key_header=partition_key_header,
            partition_key_function=partition_key_function,
        )

    def _where_key(self, host: str, port: int) -> str:
        return f"connection:{self.conn_id}" if self.conn_id else f"mqtt://{host}:{port}"

    def serialize(self) -> tuple[str, dict[str, Any]]:
        s, f = self.settings, self.filter
        return (
            classpath_of(MqttMessageTrigger),
            {
                "topics": list(s.topics),
                "host": s.host,
                "port": s.port,
                "conn_id": self.conn_id,
                "client_id": self.client_id,
                "qos": s.qos,
                "protocol": s.protocol,
                "username": s.username,
                "password": s.password,
                "body_filter": f.body_filter or None,
                "topic_filter": list(f.topic_filters) or None,
                "user_property_filter": f.user_property_filter or None,
                "apply_function": f.apply_function,
                "apply_function_args": f.apply_function_args or None,
                "apply_function_kwargs": f.apply_function_kwargs or None,
                "dedup": self.dedup,
                "dedup_field": self.dedup_field,
                "dead_letter_topic": s.dead_letter_topic,
                "max_in_flight": s.max_in_flight,
                "session_expiry_s": s.session_expiry_s,
                "keepalive_s": s.keepalive_s,
                **rule_kwargs(self.partition_key_rule),
            },
        )

    # -- shared stream --------------------------------------------------------------------

    def shared_stream_key(self) -> Hashable:
        """One consumer per (broker or connection id, explicit client id, topic filters):
        the same before and after the triggerer resolves a connection."""
        s = self.settings
        return ("mqtt", self._where_key(s.host, s.port), self.client_id, s.topics)

    @classmethod
    def connection_settings(cls, kwarg: str, connection: Mapping[str, Any]) -> dict[str, Any]:
        """An ``mqtt`` connection as client settings: host, port, login / password; the
        extra (the URI's query) may hold ``protocol``, ``session_expiry_s``, ``keepalive_s``."""
        extra = dict(connection.get("extra") or {})
        settings: dict[str, Any] = {
            "host": connection.get("host"),
            "port": connection.get("port"),
            "username": connection.get("login"),
            "password": connection.get("password"),
            **{key: extra.get(key) for key in CONNECTION_EXTRA_KEYS},
        }
        if not settings["host"]:
            raise ValueError(f"MQTT connection {connection.get('conn_id')!r} names no host")
        for key in ("port", "session_expiry_s", "keepalive_s"):
            if settings[key] not in (None, ""):
                settings[key] = int(settings[key])
        return {k: v for k, v in settings.items() if v not in (None, "")}

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> MqttSharedStreamProducer:
        return cls(**kwargs).build_producer()

    def build_producer(self) -> MqttSharedStreamProducer:
        """The subscription's producer, with this trigger's connection and settings."""
        with importing_extra("MqttMessageTrigger"):
            from producers.mqtt import MqttSharedStreamProducer
        return MqttSharedStreamProducer(self.settings)

    async def matches(self, message: MqttMessage) -> bool:
        """True when ``message`` passes this watcher's filters; ``Rejected`` when they cannot
        judge it."""
        return await self.filter.accepts_message(message)

    def _load_functions(self) -> None:
        super()._load_functions()
        self.filter.load(self.trigger_id)

    def _dedup_key(self, message: MqttMessage) -> str | None:
        try:
            return dedup_key(message, self.dedup, self.dedup_field)
        except NoIdentity as problem:
            raise Rejected(str(problem)) from None

    def _partition_key(self, message: MqttMessage, rule: PartitionKeyRule) -> str:
        if rule.source == "field":
            return field_key(
                message.body if message.body_is_json else None, rule, document_name="the payload"
            )
        if rule.source == "header":
            return named_key(message.user_properties, rule, "user property")
        assert self._key_function is not None, "loaded as the stream starts"
        return function_key(self._key_function, message)

    @staticmethod
    def event_payload(message: MqttMessage) -> dict[str, Any]:
        return {
            "topic": message.topic,
            "mid": message.mid,
            "dup": message.dup,
            "qos": message.qos,
            "retain": message.retain,
            "body": message.body,
            "user_properties": dict(message.user_properties),
            "content_type": message.content_type,
            "payload_sha256": message.digest,
        }

    def _rejected_what(self, message: Any) -> tuple[str, dict[str, Any]]:
        topic = getattr(message, "topic", None)
        packet = getattr(message, "mid", None)
        return f"a message on {topic!r} (packet id {packet})", {"topic": topic}


def _names(value: str | Sequence[str] | None) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value or ())
