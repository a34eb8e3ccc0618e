"""``KafkaMessageTrigger``: an asset-watcher trigger that fires for Kafka messages.

Every watcher on the same ``(bootstrap servers, group id, topics)`` shares one consumer (its
``shared_stream_key``) through ``KafkaSharedStreamProducer``, in ack mode: offsets are
committed only once every watcher processed a message and the asset events it caused are
stored. Each watcher filters the shared messages on its own:

- ``match_key`` / ``match_headers`` / ``match_fields``: equality on the key, on header values
  (UTF-8 text) and on fields of a JSON value (dotted paths, ``"order.status"``);
- ``apply_function``: a dotted path to ``f(message, *apply_function_args,
  **apply_function_kwargs)`` (a ``KafkaMessage``; may be async) returning truthy to accept.

An accepted message's event may carry a partition key taken from the message
(``partition_key_field``, ``partition_key_header``, ``partition_key_from_key`` or
``partition_key_function``; ``producers.partition_keys``). A message that gives no valid
key is rejected, so a keyed watcher needs a ``dead_letter_topic`` or an explicit
``on_unclean``: with the implicit ``"stop"`` its partition would stop at that message.

A message the filter does not accept yields nothing (the watcher has processed it). A filter
that raises, or a value that does not decode as ``value_format`` (``"json"`` / ``"text"``),
*rejects* the message (``message.note_rejection``): it goes the dead-letter path of
``on_unclean`` (see ``producers.kafka``) and the watcher keeps running.

The shared consumer runs in batch mode: each raw event its watchers receive is a
``KafkaMessageBatch`` (consecutive messages of one partition), judged message by message, so
the shared-stream machinery works once per batch while every message still fires its own
event and is rejected on its own. A subclass that overrides ``filter_shared_stream`` still
receives single ``KafkaMessage`` items, as before, and shares the consumer of its siblings:
its filter is fed the messages of each batch one by one (``producers.kafka_message_feed``), and
its ``reject_shared_stream_event()`` refuses the message it is judging, not its batch.

One ``TriggerEvent`` per accepted message, deduplicated by ``kafka:<topic>:<partition>:<offset>``
(a redelivery never makes a second asset event). Payload: ``topic``, ``partition``,
``offset``, ``timestamp`` (ms), ``key``, ``headers`` (``[[name, value], ...]``), ``value`` and
``value_encoding`` (``json`` / ``text`` / ``base64`` / ``null``). Keys and header values are
text when they are UTF-8, else ``{"base64": ...}``.

The consumer, group and dead-letter settings of a group come from its first watcher: siblings
must agree on them (a watcher whose settings differ logs a warning). Secrets
(``sasl_plain_password``, ``ssl_password``) are trigger kwargs, stored encrypted and never
logged.

``kafka_config_id`` (Airflow's name) takes the connection settings from a named connection
instead (``sluice connections add``; ``producers.kafka_settings.settings_from_connection``):
the trigger row then stores only the id, and the triggerer resolves it when it builds the
trigger; what the connection defines wins over the trigger's own kwargs. Watchers share a
consumer by connection id (key ``("kafka", "connection:<id>", group, topics)``).
"""

from __future__ import annotations

import inspect
import logging
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Final

from producers.exceptions import ProducerConfigError
from producers.kafka_codec import (
    VALUE_FORMATS,
    Undecodable,
    decoded_value,
    message_event,
    text_of,
)
from producers.kafka_event_keys import kafka_key_rule, partition_key_of
from producers.kafka_message_feed import fed_message_by_message
from producers.kafka_messages import KafkaMessage, KafkaMessageBatch
from producers.kafka_settings import (
    DEFAULT_AUTO_OFFSET_RESET,
    DEFAULT_BATCH_MESSAGES,
    DEFAULT_CLIENT_ID,
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_REBALANCE_TIMEOUT_MS,
    DEFAULT_SESSION_TIMEOUT_MS,
    KafkaSettings,
    settings_from_connection,
    split_servers,
)
from producers.message_filters import function_path_problem, load_apply_function
from producers.partition_keys import NoKey, load_key_function, rejection, rule_kwargs
from shared_stream.producer import AdvanceItem, AdvanceOutcome
from triggers.base import BaseEventTrigger, TriggerEvent, classpath_of
from triggers.extras import importing_extra, require_extra

if TYPE_CHECKING:
    from collections.abc import (
        AsyncIterator,
        Awaitable,
        Callable,
        Coroutine,
        Hashable,
        Mapping,
        Sequence,
    )

    from producers.kafka import KafkaSharedStreamProducer

logger = logging.getLogger(__name__)

