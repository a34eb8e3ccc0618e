"""producers package."""

from __future__ import annotations

from producers.kafka import KafkaProducerStats, KafkaSharedStreamProducer
from producers.kafka_client import KafkaConnection, KafkaMessage, KafkaMessageBatch, KafkaOffset
from producers.kafka_trigger import KafkaMessageTrigger
from producers.sqs import SqsConnection, SqsMessage, SqsReceipt, SqsSharedStreamProducer
from producers.sqs_trigger import SqsMessageTrigger

__all__: tuple[str, ...] = (
    "KafkaConnection",
    "KafkaMessage",
    "KafkaMessageBatch",
    "KafkaMessageTrigger",
    "KafkaOffset",
    "KafkaProducerStats",
    "KafkaSharedStreamProducer",
    "SqsConnection",
    "SqsMessage",
    "SqsMessageTrigger",
    "SqsReceipt",
    "SqsSharedStreamProducer",
)
