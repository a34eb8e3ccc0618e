"""``MessageQueueTrigger``: Airflow's common-messaging constructor, one name for every
broker, which returns the Sluice watcher trigger of the broker it names.

As in Airflow (``airflow.providers.common.messaging.triggers.msg_queue``), the broker is
named by ``scheme=`` (``"kafka"``, ``"sqs"``) with the broker trigger's own arguments as
keywords, or, the deprecated form, by a ``queue=`` URI: ``kafka://<broker>/<topic>[,<topic>]``
(brokers and topics from the URI, unless ``topics=`` is given) or an SQS queue URL
``https://sqs.<region>.amazonaws.com/<account>/<name>``. The keywords are those of the
Airflow trigger each scheme builds there (Kafka's ``AwaitMessageTrigger``: ``topics``,
``apply_function``, ``apply_function_args`` / ``_kwargs``, ``kafka_config_id``; SQS's
``SqsSensorTrigger``: ``sqs_queue``, ``aws_conn_id``, ``region_name``,
``wait_time_seconds``, ``visibility_timeout``) or those of the Sluice trigger
(``KafkaMessageTrigger``, ``SqsMessageTrigger``: ``group_id``, ``match_fields``,
``body_filter``, ...).

Sluice's other brokers have schemes of their own, with the Sluice trigger's keywords:
``"rabbitmq"`` (or ``"amqp"``: ``RabbitMQMessageTrigger``), ``"redis+streams"``
(``RedisStreamTrigger``), ``"nats"`` (``NatsJetStreamTrigger``) and ``"mqtt"``
(``MqttMessageTrigger``). Airflow's ``"redis+pubsub"`` is refused: Redis pub/sub cannot
redeliver a message, so an event could be lost; Sluice reads Redis Streams instead.

What comes back is the Sluice trigger of the scheme (``KafkaMessageTrigger``,
``SqsMessageTrigger``, ...): the trigger row stores that class, the triggerer runs it as any
watcher (shared streams, ack mode, dedup).
An unknown scheme, an argument neither trigger knows, or one whose behaviour Sluice does
not have (Kafka's ``poll_timeout`` / ``poll_interval``; SQS's ``max_messages``,
``num_batches``, ``message_filtering``, ``delete_message_on_reception=False``, ...; a
``trigger_queue``) is a ``ProducerConfigError`` naming it and what to use instead.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlparse

from producers.exceptions import ProducerConfigError

if TYPE_CHECKING:
    from triggers.base import BaseEventTrigger

__all__ = ("KNOWN_SCHEMES", "MessageQueueTrigger")

#: the schemes ``MessageQueueTrigger`` builds a trigger for -> (module, class)
_TRIGGERS: Final[dict[str, tuple[str, str]]] = {
    "kafka": ("producers.kafka_trigger", "KafkaMessageTrigger"),
    "sqs": ("producers.sqs_trigger", "SqsMessageTrigger"),
    "rabbitmq": ("producers.rabbitmq_trigger", "RabbitMQMessageTrigger"),
    "amqp": ("producers.rabbitmq_trigger", "RabbitMQMessageTrigger"),
    "redis+streams": ("producers.redis_trigger", "RedisStreamTrigger"),
    "nats": ("producers.nats_trigger", "NatsJetStreamTrigger"),
    "mqtt": ("producers.mqtt_trigger", "MqttMessageTrigger"),
}
KNOWN_SCHEMES: Final = tuple(_TRIGGERS)
#: schemes whose trigger takes a ``queue=`` of its own (with ``scheme=``, not a URI)
_QUEUE_IS_AN_ARGUMENT: Final = frozenset({"rabbitmq", "amqp"})
#: schemes Airflow has and Sluice refuses -> why, and what to use
_REFUSED_SCHEMES: Final = {
    "redis+pubsub": "Redis pub/sub cannot redeliver a message, so an event missed while a "
    "watcher restarts is lost; publish to a Redis stream and use scheme='redis+streams' "
    "(RedisStreamTrigger: consumer groups, acks after the event is stored)",
}
_SQS_URL: Final = re.compile(r"^https://sqs\.[^.]+\.amazonaws\.com/[0-9]+/.+")

#: Airflow's argument -> Sluice's, per scheme
_RENAMED: Final[dict[str, dict[str, str]]] = {
    "kafka": {},
    "sqs": {
        "sqs_queue": "queue_url",
        "wait_time_seconds": "wait_time_s",
        "visibility_timeout": "visibility_timeout_s",
    },
}
#: Airflow's arguments whose behaviour Sluice has another way, per scheme
_REFUSED: Final[dict[str, dict[str, str]]] = {
    "kafka": {
        "poll_timeout": "the shared consumer polls on its own; nothing to set",
        "poll_interval": "the shared consumer polls on its own; nothing to set",
    },
    "sqs": {
        "max_messages": "SqsMessageTrigger receives in batches of 10; bound the messages "
        "in flight with max_in_flight",
        "num_batches": "SqsMessageTrigger receives continuously; nothing to set",
        "waiter_delay": "SqsMessageTrigger long-polls (wait_time_seconds); nothing to set",
        "message_filtering": "use body_filter / attribute_filter (equality on JSON fields "
        "and message attributes)",
        "message_filtering_match_values": "use body_filter / attribute_filter",
        "message_filtering_config": "use body_filter / attribute_filter",
    },
}


def MessageQueueTrigger(
    *,
    queue: str | None = None,
    scheme: str | None = None,
    trigger_queue: str | None = None,
    **kwargs: Any,
) -> BaseEventTrigger:
    """The Sluice watcher trigger for ``scheme`` (or the ``queue`` URI) and ``kwargs``."""
    if trigger_queue is not None:
        raise ProducerConfigError(
            f"MessageQueueTrigger: trigger_queue={trigger_queue!r}: Sluice's triggerers take "
            "every trigger (no triggerer queues); leave it out"
        )
    if queue is not None and scheme in _QUEUE_IS_AN_ARGUMENT:
        kwargs = {"queue": queue, **kwargs}  # RabbitMQ's queue name, not a URI
    elif queue is not None:
        scheme, kwargs = _from_uri(queue, kwargs)
    elif scheme is None:
        raise ProducerConfigError(
            f"MessageQueueTrigger: give scheme= (one of {list(KNOWN_SCHEMES)}) or queue=, a "
            "queue URI"
        )
    if scheme in _REFUSED_SCHEMES:
        raise ProducerConfigError(
            f"MessageQueueTrigger: scheme {scheme!r} is not supported: {_REFUSED_SCHEMES[scheme]}"
        )
    if scheme not in KNOWN_SCHEMES:
        raise ProducerConfigError(
            f"MessageQueueTrigger: scheme {scheme!r} is not one Sluice reads; the known "
            f"schemes are {list(KNOWN_SCHEMES)}"
        )
    trigger_class = _trigger_class(scheme)
    return trigger_class(**_arguments(scheme, trigger_class, kwargs))


def _from_uri(queue: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The scheme and the trigger's arguments a deprecated ``queue=`` URI stands for."""
    if not isinstance(queue, str):
        raise ProducerConfigError(f"MessageQueueTrigger: queue must be a URI, got {queue!r}")
    if _SQS_URL.match(queue):
        return "sqs", {"queue_url": queue, **kwargs}
    parsed = urlparse(queue)
    if parsed.scheme != "kafka":
        raise ProducerConfigError(
            f"MessageQueueTrigger: queue {queue!r} is not a queue URI Sluice reads: "
            "kafka://<broker>/<topics>, or an SQS queue URL "
            "https://sqs.<region>.amazonaws.com/<account>/<name>; for the other brokers give "
            f"scheme= (one of {list(KNOWN_SCHEMES)}) with the trigger's own arguments"
        )
    topics = [t for t in parsed.path.lstrip("/").split(",") if t]
    if not topics and "topics" not in kwargs:
        raise ProducerConfigError(
            f"MessageQueueTrigger: queue {queue!r} names no topic; write "
            "kafka://<broker>/<topic>[,<topic>] or pass topics="
        )
    derived: dict[str, Any] = {} if "topics" in kwargs else {"topics": topics}
    if parsed.netloc and "bootstrap_servers" not in kwargs and "kafka_config_id" not in kwargs:
        derived["bootstrap_servers"] = parsed.netloc
    return "kafka", {**derived, **kwargs}


