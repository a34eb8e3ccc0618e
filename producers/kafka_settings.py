"""What a Kafka shared consumer is built from: ``KafkaSettings``, its defaults and checks.

``KafkaMessageTrigger`` builds a ``KafkaSettings`` from its keyword arguments (the fields
are named as those are, and ``as_kwargs`` gives them back for ``serialize()``);
``KafkaSharedStreamProducer`` takes it. A connection's settings (``kafka_config_id``) become
trigger kwargs in ``settings_from_connection``. See ``producers.kafka`` for what
``on_unclean`` does. No I/O here, and no aiokafka but where ``client_kwargs`` builds a TLS
context for a client, and no ``ssl`` but there (it loads OpenSSL: a DAG file that declares a
Kafka watcher imports this module in every parse and task process).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from producers.exceptions import ProducerConfigError

if TYPE_CHECKING:
    import ssl
    from collections.abc import Mapping, Sequence

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_CLIENT_ID: Final = "sluice"
OnUnclean = Literal["commit", "dead_letter", "stop"]
ON_UNCLEAN_CHOICES: Final = ("commit", "dead_letter", "stop")
OFFSET_RESETS: Final = ("earliest", "latest", "none")
DEFAULT_AUTO_OFFSET_RESET: Final = "latest"
DEFAULT_SESSION_TIMEOUT_MS: Final = 10_000
DEFAULT_HEARTBEAT_INTERVAL_MS: Final = 3_000
DEFAULT_REBALANCE_TIMEOUT_MS: Final = 20_000
DEFAULT_MAX_POLL_RECORDS: Final = 1_000
# Messages yielded and not advanced yet, above which the consumer fetches no more until
# advances catch up: the pipeline behind it (subscriber queues, outbox, the writer) holds a
# bounded backlog, not the whole topic (every message held is ~15 Python objects, and the
# garbage collector's full passes grow with them: unbounded, they took half the CPU).
DEFAULT_MAX_INFLIGHT_MESSAGES: Final = 8_000
# Messages per raw event of a batch-mode consumer (``producers.kafka``): at most this many
# consecutive records of one partition from one fetch are fanned out, resolved and advanced
# as one ``KafkaMessageBatch``.
DEFAULT_BATCH_MESSAGES: Final = 250
# aiokafka leaves the group when no records were fetched for this long (its default is 300 s,
# the shared-stream ack timeout's default too): a consumer held at ``max_inflight_messages``
# while the store is slow does not fetch, and must not give its partitions up for that
# (a stuck event loop still leaves, by the session timeout). ``consumer_options`` may set it.
DEFAULT_MAX_POLL_INTERVAL_MS: Final = 3_600_000
# How long the broker may hold a fetch that finds no new records (aiokafka's default is 500
# ms). aiokafka keeps one fetch in flight per broker and leaves out the partitions it still
# holds records of: when a backlogged partition's records run out while that fetch waits on
# the consumer's idle (caught-up) partitions, the backlog waits for the fetch to time out.
# Measured (bench/kafka_bench.py): the last records of a partition came 350 ms after the
# others, 12% of a 100k-message run. 100 ms bounds the stall; an idle consumer then sends
# ten fetches a second instead of two. ``consumer_options`` may set it.
DEFAULT_FETCH_MAX_WAIT_MS: Final = 100
DEFAULT_ADVANCE_TIMEOUT_S: Final = 30.0
FETCH_WAIT_MS: Final = 500
# Consumer options the producer sets itself (``consumer_options`` may not override them).
_MANAGED_OPTIONS: Final = frozenset(
    {
        "bootstrap_servers",
        "client_id",
        "group_id",
        "auto_offset_reset",
        "session_timeout_ms",
        "heartbeat_interval_ms",
        "rebalance_timeout_ms",
        "security_protocol",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "ssl_context",
        "key_deserializer",
        "value_deserializer",
    }
)

#: Settings that are secrets: left out of ``repr`` and of the settings digest.
_SECRETS: Final = frozenset({"sasl_plain_password", "ssl_password"})


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaSettings:
    """One shared consumer's connection, group, dead-letter and consumer settings.

    ``bootstrap_servers`` is empty while they come from a connection (``kafka_config_id``)
    the triggerer has not looked up yet: such settings are only stored, and checked once the
    trigger is built again with the connection's. Otherwise a setting that cannot work
    raises ``ProducerConfigError`` at construction. ``security_protocol``: PLAINTEXT, SSL,
    SASL_PLAINTEXT or SASL_SSL; SASL needs ``sasl_mechanism`` (PLAIN, SCRAM-SHA-256,
    SCRAM-SHA-512) with a user name and password; SSL uses the optional CA / certificate /
    key files. Secrets never show in ``repr``.
    """

    topics: tuple[str, ...]
    group_id: str
    bootstrap_servers: tuple[str, ...] = ()
    client_id: str = DEFAULT_CLIENT_ID
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    dead_letter_topic: str | None = None
    on_unclean: str | None = None
    auto_offset_reset: str = DEFAULT_AUTO_OFFSET_RESET
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS
    rebalance_timeout_ms: int = DEFAULT_REBALANCE_TIMEOUT_MS
    consumer_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.bootstrap_servers:
            self._check_connection()
            check_group(self.group_id, self.topics, self.dead_letter_topic, self.auto_offset_reset)
            resolve_on_unclean(self.on_unclean, self.dead_letter_topic)
            check_consumer_options(self.consumer_options)

    def _check_connection(self) -> None:
        problems = []
        if self.security_protocol not in SECURITY_PROTOCOLS:
            problems.append(
                f"security_protocol must be one of {list(SECURITY_PROTOCOLS)}, "
                f"got {self.security_protocol!r}"
            )
        if self.security_protocol.startswith("SASL_"):
            if self.sasl_mechanism not in SASL_MECHANISMS:
                problems.append(
                    f"sasl_mechanism must be one of {list(SASL_MECHANISMS)} with "
                    f"{self.security_protocol}, got {self.sasl_mechanism!r}"
                )
            if not self.sasl_plain_username or self.sasl_plain_password is None:
                problems.append("SASL needs sasl_plain_username and sasl_plain_password")
        if problems:
            raise ProducerConfigError(
                f"Kafka connection to {self.servers_text}: " + "; ".join(problems)
            )

    @property
    def servers_text(self) -> str:
        """``host:port[,host:port]``: where the brokers are."""
        return ",".join(self.bootstrap_servers)

    @property
    def effective_on_unclean(self) -> OnUnclean:
        """``on_unclean``, or its default (``resolve_on_unclean``)."""
        return resolve_on_unclean(self.on_unclean, self.dead_letter_topic)

    def as_kwargs(self) -> dict[str, Any]:
        """The settings as ``KafkaMessageTrigger`` keyword arguments, as its ``serialize()``
        stores them (servers as ``"a:1,b:2"``, None while they come from a connection)."""
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        kwargs["topics"] = list(self.topics)
        kwargs["bootstrap_servers"] = self.servers_text or None
        kwargs["consumer_options"] = dict(self.consumer_options)
        return kwargs

    def digest(self) -> str:
        """Identifies these settings, secrets left out: the messages of a consumer carry it,
        and a watcher whose own settings differ warns (``KafkaMessageTrigger``)."""
        shared = {k: v for k, v in self.as_kwargs().items() if k not in _SECRETS}
        text = json.dumps(shared, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``AIOKafkaConsumer`` / ``AIOKafkaProducer``."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": list(self.bootstrap_servers),
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol.startswith("SASL_"):
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_plain_username
            kwargs["sasl_plain_password"] = self.sasl_plain_password
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kwargs["ssl_context"] = self._ssl_context()
        return kwargs

    def consumer_kwargs(self) -> dict[str, Any]:
        """The consumer's own settings for ``AIOKafkaConsumer`` (besides ``client_kwargs``)."""
        return {
            "max_poll_interval_ms": DEFAULT_MAX_POLL_INTERVAL_MS,
            "fetch_max_wait_ms": DEFAULT_FETCH_MAX_WAIT_MS,
            **check_consumer_options(self.consumer_options),
            "group_id": self.group_id,
            "auto_offset_reset": self.auto_offset_reset,
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
        }

    def _ssl_context(self) -> ssl.SSLContext:
        import ssl

        from aiokafka.helpers import create_ssl_context

        try:
            context: ssl.SSLContext = create_ssl_context(
                cafile=self.ssl_cafile,
                certfile=self.ssl_certfile,
                keyfile=self.ssl_keyfile,
                password=self.ssl_password,
            )
        except (OSError, ssl.SSLError) as exc:
            raise ProducerConfigError(
                f"cannot build the TLS context for Kafka at {self.servers_text} from "
                f"ssl_cafile={self.ssl_cafile!r}, ssl_certfile={self.ssl_certfile!r}, "
                f"ssl_keyfile={self.ssl_keyfile!r}: {exc}; check the files and the key password"
            ) from exc
        return context


