"""``SqsMessageTrigger``: an asset watcher's event trigger on an SQS queue (ack mode).

Every watcher of one queue shares one ``SqsSharedStreamProducer`` (key: endpoint and queue
URL). Each trigger filters the shared messages (``matches``: the declarative
``body_filter`` / ``attribute_filter``, or a subclass's own rule) and fires one
``TriggerEvent`` per accepted message, deduplicated by message id. A filter that raises
rejects the message (``reject_shared_stream_event()``; the producer applies ``on_reject``).

The producer is built from the kwargs of the group's first watcher: give every watcher of a
queue the same connection and producer settings (``on_reject``, ``dead_letter_queue_url``,
``visibility_timeout_s``, ``wait_time_s``, ``max_in_flight``). Credentials are trigger
kwargs, so the engine stores them encrypted; they are never logged.

An event may carry a partition key taken from its message: ``partition_key_field`` (a
dotted path into the JSON body), ``partition_key_attribute`` (a message attribute) or
``partition_key_function`` (``producers.partition_keys``). A message the filter accepts but
that gives no valid key is rejected (``on_reject``), with a warning naming its id.

``aws_conn_id`` (Airflow's name) takes the credentials, region and endpoint from a named
``aws`` connection instead (``connection_settings``: login / password are the access key id
/ secret; the extra may hold ``region_name``, ``endpoint_url``, ``aws_session_token``, and
the keys too): the trigger row stores only the id, the triggerer resolves it. Watchers share
a queue's consumer by connection id (key ``("sqs", "connection:<id>", queue_url)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from producers.ack_mode_trigger import AckModeMessageTrigger
from producers.message_filters import MISSING, json_body_matches, options_of
from producers.partition_keys import (
    PartitionKeyRule,
    field_key,
    function_key,
    named_key,
    partition_key_rule,
    rule_kwargs,
)
from producers.sqs_core import (
    DEFAULT_MAX_IN_FLIGHT,
    MAX_WAIT_TIME_S,
    SqsConnection,
    SqsMessage,
    check_settings,
)
from triggers.base import classpath_of
from triggers.extras import importing_extra, require_extra

if TYPE_CHECKING:
    from collections.abc import Hashable, Mapping

    from producers.sqs import SqsSharedStreamProducer
    from producers.sqs_core import OnReject


def _attribute_accepts(expected: Any, actual: Any) -> bool:
    """As ``accepts``; SQS sends Number attributes as text, so numbers compare as text."""
    return any(
        actual == option
        or (
            isinstance(option, int | float)
            and not isinstance(option, bool)
            and actual == str(option)
        )
        for option in options_of(expected)
    )


class SqsMessageTrigger(AckModeMessageTrigger[SqsMessage]):
    """Fires for each message of an SQS queue that passes this trigger's filter.

    ``body_filter``: dotted field path -> required value (or list of accepted values) of the
    JSON body; a message whose body is not a JSON object is rejected by a trigger that has
    one. ``attribute_filter``: message attribute name -> required value(s). Both must hold;
    with neither, every message matches. Payload: ``message_id``, ``body`` (JSON-decoded
    when it parses), ``attributes``, ``message_attributes``.

    ``partition_key_field`` / ``partition_key_attribute`` / ``partition_key_function`` (at
    most one): where each event's partition key comes from; a message without a valid key
    is rejected.
    """

    connection_kwargs = ("aws_conn_id",)
    settled_as = "messages are deleted"
    rejected_action = "sqs.message_rejected"

    def __init__(
        self,
        *,
        queue_url: str,
        aws_conn_id: str | None = None,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        body_filter: dict[str, Any] | None = None,
        attribute_filter: dict[str, Any] | None = None,
        on_reject: OnReject = "leave",
        dead_letter_queue_url: str | None = None,
        visibility_timeout_s: int | None = None,
        wait_time_s: int = MAX_WAIT_TIME_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        partition_key_field: str | None = None,
        partition_key_attribute: str | None = None,
        partition_key_function: str | None = None,
    ) -> None:
        super().__init__()
        require_extra("aiobotocore", needed_by="SqsMessageTrigger")
        check_settings(
            on_reject=on_reject,
            dead_letter_queue_url=dead_letter_queue_url,
            visibility_timeout_s=visibility_timeout_s,
            wait_time_s=wait_time_s,
            max_in_flight=max_in_flight,
            where=f"SqsMessageTrigger on {queue_url}",
        )
        self.connection = SqsConnection(
            queue_url=queue_url,
            region_name=region_name,
            endpoint_url=endpoint_url,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
        )
        self.aws_conn_id = aws_conn_id
        self.body_filter = dict(body_filter or {})
        self.attribute_filter = dict(attribute_filter or {})
        self.on_reject: OnReject = on_reject
        self.dead_letter_queue_url = dead_letter_queue_url
        self.visibility_timeout_s = visibility_timeout_s
        self.wait_time_s = wait_time_s
        self.max_in_flight = max_in_flight
        self.partition_key_rule = partition_key_rule(
            f"SqsMessageTrigger on {queue_url}",
            partition_key_field=partition_key_field,
            partition_key_attribute=partition_key_attribute,
            partition_key_function=partition_key_function,
        )

    def serialize(self) -> tuple[str, dict[str, Any]]:
        c = self.connection
        return (
            classpath_of(SqsMessageTrigger),
            {
                "queue_url": c.queue_url,
                "aws_conn_id": self.aws_conn_id,
                "region_name": c.region_name,
                "endpoint_url": c.endpoint_url,
                "aws_access_key_id": c.aws_access_key_id,
                "aws_secret_access_key": c.aws_secret_access_key,
                "aws_session_token": c.aws_session_token,
                "body_filter": self.body_filter or None,
                "attribute_filter": self.attribute_filter or None,
                "on_reject": self.on_reject,
                "dead_letter_queue_url": self.dead_letter_queue_url,
                "visibility_timeout_s": self.visibility_timeout_s,
                "wait_time_s": self.wait_time_s,
                "max_in_flight": self.max_in_flight,
                **rule_kwargs(self.partition_key_rule),
            },
        )

    # -- shared stream --------------------------------------------------------------------

    def shared_stream_key(self) -> Hashable:
        if self.aws_conn_id:  # the same before and after the triggerer resolves it
            return ("sqs", f"connection:{self.aws_conn_id}", self.connection.queue_url)
        return ("sqs", self.connection.endpoint_url, self.connection.queue_url)

    @classmethod
    def connection_settings(cls, kwarg: str, connection: Mapping[str, Any]) -> dict[str, Any]:
        """An ``aws`` connection as client settings: login / password are the access key
        id / secret; the extra may hold ``region_name``, ``endpoint_url`` (or
        ``service_config.sqs.endpoint_url``), ``aws_session_token`` and the keys."""
        extra = dict(connection.get("extra") or {})
        sqs_config = (extra.get("service_config") or {}).get("sqs") or {}
        settings = {
            "aws_access_key_id": connection.get("login") or extra.get("aws_access_key_id"),
            "aws_secret_access_key": (
                connection.get("password") or extra.get("aws_secret_access_key")
            ),
            "aws_session_token": extra.get("aws_session_token"),
            "region_name": extra.get("region_name"),
            "endpoint_url": sqs_config.get("endpoint_url") or extra.get("endpoint_url"),
        }
        return {k: v for k, v in settings.items() if v not in (None, "")}

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SqsSharedStreamProducer:
        return cls(**kwargs).build_producer()

    def build_producer(self) -> SqsSharedStreamProducer:
        """The queue's producer, with this trigger's connection and producer settings."""
        with importing_extra("SqsMessageTrigger"):
            from producers.sqs import SqsSharedStreamProducer
        return SqsSharedStreamProducer(
            self.connection,
            on_reject=self.on_reject,
            dead_letter_queue_url=self.dead_letter_queue_url,
            visibility_timeout_s=self.visibility_timeout_s,
            wait_time_s=self.wait_time_s,
            max_in_flight=self.max_in_flight,
        )

    def _partition_key(self, message: SqsMessage, rule: PartitionKeyRule) -> str:
        if rule.source == "field":
            return field_key(message.body, rule, document_name="the body")
        if rule.source == "attribute":
            return named_key(message.message_attributes, rule, "message attribute")
        assert self._key_function is not None, "loaded as the stream starts"
        return function_key(self._key_function, message)

    def matches(self, message: SqsMessage) -> bool:
        """True when ``message`` passes this trigger's filters; may raise to reject it."""
        for name, expected in self.attribute_filter.items():
            actual = message.message_attributes.get(name, MISSING)
            if actual is MISSING or not _attribute_accepts(expected, actual):
                return False
        if not self.body_filter:
            return True
        what = f"message {message.message_id} of {self.connection.queue_url}"
        return json_body_matches(self.body_filter, message.body, what)

    @staticmethod
    def event_payload(message: SqsMessage) -> dict[str, Any]:
        return {
            "message_id": message.message_id,
            "body": message.body,
            "attributes": dict(message.attributes),
            "message_attributes": dict(message.message_attributes),
        }

    def _dedup_key(self, message: SqsMessage) -> str:
        return f"sqs:{message.message_id}"

    def _rejected_what(self, message: Any) -> tuple[str, dict[str, Any]]:
        message_id = getattr(message, "message_id", None)
        return f"message {message_id} of {self.connection.queue_url}", {"message_id": message_id}
