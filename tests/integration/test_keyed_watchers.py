"""Watchers that key their events from the message, through the real triggerer on SQLite,
against the real brokers (tansu for Kafka, moto for SQS): each stored asset event carries
the key its watcher's rule took from the message, sibling watchers on one shared stream
each key by their own rule, and a message that gives a watcher no valid key is
dead-lettered while the others flow past it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from aiobotocore.session import get_session
from cryptography.fernet import Fernet
from sqlalchemy import select

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetEvent
from producers import KafkaMessageTrigger, SqsMessageTrigger
from tests.services_kafka import FAST_GROUP, committed_offsets, produce, read_topic
from tests.services_sqs import create_queue, queue_counts, receive_all, send_messages
from tests.waiting import eventually, wait_until
from tests.watcher_rows import fast_triggerer, seed_watchers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.services_kafka import KafkaBroker
    from tests.services_sqs import SqsEndpoint
    from triggers.base import BaseEventTrigger

pytestmark = pytest.mark.integration


def _stored(db: Database) -> dict[str, dict[str, str | None]]:
    """asset name -> {dedup key: partition key} of its stored events."""
    rows = db.call(
        lambda s: s.execute(
            select(Asset.name, AssetEvent.dedup_key, AssetEvent.partition_key).join(
                Asset, Asset.id == AssetEvent.asset_id
            )
        ).all()
    )
    stored: dict[str, dict[str, str | None]] = {}
    for name, dedup_key, partition_key in rows:
        stored.setdefault(name, {})[dedup_key] = partition_key
    return stored


async def test_kafka_watchers_key_their_events_from_fields_and_dead_letter_keyless_messages(
    kafka: KafkaBroker, migrated_sqlite_url: str
) -> None:
    topic, dead = kafka.create_topic(2), kafka.create_topic(1, prefix="dlt")
    common = {
        "topics": [topic],
        "bootstrap_servers": kafka.bootstrap,
        "group_id": "keyed",
        "dead_letter_topic": dead,
        "auto_offset_reset": "earliest",
        **FAST_GROUP,
    }
    triggers: dict[str, BaseEventTrigger] = {
        "by_region": KafkaMessageTrigger(**common, partition_key_field="order.region"),
        "by_store": KafkaMessageTrigger(**common, partition_key_field="store"),  # a number
        "by_key": KafkaMessageTrigger(**common, partition_key_from_key=True),
    }
    regions = ["eu", "us", "ap"]
    values = [{"order": {"region": regions[n % 3]}, "store": 100 + n} for n in range(12)]
    values[5] = {"order": {}, "store": 105}  # no region: dead-lettered by by_region alone
    records = [
        (n % 2, f"customer-{n}".encode(), json.dumps(v).encode(), []) for n, v in enumerate(values)
    ]
    db = Database(migrated_sqlite_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    seed_watchers(db, cipher, triggers)
    triggerer = fast_triggerer(db, cipher)
    key = triggers["by_region"].shared_stream_key()
    with anyio.fail_after(45):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await wait_until(lambda: triggerer.shared_streams.subscriber_count(key) == 3)
            await produce(kafka.bootstrap, topic, records)

            async def committed() -> bool:
                offsets = await committed_offsets(kafka.bootstrap, "keyed", topic, 2)
                return offsets == {0: 6, 1: 6}

            await eventually(committed, within=20, step=0.05)
            assert triggerer.shared_streams.group_keys == (key,)  # one consumer for the three
            triggerer.shutdown()
    coordinates = [f"kafka:{topic}:{n % 2}:{n // 2}" for n in range(12)]
    stored = _stored(db)
    assert stored["by_region"] == {coordinates[n]: regions[n % 3] for n in range(12) if n != 5}
    assert stored["by_store"] == {coordinates[n]: str(100 + n) for n in range(12)}
    assert stored["by_key"] == {coordinates[n]: f"customer-{n}" for n in range(12)}
    [letter] = await read_topic(kafka.bootstrap, dead, expected=1)
    headers = dict(letter.headers)
    assert headers["sluice.dead_letter.source"] == f"{topic}/1/2".encode()
    assert headers["sluice.dead_letter.reason"] == b"rejected"
    assert b"field 'order.region' is missing" in headers["sluice.dead_letter.errors"]
    db.dispose()


@pytest.fixture
async def sqs(sqs_endpoint: SqsEndpoint) -> AsyncIterator[Any]:
    async with get_session().create_client("sqs", **sqs_endpoint.client_kwargs()) as client:
        yield client


async def test_sqs_watchers_key_their_events_from_a_field_or_an_attribute(
    sqs_endpoint: SqsEndpoint, sqs: Any, sqs_queue_name: str, migrated_sqlite_url: str
) -> None:
    url = await create_queue(sqs, sqs_queue_name)
    dlq = await create_queue(sqs, f"{sqs_queue_name}-dlq")

    def watcher(**rule: str) -> SqsMessageTrigger:
        return SqsMessageTrigger(
            queue_url=url,
            endpoint_url=sqs_endpoint.url,
            region_name=sqs_endpoint.region_name,
            aws_access_key_id=sqs_endpoint.aws_access_key_id,
            aws_secret_access_key=sqs_endpoint.aws_secret_access_key,
            wait_time_s=1,
            on_reject="dead_letter",
            dead_letter_queue_url=dlq,
            **rule,
        )

    triggers: dict[str, BaseEventTrigger] = {
        "by_day": watcher(partition_key_field="day"),
        "by_region": watcher(partition_key_attribute="region"),
    }
    entries = []
    for n in range(6):
        entry: dict[str, Any] = {"MessageBody": json.dumps({"day": f"2026-03-1{n}", "n": n})}
        if n != 4:  # message 4 has no region: dead-lettered (by_day still stores it)
            region = {"DataType": "String", "StringValue": ["eu", "us"][n % 2]}
            entry["MessageAttributes"] = {"region": region}
        entries.append(entry)
    db = Database(migrated_sqlite_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    seed_watchers(db, cipher, triggers)
    triggerer = fast_triggerer(db, cipher)
    key = triggers["by_day"].shared_stream_key()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await wait_until(lambda: triggerer.shared_streams.subscriber_count(key) == 2)
            ids = await send_messages(sqs, url, entries)

            async def drained() -> bool:
                return await queue_counts(sqs, url) == (0, 0)

            await eventually(drained, within=20)
            triggerer.shutdown()
    stored = _stored(db)
    assert stored["by_day"] == {f"sqs:{ids[n]}": f"2026-03-1{n}" for n in range(6)}
    assert stored["by_region"] == {f"sqs:{ids[n]}": ["eu", "us"][n % 2] for n in range(6) if n != 4}
    [dead] = await receive_all(sqs, dlq)
    assert json.loads(dead["Body"])["n"] == 4
    db.dispose()