def split_servers(bootstrap_servers: str | Sequence[str]) -> tuple[str, ...]:
    """``"a:9092,b:9092"`` or ``["a:9092", "b:9092"]`` as a normalized tuple of host:port."""
    items = (
        bootstrap_servers.split(",") if isinstance(bootstrap_servers, str) else bootstrap_servers
    )
    servers = tuple(dict.fromkeys(item.strip() for item in items if item.strip()))
    if not servers:
        raise ProducerConfigError(
            f"Kafka bootstrap_servers is empty ({bootstrap_servers!r}); give host:port "
            "entries, e.g. 'broker1:9092,broker2:9092'"
        )
    return servers


def check_group(
    group_id: str, topics: Sequence[str], dead_letter_topic: str | None, auto_offset_reset: str
) -> None:
    """Refuse a group that cannot work: no group id or topics, a looping dead-letter topic."""
    if not group_id:
        raise ProducerConfigError("a Kafka shared stream needs a group_id (commits are per group)")
    if not topics:
        raise ProducerConfigError(f"Kafka group {group_id!r}: give at least one topic")
    if dead_letter_topic is not None and dead_letter_topic in topics:
        raise ProducerConfigError(
            f"dead_letter_topic {dead_letter_topic!r} is also a consumed topic; "
            "dead-lettered messages would come back: choose another topic"
        )
    if auto_offset_reset not in OFFSET_RESETS:
        raise ProducerConfigError(
            f"auto_offset_reset must be one of {list(OFFSET_RESETS)}, got {auto_offset_reset!r}"
        )


