"""Watchers configured by connection id (``kafka_config_id``, ``aws_conn_id``) through the
real triggerer, against the real broker and SQS server: the trigger row stores only the id,
the triggerer resolves the connection; a missing connection fails its trigger alone."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from aiobotocore.session import get_session
from cryptography.fernet import Fernet
from sqlalchemy import select

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import AssetEvent, Trigger
from engine.db.queries import connections as store
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from producers import KafkaMessageTrigger, SqsMessageTrigger
from tests.services_kafka import FAST_GROUP, produce, seed_watchers
from tests.services_sqs import create_queue, queue_counts, send_messages
from tests.waiting import eventually, wait_until

if TYPE_CHECKING:
    from tests.services_kafka import KafkaBroker
    from tests.services_sqs import SqsEndpoint

pytestmark = pytest.mark.integration

SECRET = "aws-s3cr3t-from-connection"


def _database(url: str) -> tuple[Database, KwargsCipher]:
    db = Database(url)
    return db, KwargsCipher(Fernet.generate_key().decode())


def _triggerer(db: Database, cipher: KwargsCipher) -> Triggerer:
    settings = TriggererSettings(
        capacity=10, heartbeat_s=1, claim_idle_interval_s=0.05, shutdown_grace_s=5
    )
    return Triggerer(db=db, cipher=cipher, settings=settings)


def _events(db: Database) -> dict[int, list[str]]:
    rows = db.call(lambda s: s.execute(select(AssetEvent)).scalars().all())
    out: dict[int, list[str]] = {}
    for event in rows:
        out.setdefault(event.asset_id, []).append(str(event.dedup_key))
    return out


def _stored_kwargs(db: Database, cipher: KwargsCipher) -> list[dict[str, Any]]:
    rows = db.call(lambda s: s.execute(select(Trigger.kwargs)).scalars().all())
    return [cipher.decrypt_kwargs(token) for token in rows]


def _load_failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == "trigger_load_failed"]


async def test_a_kafka_watcher_by_connection_id_and_a_missing_connection(
    kafka: KafkaBroker, migrated_sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = kafka.create_topic(2)
    db, cipher = _database(migrated_sqlite_url)
    host, port = kafka.bootstrap.rsplit(":", 1)
    fields = {"conn_type": "kafka", "host": host, "port": int(port), "extra": {}}
    db.call(lambda s: store.upsert_connection(s, cipher, "kafka_default", fields))
    common = {"topics": [topic], "auto_offset_reset": "earliest", **FAST_GROUP}
    good = KafkaMessageTrigger(kafka_config_id="kafka_default", group_id="cg", **common)
    bad = KafkaMessageTrigger(kafka_config_id="nowhere", group_id="other", **common)
    assets = seed_watchers(db, cipher, {"orders": good.serialize()[1], "lost": bad.serialize()[1]})
    stored = _stored_kwargs(db, cipher)
    assert {k["kafka_config_id"] for k in stored} == {"kafka_default", "nowhere"}
    assert all(k["bootstrap_servers"] is None for k in stored)  # only the id is stored
    triggerer = _triggerer(db, cipher)
    count = 40
    with anyio.fail_after(45):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            key = good.shared_stream_key()
            await wait_until(lambda: triggerer.shared_streams.subscriber_count(key) == 1)
            await wait_until(lambda: len(_load_failures(caplog)) >= 1)
            records = [
                (i % 2, f"k{i}".encode(), json.dumps({"n": i}).encode(), []) for i in range(count)
            ]
            await produce(kafka.bootstrap, topic, records)

            async def all_events() -> bool:
                return len(_events(db).get(assets["orders"], [])) == count

            await eventually(all_events, within=30, step=0.05)
            triggerer.shutdown()
    assert assets["lost"] not in _events(db)
    message = _load_failures(caplog)[0].getMessage()
    assert "watcher 'w'" in message and "connection 'nowhere'" in message
    assert "kafka_config_id" in message and "SLUICE_CONN_NOWHERE" in message
    db.dispose()


async def test_an_sqs_watcher_by_connection_id(
    sqs_endpoint: SqsEndpoint,
    sqs_queue_name: str,
    migrated_sqlite_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    db, cipher = _database(migrated_sqlite_url)
    fields = {
        "conn_type": "aws",
        "login": sqs_endpoint.aws_access_key_id,
        "password": SECRET,
        "extra": {"region_name": sqs_endpoint.region_name, "endpoint_url": sqs_endpoint.url},
    }
    db.call(lambda s: store.upsert_connection(s, cipher, "aws_default", fields))
    async with get_session().create_client("sqs", **sqs_endpoint.client_kwargs()) as sqs:
        url = await create_queue(sqs, sqs_queue_name)
        trigger = SqsMessageTrigger(queue_url=url, aws_conn_id="aws_default", wait_time_s=1)
        assets = seed_watchers_sqs(db, cipher, trigger)
        stored = _stored_kwargs(db, cipher)[0]
        assert stored["aws_conn_id"] == "aws_default"
        assert stored["aws_secret_access_key"] is None and stored["endpoint_url"] is None
        triggerer = _triggerer(db, cipher)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                await tg.start(triggerer.run)
                key = trigger.shared_stream_key()
                await wait_until(lambda: triggerer.shared_streams.subscriber_count(key) == 1)
                ids = await send_messages(
                    sqs, url, [{"MessageBody": json.dumps({"n": n})} for n in range(10)]
                )

                async def drained() -> bool:
                    return await queue_counts(sqs, url) == (0, 0)

                await wait_until(lambda: len(_events(db).get(assets, [])) == 10, within=20)
                await eventually(drained)
                triggerer.shutdown()
    assert sorted(_events(db)[assets]) == sorted(f"sqs:{i}" for i in ids)
    assert SECRET not in caplog.text
    db.dispose()


def seed_watchers_sqs(db: Database, cipher: KwargsCipher, trigger: SqsMessageTrigger) -> int:
    from sqlalchemy import insert

    from engine.db.models import Asset, AssetWatcher
    from engine.db.queries import triggers as trigger_rows
    from engine.states import TriggerKind

    def seed(session: Any) -> int:
        asset_id = session.execute(
            insert(Asset).values(name="sqs", uri="test://sqs", extra={}).returning(Asset.id)
        ).scalar_one()
        classpath, kwargs = trigger.serialize()
        tid = trigger_rows.add_trigger_row(
            session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
        )
        session.execute(insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid))
        return int(asset_id)

    return db.call(seed)
