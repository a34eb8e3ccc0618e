"""A Kafka producer without a broker: its consumer is a double that records the commits."""

from __future__ import annotations

from typing import Any

import anyio

from producers import KafkaSharedStreamProducer
from producers.kafka_settings import KafkaSettings


class RecordingConsumer:
    def __init__(self) -> None:
        self.commits: list[tuple[int, int]] = []

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.commits.extend((tp.partition, offset) for tp, offset in offsets.items())


def recording_producer(
    *, on_unclean: str | None = None, **kwargs: Any
) -> tuple[KafkaSharedStreamProducer, RecordingConsumer]:
    """A producer of group ``g`` on topic ``orders`` whose consumer records its commits."""
    settings = KafkaSettings(
        bootstrap_servers=("b:9092",), group_id="g", topics=("orders",), on_unclean=on_unclean
    )
    producer = KafkaSharedStreamProducer(settings, **kwargs)
    consumer = RecordingConsumer()
    producer._consumer = consumer  # what open_stream would have started
    producer._progress = anyio.Event()
    return producer, consumer
