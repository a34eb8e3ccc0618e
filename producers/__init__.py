"""Broker adapters: ``SharedStreamProducer``s for Kafka and SQS, and the event triggers that
use them (``KafkaMessageTrigger``, ``SqsMessageTrigger``), and ``MessageQueueTrigger``, Airflow's
common-messaging constructor that builds the one its scheme names.

Owns each broker's consumer, its ack-mode advance (commits, deletes, dead letters) and the
translation of its client's errors into ``producers.exceptions``. May import
``shared_stream`` and ``triggers``; imported by DAG files (the trigger classes), by the
triggerer through the trigger classpaths its rows store, and by tests and benches.

A broker client is imported where a trigger runs (its producer is built), never where the
trigger class is defined: a DAG file that declares a watcher, parsed or re-imported by every
task process, imports neither aiokafka nor aiobotocore. The names below load on first use
(PEP 562 ``__getattr__``, as in ``triggers``): ``from producers import KafkaMessageTrigger``
imports ``producers.kafka_trigger`` alone. Each client comes with an extra of the ``sluice``
distribution (``triggers.extras``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from triggers.lazy import load_on_first_use

if TYPE_CHECKING:
    from producers.kafka import KafkaProducerStats, KafkaSharedStreamProducer
    from producers.kafka_messages import KafkaMessage, KafkaMessageBatch, KafkaOffset
    from producers.kafka_settings import KafkaSettings
    from producers.kafka_trigger import KafkaMessageTrigger
    from producers.message_queue import MessageQueueTrigger
    from producers.mqtt import MqttSharedStreamProducer
    from producers.mqtt_core import MqttMessage, MqttReceipt, MqttSettings
    from producers.mqtt_trigger import MqttMessageTrigger
    from producers.nats import NatsJetStreamSharedStreamProducer
    from producers.nats_core import NatsConnection, NatsMessage, NatsReceipt
    from producers.nats_trigger import NatsJetStreamTrigger
    from producers.rabbitmq import RabbitMQSharedStreamProducer
    from producers.rabbitmq_core import RabbitMQConnection, RabbitMQDelivery, RabbitMQMessage
    from producers.rabbitmq_trigger import RabbitMQMessageTrigger
    from producers.redis import RedisStreamProducer
    from producers.redis_core import RedisEndpoint, RedisEntry, RedisEntryRef
    from producers.redis_trigger import RedisStreamTrigger
    from producers.sqs import SqsSharedStreamProducer
    from producers.sqs_core import SqsConnection, SqsMessage, SqsReceipt
    from producers.sqs_trigger import SqsMessageTrigger

#: public name -> the module that defines it
_MODULE_OF: Final[dict[str, str]] = {
    "KafkaMessage": "producers.kafka_messages",
    "KafkaMessageBatch": "producers.kafka_messages",
    "KafkaMessageTrigger": "producers.kafka_trigger",
    "KafkaOffset": "producers.kafka_messages",
    "KafkaProducerStats": "producers.kafka",
    "KafkaSettings": "producers.kafka_settings",
    "KafkaSharedStreamProducer": "producers.kafka",
    "MessageQueueTrigger": "producers.message_queue",
    "MqttMessage": "producers.mqtt_core",
    "MqttMessageTrigger": "producers.mqtt_trigger",
    "MqttReceipt": "producers.mqtt_core",
    "MqttSettings": "producers.mqtt_core",
    "MqttSharedStreamProducer": "producers.mqtt",
    "NatsConnection": "producers.nats_core",
    "NatsJetStreamSharedStreamProducer": "producers.nats",
    "NatsJetStreamTrigger": "producers.nats_trigger",
    "NatsMessage": "producers.nats_core",
    "NatsReceipt": "producers.nats_core",
    "RabbitMQConnection": "producers.rabbitmq_core",
    "RabbitMQDelivery": "producers.rabbitmq_core",
    "RabbitMQMessage": "producers.rabbitmq_core",
    "RabbitMQMessageTrigger": "producers.rabbitmq_trigger",
    "RabbitMQSharedStreamProducer": "producers.rabbitmq",
    "RedisEndpoint": "producers.redis_core",
    "RedisEntry": "producers.redis_core",
    "RedisEntryRef": "producers.redis_core",
    "RedisStreamProducer": "producers.redis",
    "RedisStreamTrigger": "producers.redis_trigger",
    "SqsConnection": "producers.sqs_core",
    "SqsMessage": "producers.sqs_core",
    "SqsMessageTrigger": "producers.sqs_trigger",
    "SqsReceipt": "producers.sqs_core",
    "SqsSharedStreamProducer": "producers.sqs",
}

__all__: tuple[str, ...] = (
    "KafkaMessage",
    "KafkaMessageBatch",
    "KafkaMessageTrigger",
    "KafkaOffset",
    "KafkaProducerStats",
    "KafkaSettings",
    "KafkaSharedStreamProducer",
    "MessageQueueTrigger",
    "MqttMessage",
    "MqttMessageTrigger",
    "MqttReceipt",
    "MqttSettings",
    "MqttSharedStreamProducer",
    "NatsConnection",
    "NatsJetStreamSharedStreamProducer",
    "NatsJetStreamTrigger",
    "NatsMessage",
    "NatsReceipt",
    "RabbitMQConnection",
    "RabbitMQDelivery",
    "RabbitMQMessage",
    "RabbitMQMessageTrigger",
    "RabbitMQSharedStreamProducer",
    "RedisEndpoint",
    "RedisEntry",
    "RedisEntryRef",
    "RedisStreamProducer",
    "RedisStreamTrigger",
    "SqsConnection",
    "SqsMessage",
    "SqsMessageTrigger",
    "SqsReceipt",
    "SqsSharedStreamProducer",
)


if not TYPE_CHECKING:  # type checkers read the imports above: a misspelt name is an error
    __getattr__, __dir__ = load_on_first_use(__name__, _MODULE_OF)