def _trigger_class(scheme: str) -> type[BaseEventTrigger]:
    module, name = _TRIGGERS[scheme]
    trigger_class: type[BaseEventTrigger] = getattr(importlib.import_module(module), name)
    return trigger_class


def _arguments(
    scheme: str, trigger_class: type[BaseEventTrigger], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """``kwargs`` under the Sluice trigger's names; refused: what it has no use for."""
    where = f"MessageQueueTrigger(scheme={scheme!r})"
    refused = _REFUSED.get(scheme, {})
    if scheme == "sqs" and kwargs.get("delete_message_on_reception", True) is not True:
        raise ProducerConfigError(
            f"{where}: delete_message_on_reception=False: SqsMessageTrigger deletes a message "
            "once its asset event is stored (ack mode); leave it out"
        )
    arguments: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name == "delete_message_on_reception" and scheme == "sqs":
            continue  # True: what ack mode does, once the event is stored
        if name in refused:
            raise ProducerConfigError(f"{where}: {name} is not supported: {refused[name]}")
        arguments[_RENAMED.get(scheme, {}).get(name, name)] = value
    accepted = set(inspect.signature(trigger_class).parameters)
    unknown = sorted(set(arguments) - accepted)
    if unknown:
        raise ProducerConfigError(
            f"{where}: {trigger_class.__name__} takes no {unknown}; it takes "
            f"{sorted(accepted | set(_RENAMED.get(scheme, {})))}"
        )
    if scheme == "kafka" and "group_id" not in arguments:
        raise ProducerConfigError(
            f"{where}: give group_id= (the consumer group whose commits Sluice advances; "
            "Airflow reads it from the connection's group.id)"
        )
    return arguments
