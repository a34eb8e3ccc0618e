"""producers package."""

from __future__ import annotations

from producers.kafka import KafkaProducerStats, KafkaSharedStreamProducer
from producers.kafka_messages import KafkaMessage, KafkaMessageBatch, KafkaOffset
from producers.kafka_settings import KafkaSettings
from producers.kafka_trigger import KafkaMessageTrigger
from producers.sqs import SqsConnection, SqsMessage, SqsReceipt, SqsSharedStreamProducer
from producers.sqs_trigger import SqsMessageTrigger

__all__: tuple[str, ...] = (
    "KafkaMessage",
    "KafkaMessageBatch",
    "KafkaMessageTrigger",
    "KafkaOffset",
    "KafkaProducerStats",
    "KafkaSettings",
    "KafkaSharedStreamProducer",
    "SqsConnection",
    "SqsMessage",
    "SqsMessageTrigger",
    "SqsReceipt",
    "SqsSharedStreamProducer",
)
