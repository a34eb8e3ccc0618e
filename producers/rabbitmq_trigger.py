"""``RabbitMQMessageTrigger``: an asset watcher's event trigger on a RabbitMQ queue (ack mode).

Every watcher of one queue shares one ``RabbitMQSharedStreamProducer`` (key: broker or
connection id, and queue). Each trigger filters the shared messages on its own:
``body_filter`` (dotted JSON path -> value, or list of values), ``header_filter`` (AMQP
header -> value(s)) and ``apply_function`` (a dotted path to ``f(message,
*apply_function_args, **apply_function_kwargs)``, given the ``RabbitMQMessage``; may be
async; truthy accepts). All must hold. A filter that raises, or a body that is not a JSON
object under a ``body_filter``, rejects the message (``reject_shared_stream_event()``): the
producer rejects it with ``requeue=False`` to the queue's dead-letter exchange (or, with
``on_reject="requeue"``, puts it back to be delivered again).

One ``TriggerEvent`` per accepted message. Its dedup key is ``rabbitmq:<queue>:<message_id>``
when the publisher set a ``message_id``: a redelivery of it never makes a second asset
event. Without one, AMQP gives a message no stable identity (a delivery tag is per channel,
``redelivered`` is only a flag), so a redelivery is *not* recognised and is stored again;
``dedup="payload"`` keys such messages by the SHA-256 of their body instead (then two
messages with equal bodies are one event). The trigger says so in its log once, at its
first message without an id.

Payload: ``message_id``, ``routing_key``, ``exchange``, ``redelivered``, ``delivery_count``,
``body`` (JSON-decoded when it parses, else text), ``headers`` and ``properties``.

The producer is built from the kwargs of the group's first watcher: give every watcher of a
queue the same connection and producer settings (``declare``, ``queue_arguments``,
``lanes``, ``max_in_flight``, ``max_deliveries``). The URL holds the password: trigger
kwargs are stored encrypted, and the URL is never logged (errors show host, port and
virtual host). ``conn_id`` takes the URL from a named connection instead
(``amqp://user:password@host:5672/vhost`` as a URI; ``connection_settings``): the trigger
row stores only the id and watchers share a consumer by it (key ``("rabbitmq",
"connection:<id>", queue)``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from producers.ack_mode_trigger import AckModeMessageTrigger
from producers.exceptions import ProducerConfigError
from producers.message_filters import (
    MISSING,
    accepts,
    function_path_problem,
    json_body_matches,
)
from producers.partition_keys import (
    PartitionKeyRule,
    field_key,
    function_key,
    named_key,
    partition_key_rule,
    rule_kwargs,
)
from producers.rabbitmq_core import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_PORT,
    DEFAULT_TLS_PORT,
    RabbitMQConnection,
    RabbitMQMessage,
    address_of,
    check_settings,
    dedup_key,
    plain,
)
from triggers.base import classpath_of
from triggers.extras import importing_extra, require_extra

if TYPE_CHECKING:
    from collections.abc import Awaitable, Hashable, Mapping, Sequence

    from producers.rabbitmq import RabbitMQSharedStreamProducer
    from producers.rabbitmq_core import Dedup, Lanes, OnReject

logger = logging.getLogger(__name__)


def url_from_connection(connection: Mapping[str, Any]) -> str:
    """An AMQP URL from a connection's fields: ``conn_type`` ``amqp`` / ``amqps`` (or an
    extra ``ssl: true``), host, port, login, password, schema (the virtual host, or an extra
    ``vhost``); the other extra keys become URL query parameters (``heartbeat``, ...)."""
    extra = dict(connection.get("extra") or {})
    host = connection.get("host")
    if not host:
        raise ValueError("a RabbitMQ connection needs a host")
    tls = connection.get("conn_type") == "amqps" or bool(extra.pop("ssl", False))
    scheme = "amqps" if tls else "amqp"
    port = connection.get("port") or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT)
    vhost = connection.get("schema") or extra.pop("vhost", None) or "/"
    login, password = connection.get("login"), connection.get("password")
    user = ""
    if login:
        user = quote(str(login), safe="")
        if password:
            user += ":" + quote(str(password), safe="")
        user += "@"
    query = f"?{urlencode({k: str(v) for k, v in extra.items()})}" if extra else ""
    return f"{scheme}://{user}{host}:{port}/{quote(str(vhost), safe='')}{query}"


class RabbitMQMessageTrigger(AckModeMessageTrigger[RabbitMQMessage]):
    """Fires for each message of a RabbitMQ queue that passes this trigger's filters.

    ``url`` (``amqp://user:password@host:5672/vhost``) or ``conn_id``; ``queue``: the queue
    to consume; ``declare``: declare it (durable, with ``queue_arguments``, e.g.
    ``{"x-queue-type": "quorum", "x-dead-letter-exchange": "dlx"}``) instead of requiring
    it to exist. ``lanes``: ``"queue"`` (one order) or ``"routing_key"`` (one order per
    routing key). ``max_in_flight``: the channel's prefetch count. ``max_deliveries``: a
    quorum queue's message delivered more times than this is dead-lettered unseen.
    ``on_reject``: ``"dead_letter"`` (``reject(requeue=False)``) or ``"requeue"``
    (delivered again; with ``max_deliveries`` on a quorum queue, dead-lettered in the end).
    ``partition_key_field`` / ``partition_key_header`` / ``partition_key_function``: where
    each event's partition key comes from (a message without a valid key is rejected).
    """

    connection_kwargs = ("conn_id",)
    settled_as = "messages are acknowledged"
    rejected_action = "rabbitmq.message_rejected"

    def __init__(
        self,
        *,
        queue: str,
        url: str | None = None,
        conn_id: str | None = None,
        declare: bool = False,
        queue_arguments: Mapping[str, Any] | None = None,
        body_filter: Mapping[str, Any] | None = None,
        header_filter: Mapping[str, Any] | None = None,
        apply_function: str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        lanes: Lanes = "queue",
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_deliveries: int | None = None,
        dedup: Dedup = "message_id",
        on_reject: OnReject = "dead_letter",
        partition_key_field: str | None = None,
        partition_key_header: str | None = None,
        partition_key_function: str | None = None,
    ) -> None:
        super().__init__()
        require_extra("aio_pika", needed_by="RabbitMQMessageTrigger")
        where = f"RabbitMQMessageTrigger on queue {queue!r}"
        check_settings(
            queue=queue,
            declare=declare,
            queue_arguments=queue_arguments,
            lanes=lanes,
            max_in_flight=max_in_flight,
            max_deliveries=max_deliveries,
            dedup=dedup,
            on_reject=on_reject,
            where=where,
        )
        if url is None and conn_id is None:
            raise ProducerConfigError(f"{where}: give url='amqp://...' or conn_id")
        if problem := function_path_problem(apply_function):
            raise ProducerConfigError(f"{where}: {problem}")
        self.queue = queue
        self.url = url
        self.conn_id = conn_id
        self.declare = declare
        self.queue_arguments = dict(queue_arguments or {})
        self.body_filter = dict(body_filter or {})
        self.header_filter = dict(header_filter or {})
        self.apply_function = apply_function
        self.apply_function_args = list(apply_function_args or ())
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        self.lanes: Lanes = lanes
        self.max_in_flight = max_in_flight
        self.max_deliveries = max_deliveries
        self.dedup: Dedup = dedup
        self.on_reject: OnReject = on_reject
        self.partition_key_rule = partition_key_rule(
            where,
            partition_key_field=partition_key_field,
            partition_key_header=partition_key_header,
            partition_key_function=partition_key_function,
        )
        self._told_no_identity = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            classpath_of(RabbitMQMessageTrigger),
            {
                "queue": self.queue,
                "url": self.url,
                "conn_id": self.conn_id,
                "declare": self.declare,
                "queue_arguments": self.queue_arguments or None,
                "body_filter": self.body_filter or None,
                "header_filter": self.header_filter or None,
                "apply_function": self.apply_function,
                "apply_function_args": self.apply_function_args or None,
                "apply_function_kwargs": self.apply_function_kwargs or None,
                "lanes": self.lanes,
                "max_in_flight": self.max_in_flight,
                "max_deliveries": self.max_deliveries,
                "dedup": self.dedup,
                "on_reject": self.on_reject,
                **rule_kwargs(self.partition_key_rule),
            },
        )

    def __repr__(self) -> str:
        where = f"connection {self.conn_id!r}" if self.conn_id else address_of(self.url or "")
        return f"<RabbitMQMessageTrigger queue={self.queue!r} at {where}>"

    # -- shared stream --------------------------------------------------------------------

    def shared_stream_key(self) -> Hashable:
        if self.conn_id:  # the same before and after the triggerer resolves it
            return ("rabbitmq", f"connection:{self.conn_id}", self.queue)
        return ("rabbitmq", address_of(self.url or ""), self.queue)

    @classmethod
    def connection_settings(cls, kwarg: str, connection: Mapping[str, Any]) -> dict[str, Any]:
        """A connection as the trigger's ``url`` (``url_from_connection``)."""
        return {"url": url_from_connection(connection)}

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> RabbitMQSharedStreamProducer:
        return cls(**kwargs).build_producer()

    def build_producer(self) -> RabbitMQSharedStreamProducer:
        """The queue's producer, with this trigger's connection and producer settings."""
        with importing_extra("RabbitMQMessageTrigger"):
            from producers.rabbitmq import RabbitMQSharedStreamProducer
        if self.url is None:
            raise ProducerConfigError(
                f"{self!r}: connection {self.conn_id!r} was not resolved (the triggerer "
                "resolves conn_id; outside it, pass url=)"
            )
        return RabbitMQSharedStreamProducer(
            RabbitMQConnection(url=self.url, queue=self.queue),
            declare=self.declare,
            queue_arguments=self.queue_arguments,
            lanes=self.lanes,
            max_in_flight=self.max_in_flight,
            max_deliveries=self.max_deliveries,
            on_reject=self.on_reject,
        )

    def _accepted(self, message: RabbitMQMessage) -> bool | Awaitable[bool]:
        """``matches``, then ``apply_function`` (a coroutine only when there is one)."""
        if not self.matches(message):
            return False
        return True if self._function is None else self._function_accepts(message)

    def matches(self, message: RabbitMQMessage) -> bool:
        """True when ``message`` passes ``header_filter`` and ``body_filter``; may raise
        to reject it."""
        for name, expected in self.header_filter.items():
            if not accepts(expected, message.headers.get(name, MISSING)):
                return False
        if not self.body_filter:
            return True
        what = f"message {message.message_id} of queue {self.queue!r}"
        return json_body_matches(self.body_filter, message.body, what)

    @staticmethod
    def event_payload(message: RabbitMQMessage) -> dict[str, Any]:
        return {
            "message_id": message.message_id,
            "routing_key": message.routing_key,
            "exchange": message.exchange,
            "redelivered": message.redelivered,
            "delivery_count": message.delivery_count,
            "body": plain(message.body),
            "headers": dict(message.headers),
            "properties": dict(message.properties),
        }

    def _dedup_key(self, message: RabbitMQMessage) -> str | None:
        key = dedup_key(message, self.dedup)
        if not message.message_id and not self._told_no_identity:
            self._told_no_identity = True
            logger.warning(
                "RabbitMQMessageTrigger %s: messages of queue %r come without a message_id; %s",
                self.trigger_id,
                self.queue,
                "they are deduplicated by a digest of their body (dedup='payload'): equal "
                "bodies make one asset event"
                if self.dedup == "payload"
                else "a redelivery of such a message (after a crash or a failed delivery) "
                "is not recognised and makes a second asset event. Have the publisher set "
                "message_id, or pass dedup='payload'",
                extra={"action": "rabbitmq.no_message_id", "trigger_id": self.trigger_id},
            )
        return key

    def _partition_key(self, message: RabbitMQMessage, rule: PartitionKeyRule) -> str:
        if rule.source == "field":
            return field_key(message.body, rule, document_name="the body")
        if rule.source == "header":
            return named_key(message.headers, rule, "header")
        assert self._key_function is not None, "loaded as the stream starts"
        return function_key(self._key_function, message)

    def _rejected_what(self, message: Any) -> tuple[str, dict[str, Any]]:
        message_id = getattr(message, "message_id", None)
        return f"message {message_id} of queue {self.queue!r}", {"message_id": message_id}