def resolve_on_unclean(on_unclean: str | None, dead_letter_topic: str | None) -> OnUnclean:
    """The effective policy: explicit, else dead_letter with a topic, else stop."""
    if on_unclean is None:
        return "dead_letter" if dead_letter_topic else "stop"
    if on_unclean not in ON_UNCLEAN_CHOICES:
        raise ProducerConfigError(
            f"on_unclean must be one of {list(ON_UNCLEAN_CHOICES)}, got {on_unclean!r}"
        )
    if on_unclean == "dead_letter" and not dead_letter_topic:
        raise ProducerConfigError(
            'on_unclean="dead_letter" needs dead_letter_topic; set one, or choose "stop" '
            '(redeliver) or "commit" (skip the message) explicitly'
        )
    return cast("OnUnclean", on_unclean)


def check_consumer_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Extra aiokafka consumer options; refuses auto-commit and options the producer owns."""
    if options.get("enable_auto_commit"):
        raise ProducerConfigError(
            "enable_auto_commit=True is refused: the shared-stream ack channel must own what "
            "the broker considers delivered (offsets are committed only once every watcher "
            "processed a message); remove it from consumer_options"
        )
    clashing = sorted(set(options) & _MANAGED_OPTIONS)
    if clashing:
        raise ProducerConfigError(
            f"consumer_options may not set {clashing}: pass them as the trigger's own keyword "
            "arguments"
        )
    return {**options, "enable_auto_commit": False}


# --- a connection (``kafka_config_id``) as trigger kwargs --------------------------------

#: Keys of a Kafka connection's extra (librdkafka's names, as Airflow's Kafka provider
#: stores them, or the trigger's own) -> the trigger kwarg they set.
CONNECTION_EXTRA_KEYS: Final = {
    "bootstrap.servers": "bootstrap_servers",
    "bootstrap_servers": "bootstrap_servers",
    "client.id": "client_id",
    "client_id": "client_id",
    "security.protocol": "security_protocol",
    "security_protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl_mechanism": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl_plain_username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "sasl_plain_password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl_cafile": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl_certfile": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl_keyfile": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl_password": "ssl_password",
}


def settings_from_connection(connection: Mapping[str, Any]) -> dict[str, Any]:
    """``KafkaMessageTrigger`` kwargs from a connection: its extra's client settings
    (``CONNECTION_EXTRA_KEYS``), else ``host[:port]`` as the bootstrap servers and
    ``login`` / ``password`` as the SASL user. Only what the connection defines is set;
    ``ValueError`` when it names no bootstrap server."""
    extra = connection.get("extra") or {}
    settings: dict[str, Any] = {}
    if connection.get("login"):
        settings["sasl_plain_username"] = connection["login"]
    if connection.get("password"):
        settings["sasl_plain_password"] = connection["password"]
    host, port = connection.get("host"), connection.get("port")
    if host:
        settings["bootstrap_servers"] = f"{host}:{port}" if port else host
    for key, value in extra.items():
        name = CONNECTION_EXTRA_KEYS.get(key)
        if name is not None and value not in (None, ""):
            settings[name] = value
    if not settings.get("bootstrap_servers"):
        raise ValueError(
            f"Kafka connection {connection.get('conn_id')!r} names no bootstrap server: set "
            "its host (and port) or 'bootstrap.servers' in its extra"
        )
    return settings
