"""``NatsJetStreamTrigger``: an asset watcher's event trigger on a NATS JetStream stream.

Every watcher of one durable consumer shares one ``NatsJetStreamSharedStreamProducer`` (key:
servers or connection, stream, durable): one pull consumer, acked only once every watcher
stored its events. Each trigger filters the shared messages (``body_filter``,
``header_filter``, ``apply_function``) and fires one ``TriggerEvent`` per accepted message,
deduplicated by ``nats:<stream>:<stream sequence>``. A filter that raises rejects the
message (``reject_shared_stream_event()``): with ``on_reject="term"`` (the default) it goes
to ``dead_letter_subject`` (if set), then is terminated; with ``on_reject="nak"`` it is
redelivered, up to ``max_deliver``, and dead-lettered on its last delivery.

The producer is built from the kwargs of the group's first watcher: give every watcher of a
durable the same connection and consumer settings (``subjects``, ``ack_wait_s``,
``max_deliver``, ``dead_letter_subject``, ``on_reject``, ``max_in_flight``,
``deliver_policy``).
Credentials are trigger kwargs, so the engine stores them encrypted; they are never logged.

``conn_id`` takes the servers and credentials from a named connection instead (its URI form
``nats://user:password@host:4222``; the extra may hold ``servers``, a list or a
comma-separated text, ``token``, and ``tls: true`` for ``tls://``): the trigger row stores
only the id, the triggerer resolves it. Watchers then share a consumer by connection id.

An event may carry a partition key: ``partition_key_field`` (a dotted path into the JSON
body), ``partition_key_header`` (a header) or ``partition_key_function``
(``producers.partition_keys``). A message the filter accepts but that gives no valid key
is rejected, with a warning naming its sequence.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import TYPE_CHECKING, Any

from producers.exceptions import EventFilterError, ProducerConfigError
from producers.nats_core import (
    DEFAULT_ACK_WAIT_S,
    DEFAULT_MAX_DELIVER,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_SERVERS,
    DeliverPolicy,
    NatsConnection,
    NatsMessage,
    OnReject,
    check_settings,
)
from producers.partition_keys import (
    NoKey,
    PartitionKeyRule,
    field_key,
    function_key,
    is_dotted_path,
    load_key_function,
    named_key,
    partition_key_rule,
    rejection,
    rule_kwargs,
)
from triggers.base import BaseEventTrigger, TriggerEvent, classpath_of
from triggers.exceptions import TriggerContractError
from triggers.extras import importing_extra, require_extra

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence

    from producers.nats import NatsJetStreamSharedStreamProducer

logger = logging.getLogger(__name__)

_MISSING = object()


def _as_list(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return [str(part) for part in value]


def _lookup(document: Any, path: str) -> Any:
    node = document
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _options(expected: Any) -> list[Any]:
    return expected if isinstance(expected, list) else [expected]


def _body_accepts(expected: Any, actual: Any) -> bool:
    """JSON equality (``true`` is not ``1``) with ``expected`` or one of its list."""
    return any(
        actual == option and isinstance(actual, bool) == isinstance(option, bool)
        for option in _options(expected)
    )


def _header_accepts(expected: Any, actual: str) -> bool:
    """Headers are text: a number or a bool given in the filter compares as its text."""
    return any(
        actual == (str(option).lower() if isinstance(option, bool) else str(option))
        for option in _options(expected)
    )


class NatsJetStreamTrigger(BaseEventTrigger):
    """Fires for each message of a JetStream stream that passes this trigger's filters.

    ``body_filter``: dotted field path -> required value (or list of accepted values) of the
    JSON body; a message whose body is not a JSON object is rejected by a trigger that has
    one. ``header_filter``: header name -> required value(s). ``apply_function``: dotted
    path of ``f(message, *apply_function_args, **apply_function_kwargs)`` (a
    ``NatsMessage``; may be async) returning truthy to fire. All given must hold.
    Payload: ``stream``, ``sequence``, ``subject``, ``body``, ``headers``,
    ``num_delivered``, ``published_at``.
    """

    connection_kwargs = ("conn_id",)

    def __init__(
        self,
        *,
        stream: str,
        durable: str,
        subjects: str | Sequence[str] | None = None,
        servers: str | Sequence[str] = DEFAULT_SERVERS,
        conn_id: str | None = None,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        create_stream: bool = False,
        stream_subjects: str | Sequence[str] | None = None,
        ack_wait_s: float = DEFAULT_ACK_WAIT_S,
        max_deliver: int = DEFAULT_MAX_DELIVER,
        dead_letter_subject: str | None = None,
        on_reject: OnReject = "term",
        deliver_policy: DeliverPolicy = "all",
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        body_filter: Mapping[str, Any] | None = None,
        header_filter: Mapping[str, Any] | None = None,
        apply_function: str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        partition_key_field: str | None = None,
        partition_key_header: str | None = None,
        partition_key_function: str | None = None,
    ) -> None:
        super().__init__()
        require_extra("nats", needed_by="NatsJetStreamTrigger")
        where = f"NatsJetStreamTrigger on stream {stream!r}"
        self.subjects = _as_list(subjects)
        self.stream_subjects = _as_list(stream_subjects)
        check_settings(
            stream=stream,
            durable=durable,
            subjects=self.subjects,
            create_stream=create_stream,
            stream_subjects=self.stream_subjects,
            ack_wait_s=ack_wait_s,
            max_deliver=max_deliver,
            dead_letter_subject=dead_letter_subject,
            on_reject=on_reject,
            max_in_flight=max_in_flight,
            deliver_policy=deliver_policy,
            where=where,
        )
        if apply_function is not None and not is_dotted_path(apply_function):
            raise ProducerConfigError(
                f"{where}: apply_function must be a dotted path 'package.module.function', "
                f"got {apply_function!r}"
            )
        self.stream = stream
        self.durable = durable
        self.conn_id = conn_id
        self.connection = NatsConnection(tuple(_as_list(servers)), user, password, token)
        if not self.connection.servers:
            raise ProducerConfigError(f"{where}: servers is empty")
        self.create_stream = create_stream
        self.ack_wait_s = ack_wait_s
        self.max_deliver = max_deliver
        self.dead_letter_subject = dead_letter_subject
        self.on_reject: OnReject = on_reject
        self.deliver_policy: DeliverPolicy = deliver_policy
        self.max_in_flight = max_in_flight
        self.body_filter = dict(body_filter or {})
        self.header_filter = dict(header_filter or {})
        self.apply_function = apply_function
        self.apply_function_args = list(apply_function_args or ())
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        self.partition_key_rule = partition_key_rule(
            where,
            partition_key_field=partition_key_field,
            partition_key_header=partition_key_header,
            partition_key_function=partition_key_function,
        )
        self._function: Callable[..., Any] | None = None
        self._key_function: Callable[[Any], Any] | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        c = self.connection
        return (
            classpath_of(NatsJetStreamTrigger),
            {
                "stream": self.stream,
                "durable": self.durable,
                "subjects": self.subjects or None,
                "servers": list(c.servers),
                "conn_id": self.conn_id,
                "user": c.user,
                "password": c.password,
                "token": c.token,
                "create_stream": self.create_stream,
                "stream_subjects": self.stream_subjects or None,
                "ack_wait_s": self.ack_wait_s,
                "max_deliver": self.max_deliver,
                "dead_letter_subject": self.dead_letter_subject,
                "on_reject": self.on_reject,
                "deliver_policy": self.deliver_policy,
                "max_in_flight": self.max_in_flight,
                "body_filter": self.body_filter or None,
                "header_filter": self.header_filter or None,
                "apply_function": self.apply_function,
                "apply_function_args": self.apply_function_args or None,
                "apply_function_kwargs": self.apply_function_kwargs or None,
                **rule_kwargs(self.partition_key_rule),
            },
        )

    # -- shared stream --------------------------------------------------------------------

    def shared_stream_key(self) -> Hashable:
        if self.conn_id:  # the same before and after the triggerer resolves it
            return ("nats", f"connection:{self.conn_id}", self.stream, self.durable)
        return ("nats", self.connection.address, self.stream, self.durable)

    @classmethod
    def connection_settings(cls, kwarg: str, connection: Mapping[str, Any]) -> dict[str, Any]:
        """A ``nats`` connection as client settings: ``host[:port]`` (or the extra's
        ``servers``), ``login`` / ``password`` as the user, the extra's ``token``."""
        extra = dict(connection.get("extra") or {})
        scheme = "tls" if str(extra.get("tls", "")).lower() in ("true", "1") else "nats"
        servers = _as_list(extra.get("servers"))
        host, port = connection.get("host"), connection.get("port")
        if not servers and host:
            host = str(host)
            address = host if "://" in host else f"{scheme}://{host}"
            servers = [f"{address}:{port}" if port else address]
        if not servers:
            raise ValueError(
                f"NATS connection {connection.get('conn_id')!r} names no server: set its host "
                "(and port) or 'servers' in its extra"
            )
        settings = {
            "servers": servers,
            "user": connection.get("login"),
            "password": connection.get("password"),
            "token": extra.get("token"),
        }
        return {k: v for k, v in settings.items() if v not in (None, "")}

    @classmethod
    def create_shared_stream_producer(
        cls, kwargs: dict[str, Any]
    ) -> NatsJetStreamSharedStreamProducer:
        return cls(**kwargs).build_producer()

    def build_producer(self) -> NatsJetStreamSharedStreamProducer:
        """The durable consumer's producer, with this trigger's connection and settings."""
        with importing_extra("NatsJetStreamTrigger"):
            from producers.nats import NatsJetStreamSharedStreamProducer
        return NatsJetStreamSharedStreamProducer(
            self.connection,
            stream=self.stream,
            durable=self.durable,
            subjects=self.subjects,
            create_stream=self.create_stream,
            stream_subjects=self.stream_subjects,
            ack_wait_s=self.ack_wait_s,
            max_deliver=self.max_deliver,
            dead_letter_subject=self.dead_letter_subject,
            on_reject=self.on_reject,
            max_in_flight=self.max_in_flight,
            deliver_policy=self.deliver_policy,
        )

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        from shared_stream.subscriber import reject_shared_stream_event  # where it runs

        self._load_functions()
        rule = self.partition_key_rule
        async for message in shared_stream:
            try:
                matched = await self.matches(message)
            except Exception as exc:  # noqa: BLE001 - a filter that raises rejects the message
                self._log_rejected(message, f"its filter raised {exc!r}")
                reject_shared_stream_event()
                continue
            if not matched:
                continue
            key = None
            if rule is not None:
                try:
                    key = self._partition_key(message, rule)
                except NoKey as problem:
                    self._log_rejected(message, rejection(rule, problem))
                    reject_shared_stream_event()
                    continue
            yield TriggerEvent(
                self.event_payload(message), dedup_key=message.dedup_key, partition_key=key
            )

    def _load_functions(self) -> None:
        rule = self.partition_key_rule
        if rule is not None and rule.source == "function" and self._key_function is None:
            self._key_function = load_key_function(rule, self.trigger_id)
        path = self.apply_function
        if path is None or self._function is not None:
            return
        module_name, _, name = path.rpartition(".")
        try:
            function = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as exc:
            raise ProducerConfigError(
                f"trigger {self.trigger_id}: cannot import apply_function {path!r}: {exc}; "
                "check the dotted path and that its module is importable by the triggerer"
            ) from exc
        if not callable(function):
            raise ProducerConfigError(
                f"trigger {self.trigger_id}: apply_function {path!r} is not callable"
            )
        self._function = function

    def _partition_key(self, message: NatsMessage, rule: PartitionKeyRule) -> str:
        if rule.source == "field":
            return field_key(message.body, rule, document_name="the body")
        if rule.source == "header":
            return named_key(message.headers, rule, "header")
        assert self._key_function is not None, "loaded as the stream starts"
        return function_key(self._key_function, message)

    async def matches(self, message: NatsMessage) -> bool:
        """True when ``message`` passes this trigger's filters; may raise to reject it."""
        for name, expected in self.header_filter.items():
            actual = message.headers.get(name)
            if actual is None or not _header_accepts(expected, actual):
                return False
        if self.body_filter and not self._body_matches(message):
            return False
        if self._function is None:
            return True
        verdict = self._function(message, *self.apply_function_args, **self.apply_function_kwargs)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return bool(verdict)

    def _body_matches(self, message: NatsMessage) -> bool:
        if not isinstance(message.body, dict):
            raise EventFilterError(
                f"message {message.dedup_key} on {message.subject} has a body that is not a "
                f"JSON object; body_filter {sorted(self.body_filter)} cannot apply"
            )
        return all(
            (actual := _lookup(message.body, path)) is not _MISSING
            and _body_accepts(expected, actual)
            for path, expected in self.body_filter.items()
        )

    @staticmethod
    def event_payload(message: NatsMessage) -> dict[str, Any]:
        return {
            "stream": message.stream,
            "sequence": message.sequence,
            "subject": message.subject,
            "body": message.body,
            "headers": dict(message.headers),
            "num_delivered": message.num_delivered,
            "published_at": message.published_at,
        }

    def _log_rejected(self, message: Any, reason: str) -> None:
        identity = getattr(message, "dedup_key", None)
        logger.warning(
            "NatsJetStreamTrigger %s rejected message %s: %s",
            self.trigger_id,
            identity,
            reason,
            extra={
                "action": "nats.message_rejected",
                "trigger_id": self.trigger_id,
                "message_id": identity,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        raise TriggerContractError(
            f"{classpath_of(self)} runs only as a shared-stream subscriber (ack mode): its "
            "messages are acked once their asset events are stored, which run() cannot do"
        )
        yield  # pragma: no cover - makes this an async generator
