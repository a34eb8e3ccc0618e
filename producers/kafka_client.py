"""What the Kafka producer and trigger share: connection settings and messages.

``KafkaConnection`` holds the connection and security settings (secrets are hidden from
``repr``); ``KafkaMessage`` is one consumed record (a plain object, so filters are testable
without a broker), and ``KafkaMessageBatch`` the consecutive messages of one partition that
a Kafka shared stream fans out as one raw event (see ``producers.kafka``). Nothing here
imports aiokafka but ``KafkaConnection.client_kwargs``, which builds a client's settings.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from producers.exceptions import ProducerConfigError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_CLIENT_ID: Final = "sluice"


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


@dataclass(frozen=True, slots=True)
class KafkaConnection:
    """How to reach the brokers: servers, client id and security (passed to aiokafka).

    ``security_protocol``: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL. SASL needs
    ``sasl_mechanism`` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) with a user name and password;
    SSL uses the optional CA / certificate / key files. Secrets never show in ``repr``.
    """

    bootstrap_servers: tuple[str, ...]
    client_id: str = DEFAULT_CLIENT_ID
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
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
                f"Kafka connection to {','.join(self.bootstrap_servers)}: " + "; ".join(problems)
            )

    @property
    def servers_text(self) -> str:
        return ",".join(self.bootstrap_servers)

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

    def _ssl_context(self) -> ssl.SSLContext:
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


class KafkaOffset(NamedTuple):
    """The broker payload of a Kafka raw event: ``(topic, partition, offset)``."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a subscriber rejected a message (carried to the dead-letter headers)."""

    trigger_id: int | None
    reason: str


@dataclass(slots=True, eq=False)
class KafkaMessage:
    """One consumed record, as every subscriber of a Kafka shared stream receives it.

    ``headers`` keep the record's order (names may repeat). The same object goes to every
    subscriber: treat it as read-only, except through ``note_rejection`` (dead-letter
    headers) and ``cache`` (decoded forms, computed once for all subscribers).
    ``settings_digest`` identifies the settings the shared consumer was built from.

    Read-only by contract, not ``frozen``: one is built per consumed record, and a frozen
    dataclass's ``__init__`` (``object.__setattr__`` per field) cost ~4 us of the event
    loop's time per record, five times the plain one.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None
    settings_digest: str = field(default="", repr=False)
    rejections: tuple[Rejection, ...] = field(default=(), repr=False)  # rare: no list each
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def coordinates(self) -> str:
        """``topic/partition/offset``, for logs and headers."""
        return f"{self.topic}/{self.partition}/{self.offset}"

    def note_rejection(self, trigger_id: int | None, reason: str) -> None:
        """Record that ``trigger_id`` rejected this message and why."""
        self.rejections = (*self.rejections, Rejection(trigger_id, reason))


class KafkaMessageBatch:
    """Consecutive messages of one partition, fetched together: one raw event of a Kafka
    shared stream in batch mode (``producers.kafka``), fanned out, resolved and advanced as
    one. Its broker payload is the ``KafkaOffset`` of its last message.

    Read-only by contract, as its messages are: every subscriber receives the same object.
    A subscriber refuses one message of it with ``message.note_rejection``, not with
    ``reject_shared_stream_event()`` (which would refuse the whole batch).
    """

    __slots__ = ("messages", "partition", "topic")

    def __init__(self, topic: str, partition: int, messages: Sequence[KafkaMessage]) -> None:
        if not messages:
            raise ValueError(f"a KafkaMessageBatch of {topic}/{partition} needs messages")
        self.topic = topic
        self.partition = partition
        self.messages = messages

    @property
    def last_offset(self) -> int:
        """The offset of its last message (its advance commits the next one)."""
        return self.messages[-1].offset

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[KafkaMessage]:
        return iter(self.messages)

    def __repr__(self) -> str:
        first = self.messages[0].offset
        return (
            f"<KafkaMessageBatch {self.topic}/{self.partition} offsets {first}..{self.last_offset}"
            f" ({len(self.messages)} messages)>"
        )


def message_from_record(record: Any, settings_digest: str = "") -> KafkaMessage:
    """A ``KafkaMessage`` from an aiokafka ``ConsumerRecord``."""
    headers = record.headers
    return KafkaMessage(
        record.topic,
        record.partition,
        record.offset,
        record.key,
        record.value,
        tuple(headers) if headers else (),
        record.timestamp,
        settings_digest,
    )
