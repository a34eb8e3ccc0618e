"""``RedisStreamTrigger``: an asset watcher's event trigger on Redis streams (ack mode).

Every watcher of one ``(server or connection, group, streams)`` shares one
``RedisStreamProducer``: one consumer of the group per engine process. Each trigger filters
the shared entries on its own and fires one ``TriggerEvent`` per accepted entry,
deduplicated by ``redis:<stream>:<entry id>``:

- ``body_filter``: dotted path -> required value (or list of accepted values) of the JSON in
  the entry's ``body_field``; an entry whose body is not a JSON object is *rejected* by a
  trigger that has one;
- ``field_filter``: entry field name -> required value(s) (text; numbers compare as text);
- ``apply_function``: the dotted path of ``f(entry, *apply_function_args,
  **apply_function_kwargs)`` (a ``RedisEntry``; may be async) returning truthy to accept.

All must hold; with none, every entry matches. A filter that raises rejects the entry
(``reject_shared_stream_event()``): the producer moves it to the dead stream and acks it
(``on_reject="dead_letter"``), or leaves it pending (``"leave"``) for the next claim, which
delivers it again after ``claim_idle_ms`` until ``max_deliveries`` sends it to the dead
stream.
An event may carry a partition key (``partition_key_field``: a dotted path of the body,
``partition_key_entry_field``: an entry field, or ``partition_key_function``); an accepted
entry that gives no valid key is rejected the same way, with a warning naming its id.

The producer is built from the kwargs of the group's first watcher: give every watcher of a
key the same connection and producer settings. ``url`` may hold a password: trigger kwargs
are stored encrypted, and logs, errors and the shared-stream key show the URL without it.
``redis_conn_id`` (``conn_id`` is accepted too) takes the URL from a named ``redis``
connection instead (host, port, login, password; the database in the schema or the extra's
``db``; ``rediss`` or the extra's ``ssl`` for TLS), resolved by the triggerer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from producers.ack_mode_trigger import AckModeMessageTrigger
from producers.exceptions import EventFilterError, ProducerConfigError
from producers.message_filters import (
    MISSING,
    body_matches,
    function_path_problem,
    options_of,
)
from producers.partition_keys import (
    NoKey,
    PartitionKeyRule,
    field_key,
    function_key,
    named_key,
    partition_key_rule,
)
from producers.redis_core import (
    DEFAULT_BLOCK_MS,
    DEFAULT_BODY_FIELD,
    DEFAULT_CLAIM_IDLE_MS,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_URL,
    RedisEndpoint,
    RedisEntry,
    check_settings,
    redact_url,
    url_from_connection,
)
from triggers.base import classpath_of
from triggers.extras import importing_extra, require_extra

if TYPE_CHECKING:
    from collections.abc import Hashable, Mapping, Sequence

    from producers.redis import RedisStreamProducer
    from producers.redis_core import OnReject


#: the keyword of each partition-key source this trigger offers
_KEY_OPTIONS = {
    "field": "partition_key_field",
    "attribute": "partition_key_entry_field",
    "function": "partition_key_function",
}


def _field_accepts(expected: Any, actual: Any) -> bool:
    """Entry fields are text: a number (or bool) expected compares as its text."""
    for option in options_of(expected):
        if isinstance(option, bool):
            if actual == ("true" if option else "false"):
                return True
            continue
        if actual == option or (isinstance(option, int | float) and actual == str(option)):
            return True
    return False


class RedisStreamTrigger(AckModeMessageTrigger[RedisEntry]):
    """Fires for each entry of ``streams`` (read by consumer group ``group``) that passes
    this trigger's filters. Payload: ``stream``, ``entry_id``, ``fields``, ``body`` (the
    ``body_field`` JSON-decoded when it parses), ``body_format`` and ``delivery_count``."""

    connection_kwargs = ("redis_conn_id",)
    settled_as = "entries are acked"
    rejected_action = "redis.entry_rejected"
    rejected_note = "; it takes the on_reject path"

    def __init__(
        self,
        *,
        group: str,
        streams: str | Sequence[str] | None = None,
        stream: str | None = None,
        url: str | None = None,
        redis_conn_id: str | None = None,
        conn_id: str | None = None,
        consumer_name: str | None = None,
        start_id: str = "0",
        body_field: str = DEFAULT_BODY_FIELD,
        body_filter: Mapping[str, Any] | None = None,
        field_filter: Mapping[str, Any] | None = None,
        apply_function: str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        claim_idle_ms: int | None = DEFAULT_CLAIM_IDLE_MS,
        max_deliveries: int | None = DEFAULT_MAX_DELIVERIES,
        dead_letter_stream: str | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        block_ms: int = DEFAULT_BLOCK_MS,
        on_reject: OnReject = "dead_letter",
        partition_key_field: str | None = None,
        partition_key_entry_field: str | None = None,
        partition_key_function: str | None = None,
    ) -> None:
        super().__init__()
        require_extra("redis", needed_by="RedisStreamTrigger")
        names = _stream_names(streams, stream)
        where = f"RedisStreamTrigger on {', '.join(names) or '?'}"
        if redis_conn_id and conn_id and redis_conn_id != conn_id:
            raise ProducerConfigError(f"{where}: give redis_conn_id or conn_id, not both")
        check_settings(
            streams=names,
            group=group,
            url=url,
            max_in_flight=max_in_flight,
            block_ms=block_ms,
            claim_idle_ms=claim_idle_ms,
            max_deliveries=max_deliveries,
            start_id=start_id,
            on_reject=on_reject,
            where=where,
        )
        if problem := function_path_problem(apply_function):
            raise ProducerConfigError(f"{where}: {problem}")
        self.streams: tuple[str, ...] = tuple(sorted(dict.fromkeys(names)))
        self.group = group
        self.redis_conn_id = redis_conn_id or conn_id
        self.endpoint = RedisEndpoint(url or DEFAULT_URL)
        self.consumer_name = consumer_name
        self.start_id = start_id
        self.body_field = body_field
        self.body_filter = dict(body_filter or {})
        self.field_filter = dict(field_filter or {})
        self.apply_function = apply_function
        self.apply_function_args = list(apply_function_args or ())
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        self.claim_idle_ms = claim_idle_ms
        self.max_deliveries = max_deliveries
        self.dead_letter_stream = dead_letter_stream
        self.max_in_flight = max_in_flight
        self.block_ms = block_ms
        self.on_reject: OnReject = on_reject
        self.partition_key_rule = _key_rule(
            where,
            partition_key_field=partition_key_field,
            partition_key_entry_field=partition_key_entry_field,
            partition_key_function=partition_key_function,
        )
        self._url_given = url is not None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "streams": list(self.streams),
            "group": self.group,
            "url": self.endpoint.url if self._url_given else None,
            "redis_conn_id": self.redis_conn_id,
            "consumer_name": self.consumer_name,
            "start_id": self.start_id,
            "body_field": self.body_field,
            "body_filter": self.body_filter or None,
            "field_filter": self.field_filter or None,
            "apply_function": self.apply_function,
            "apply_function_args": self.apply_function_args or None,
            "apply_function_kwargs": self.apply_function_kwargs or None,
            "claim_idle_ms": self.claim_idle_ms,
            "max_deliveries": self.max_deliveries,
            "dead_letter_stream": self.dead_letter_stream,
            "max_in_flight": self.max_in_flight,
            "block_ms": self.block_ms,
            "on_reject": self.on_reject,
        }
        rule = self.partition_key_rule
        if rule is not None:
            kwargs[_KEY_OPTIONS[rule.source]] = rule.name
        return classpath_of(RedisStreamTrigger), kwargs

    # -- shared stream --------------------------------------------------------------------

    def shared_stream_key(self) -> Hashable:
        # by connection id: the same before (parse) and after (triggerer) it is resolved;
        # by URL without its password otherwise
        where = f"connection:{self.redis_conn_id}" if self.redis_conn_id else self.endpoint.address
        return ("redis", where, self.group, self.streams)

    @classmethod
    def connection_settings(cls, kwarg: str, connection: Mapping[str, Any]) -> dict[str, Any]:
        """A ``redis`` connection as the client URL (see ``redis_core.url_from_connection``)."""
        return {"url": url_from_connection(connection)}

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> RedisStreamProducer:
        return cls(**kwargs).build_producer()

    def build_producer(self) -> RedisStreamProducer:
        """The group's producer, with this trigger's connection and producer settings."""
        with importing_extra("RedisStreamTrigger"):
            from producers.redis import RedisStreamProducer
        return RedisStreamProducer(
            self.endpoint,
            streams=self.streams,
            group=self.group,
            consumer_name=self.consumer_name,
            body_field=self.body_field,
            start_id=self.start_id,
            block_ms=self.block_ms,
            claim_idle_ms=self.claim_idle_ms,
            max_deliveries=self.max_deliveries,
            dead_letter_stream=self.dead_letter_stream,
            max_in_flight=self.max_in_flight,
            on_reject=self.on_reject,
        )

    async def matches(self, entry: RedisEntry) -> bool:
        """True when ``entry`` passes this trigger's filters; may raise to reject it."""
        for name, expected in self.field_filter.items():
            actual = entry.fields.get(name, MISSING)
            if actual is MISSING or not _field_accepts(expected, actual):
                return False
        if self.body_filter:
            if entry.body_format != "json" or not isinstance(entry.body, dict):
                raise EventFilterError(
                    f"entry {entry.entry_id} of stream {entry.stream} has no JSON object in "
                    f"field {self.body_field!r}; body_filter {sorted(self.body_filter)} "
                    "cannot apply"
                )
            if not body_matches(self.body_filter, entry.body):
                return False
        return await self._function_accepts(entry)

    def _partition_key(self, entry: RedisEntry, rule: PartitionKeyRule) -> str:
        if rule.source == "field":
            body = entry.body if entry.body_format == "json" else None
            return field_key(body, rule, document_name="the body")
        if rule.source == "attribute":
            return named_key(entry.fields, rule, "entry field")
        assert self._key_function is not None, "loaded as the stream starts"
        return function_key(self._key_function, entry)

    @staticmethod
    def event_payload(entry: RedisEntry) -> dict[str, Any]:
        return {
            "stream": entry.stream,
            "entry_id": entry.entry_id,
            "fields": dict(entry.fields),
            "body": entry.body,
            "body_format": entry.body_format,
            "delivery_count": entry.delivery_count,
        }

    def _dedup_key(self, entry: RedisEntry) -> str:
        return f"redis:{entry.stream}:{entry.entry_id}"

    def _key_rejection(self, rule: PartitionKeyRule, problem: NoKey) -> str:
        return f"no partition key ({_KEY_OPTIONS[rule.source]}={rule.name!r}): {problem}"

    def _rejected_what(self, entry: Any) -> tuple[str, dict[str, Any]]:
        entry_id = getattr(entry, "entry_id", None)
        stream = getattr(entry, "stream", None)
        return f"entry {entry_id} of stream {stream}", {"entry_id": entry_id}

    def __repr__(self) -> str:
        return (
            f"<RedisStreamTrigger {redact_url(self.endpoint.url)} group={self.group!r} "
            f"streams={list(self.streams)} trigger_id={self.trigger_id}>"
        )


def _stream_names(streams: str | Sequence[str] | None, stream: str | None) -> list[str]:
    if streams is not None and stream is not None:
        raise ProducerConfigError("RedisStreamTrigger: give streams or stream, not both")
    if stream is not None:
        return [stream]
    if streams is None:
        raise ProducerConfigError("RedisStreamTrigger needs streams=[...] (or stream=...)")
    return [streams] if isinstance(streams, str) else list(streams)


def _key_rule(where: str, **options: str | None) -> PartitionKeyRule | None:
    """The partition-key rule of the ``partition_key_*`` keywords (at most one)."""
    given = sorted(name for name, value in options.items() if value is not None)
    if len(given) > 1:
        raise ProducerConfigError(
            f"{where}: give at most one of {given}; each is a way to take the partition key "
            "from an entry"
        )
    return partition_key_rule(
        where,
        partition_key_field=options["partition_key_field"],
        partition_key_attribute=options["partition_key_entry_field"],
        partition_key_function=options["partition_key_function"],
    )