_ABSENT: Final = object()
# Messages a watcher judges from its queue of batches before it lets the event loop run.
YIELD_EVERY_MESSAGES: Final = 2_000
_ACCEPTED: Final = AdvanceOutcome(acked=1, failed=0)
_REJECTED: Final = AdvanceOutcome(acked=0, failed=0, rejected=1)


class KafkaMessageTrigger(BaseEventTrigger):
    """Fires one event per Kafka message of ``topics`` this watcher's filter accepts."""

    connection_kwargs = ("kafka_config_id",)

    def __init__(
        self,
        *,
        topics: str | Sequence[str],
        group_id: str,
        bootstrap_servers: str | Sequence[str] | None = None,
        kafka_config_id: str | None = None,
        apply_function: str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        match_key: str | None = None,
        match_headers: Mapping[str, str] | None = None,
        match_fields: Mapping[str, Any] | None = None,
        value_format: str = "auto",
        dead_letter_topic: str | None = None,
        on_unclean: str | None = None,
        auto_offset_reset: str = DEFAULT_AUTO_OFFSET_RESET,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        rebalance_timeout_ms: int = DEFAULT_REBALANCE_TIMEOUT_MS,
        client_id: str = DEFAULT_CLIENT_ID,
        security_protocol: str = "PLAINTEXT",
        sasl_mechanism: str | None = None,
        sasl_plain_username: str | None = None,
        sasl_plain_password: str | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        ssl_password: str | None = None,
        consumer_options: Mapping[str, Any] | None = None,
        partition_key_field: str | None = None,
        partition_key_header: str | None = None,
        partition_key_from_key: bool = False,
        partition_key_function: str | None = None,
    ) -> None:
        super().__init__()
        require_extra("aiokafka", needed_by="KafkaMessageTrigger")
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names or not all(isinstance(t, str) and t for t in names):
            raise ProducerConfigError(
                f"KafkaMessageTrigger topics must be topic names, got {topics!r}"
            )
        if value_format not in VALUE_FORMATS:
            raise ProducerConfigError(
                f"KafkaMessageTrigger value_format must be one of {list(VALUE_FORMATS)}, "
                f"got {value_format!r}"
            )
        if not bootstrap_servers and not kafka_config_id:
            raise ProducerConfigError(
                "KafkaMessageTrigger needs bootstrap_servers or a kafka_config_id connection"
            )
        if problem := function_path_problem(apply_function):
            raise ProducerConfigError(f"KafkaMessageTrigger {problem}")
        # Checked now, unless the servers come from the connection: the triggerer looks it up
        # and builds the trigger again with its settings.
        self.settings = KafkaSettings(
            topics=tuple(sorted(dict.fromkeys(names))),
            group_id=group_id,
            bootstrap_servers=split_servers(bootstrap_servers) if bootstrap_servers else (),
            client_id=client_id,
            security_protocol=security_protocol,
            sasl_mechanism=sasl_mechanism,
            sasl_plain_username=sasl_plain_username,
            sasl_plain_password=sasl_plain_password,
            ssl_cafile=ssl_cafile,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            ssl_password=ssl_password,
            dead_letter_topic=dead_letter_topic,
            on_unclean=on_unclean,
            auto_offset_reset=auto_offset_reset,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            consumer_options=dict(consumer_options or {}),
        )
        self.kafka_config_id = kafka_config_id
        self.partition_key_rule = kafka_key_rule(
            self.settings,
            partition_key_field=partition_key_field,
            partition_key_header=partition_key_header,
            partition_key_from_key=partition_key_from_key,
            partition_key_function=partition_key_function,
        )
        self._key_function: Callable[[Any], Any] | None = None
        # What this watcher accepts: its own, never shared with its siblings.
        self._filter: dict[str, Any] = {
            "apply_function": apply_function,
            "apply_function_args": list(apply_function_args or ()),
            "apply_function_kwargs": dict(apply_function_kwargs or {}),
            "match_key": match_key,
            "match_headers": dict(match_headers or {}),
            "match_fields": dict(match_fields or {}),
            "value_format": value_format,
        }
        self.topics: tuple[str, ...] = self.settings.topics
        self.group_id = group_id
        self.value_format = value_format
        self._function: Callable[..., Any] | None = None
        self._digest_checked = False
        self._key_or_headers = match_key is not None or bool(self._filter["match_headers"])
        # match_fields as (path parts, expected): split once, not for every message.
        self._fields: tuple[tuple[tuple[str, ...], Any], ...] = tuple(
            (tuple(path.split(".")), expected)
            for path, expected in self._filter["match_fields"].items()
        )
        # ... and, when no path is dotted (the usual case), as (name, expected) pairs that
        # one dict lookup each checks: every watcher of a shared stream judges every message.
        self._top_fields: tuple[tuple[str, Any], ...] | None = (
            tuple((parts[0], expected) for parts, expected in self._fields)
            if all(len(parts) == 1 for parts, _ in self._fields)
            else None
        )

    # -- the contract ---------------------------------------------------------------------

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {**self.settings.as_kwargs(), "kafka_config_id": self.kafka_config_id}
        return classpath_of(self), {
            **kwargs,
            **self._filter,
            **rule_kwargs(self.partition_key_rule),
        }

    def shared_stream_key(self) -> Hashable | None:
        # by connection id: the key is the same before (parse) and after (triggerer) the
        # connection is resolved
        config_id = self.kafka_config_id
        where = f"connection:{config_id}" if config_id else self.settings.servers_text
        return ("kafka", where, self.group_id, self.topics)

    @classmethod
    def connection_settings(cls, kwarg: str, connection: Mapping[str, Any]) -> dict[str, Any]:
        return settings_from_connection(connection)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("filter_shared_stream")
        if own is not None and not getattr(own, "fed_message_by_message", False):
            cls.filter_shared_stream = fed_message_by_message(own)  # type: ignore[method-assign,assignment]

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> KafkaSharedStreamProducer:
        return cls(**kwargs)._producer(batched=True)

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        """Judge every message of every raw event (a ``KafkaMessageBatch``, or a single
        ``KafkaMessage`` when a subclass's filter hands its messages on): an event for each
        accepted one."""
        import anyio.lowlevel  # where it runs (the triggerer), not where a DAG file imports

        self._load_function()
        verdict_of = self._verdict
        judged = 0
        async for raw in shared_stream:
            batched = type(raw) is KafkaMessageBatch
            if batched and judged >= YIELD_EVERY_MESSAGES:
                # A queue of batches is judged without a wait otherwise: let the loop run.
                judged = 0
                await anyio.lowlevel.checkpoint()
            messages = raw.messages if batched else (raw,)
            judged += len(messages)
            for message in messages:
                verdict = verdict_of(message)
                if verdict is None:  # the usual verdict of a filtered watcher
                    continue
                if not isinstance(verdict, (TriggerEvent, str)):
                    verdict = await verdict  # an async apply_function
                if isinstance(verdict, TriggerEvent):
                    yield verdict
                elif verdict is not None:
                    # Refuses this message only; its batch's others stay clean (the
                    # producer dead-letters what was noted, ``producers.kafka``).
                    message.note_rejection(self.trigger_id, verdict)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Alone, without the shared-stream manager: commits each message once moved past.

        There is no persistence gate here (the triggerer always uses the shared stream):
        a message is committed when the caller asks for the next event.
        """
        self._load_function()
        producer = self._producer(batched=False)
        try:
            async with aclosing(producer.open_stream()) as stream:
                async for message, offset in stream:
                    assert isinstance(message, KafkaMessage)  # a per-message producer's
                    verdict = await self._evaluate(message)
                    outcome = _ACCEPTED
                    if isinstance(verdict, TriggerEvent):
                        yield verdict
                    elif verdict is not None:
                        message.note_rejection(self.trigger_id, verdict)
                        outcome = _REJECTED
                    await producer.advance([AdvanceItem(offset, outcome)])
        finally:
            await producer.aclose()

    # -- filtering ------------------------------------------------------------------------

    async def _evaluate(self, message: KafkaMessage) -> TriggerEvent | str | None:
        """The event to fire, None to skip the message, or why it is rejected."""
        verdict = self._verdict(message)
        if verdict is None or isinstance(verdict, (TriggerEvent, str)):
            return verdict
        return await verdict

    def _verdict(
        self, message: KafkaMessage
    ) -> TriggerEvent | str | Coroutine[Any, Any, TriggerEvent | str | None] | None:
        """``_evaluate`` without a coroutine per message (every watcher of a shared stream
        judges every message): a coroutine to await only for an async ``apply_function``."""
        if not self._digest_checked:
            self._check_digest(message)
        decoded = message.cache.get(self.value_format)  # decoded once for every watcher
        if decoded is None:
            decoded = decoded_value(message, self.value_format)
        if isinstance(decoded, Undecodable):
            logger.warning(
                "Trigger %s rejected Kafka message %s: %s",
                self.trigger_id,
                message.coordinates,
                decoded.reason,
                extra={"action": "kafka.undecodable", "trigger_id": self.trigger_id},
            )
            return decoded.reason
        if not self._matches(message, decoded[0], decoded[1]):
            return None
        if self._function is not None:
            try:
                accepted = self._call_function(message)
            except Exception as exc:  # noqa: BLE001 - user filter: its error rejects the message
                return self._filter_failed(message, exc)
            if inspect.isawaitable(accepted):
                return self._accepted_later(message, accepted)
            if not accepted:
                return None
        return self._event(message)

    async def _accepted_later(
        self, message: KafkaMessage, pending: Awaitable[Any]
    ) -> TriggerEvent | str | None:
        try:
            accepted = await pending
        except Exception as exc:  # noqa: BLE001 - user filter: its error rejects the message
            return self._filter_failed(message, exc)
        return self._event(message) if accepted else None

    def _event(self, message: KafkaMessage) -> TriggerEvent | str:
        """The accepted message's event, or why it is rejected (it gives no valid key)."""
        rule = self.partition_key_rule
        if rule is None:
            return message_event(message, self.value_format)
        try:
            key = partition_key_of(message, rule, self.value_format, self._key_function)
        except NoKey as problem:
            reason = rejection(rule, problem)
            logger.warning(
                "Trigger %s rejected Kafka message %s: %s; it takes the on_unclean path and "
                "the watcher goes on",
                self.trigger_id,
                message.coordinates,
                reason,
                extra={"action": "kafka.no_partition_key", "trigger_id": self.trigger_id},
            )
            return reason
        return message_event(message, self.value_format, partition_key=key)

    def _matches(self, message: KafkaMessage, encoding: str, value: Any) -> bool:
        if self._key_or_headers and not self._key_and_headers_match(message):
            return False
        if not self._fields:
            return True
        if encoding != "json" or not isinstance(value, dict):
            return False
        top = self._top_fields
        if top is None:
            return self._fields_match(value)
        for name, expected in top:
            found = value.get(name, _ABSENT)
            if found is _ABSENT or found != expected:
                return False
        return True

    def _key_and_headers_match(self, message: KafkaMessage) -> bool:
        kw = self._filter
        match_key = kw["match_key"]
        if match_key is not None and text_of(message.key) != match_key:
            return False
        for name, expected in kw["match_headers"].items():
            if not any(h == name and text_of(v) == expected for h, v in message.headers):
                return False
        return True

    def _fields_match(self, value: dict[str, Any]) -> bool:
        for parts, expected in self._fields:
            current: Any = value
            for part in parts:
                if not isinstance(current, dict) or part not in current:
                    return False
                current = current[part]
            if current != expected:
                return False
        return True

    def _call_function(self, message: KafkaMessage) -> Any:
        assert self._function is not None
        kw = self._filter
        return self._function(message, *kw["apply_function_args"], **kw["apply_function_kwargs"])

    def _filter_failed(self, message: KafkaMessage, exc: Exception) -> str:
        logger.error(
            "Trigger %s: apply_function %s raised on Kafka message %s: %r; the message is "
            "rejected (dead-letter path) and the watcher keeps running",
            self.trigger_id,
            self._filter["apply_function"],
            message.coordinates,
            exc,
            exc_info=exc,
            extra={"action": "kafka.filter_failed", "trigger_id": self.trigger_id},
        )
        return f"apply_function raised {type(exc).__name__}: {exc}"

    def _load_function(self) -> None:
        rule = self.partition_key_rule
        if rule is not None and rule.source == "function" and self._key_function is None:
            self._key_function = load_key_function(rule, self.trigger_id)
        path = self._filter["apply_function"]
        if path is not None and self._function is None:
            self._function = load_apply_function(path, self.trigger_id)

    def _check_digest(self, message: KafkaMessage) -> None:
        self._digest_checked = True
        if message.settings_digest and message.settings_digest != self.settings.digest():
            logger.warning(
                "Trigger %s shares the Kafka consumer of key %r but its connection, consumer or "
                "dead-letter settings differ from the ones the consumer was built with (those "
                "of the group's first watcher); give every watcher of the key the same settings",
                self.trigger_id,
                self.shared_stream_key(),
                extra={"action": "kafka.settings_mismatch", "trigger_id": self.trigger_id},
            )

    # -- the producer ---------------------------------------------------------------------

    def _producer(self, *, batched: bool = False) -> KafkaSharedStreamProducer:
        with importing_extra("KafkaMessageTrigger"):
            from producers.kafka import KafkaSharedStreamProducer

        batch_messages = DEFAULT_BATCH_MESSAGES if batched else None
        return KafkaSharedStreamProducer(self.settings, batch_messages=batch_messages)
