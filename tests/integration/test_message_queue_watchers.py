"""A DAG file whose watchers use Airflow's ``MessageQueueTrigger`` parses as the DAG
processor parses it: each scheme's watcher is stored as the Sluice trigger it returned
(``KafkaMessageTrigger``, ``SqsMessageTrigger``), with its kwargs; an unknown scheme is the
file's parse error, naming the known ones."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import select

from engine.db.models import Trigger
from tests.integration.harness import parse_in_process, parsed_database

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

DAG_FILE = """
from engine import DAG, Asset, AssetWatcher
from producers import MessageQueueTrigger

orders = Asset(
    "orders",
    watchers=[
        AssetWatcher(
            name="orders_topic",
            trigger=MessageQueueTrigger(
                scheme="kafka", topics=["orders"], group_id="g", bootstrap_servers="k:9092"
            ),
        )
    ],
)
refunds = Asset(
    "refunds",
    watchers=[
        AssetWatcher(
            name="refunds_queue",
            trigger=MessageQueueTrigger(
                queue="https://sqs.eu-west-1.amazonaws.com/123456789012/refunds",
                region_name="eu-west-1",
            ),
        )
    ],
)

with DAG("on_messages", schedule=orders | refunds):
    pass
"""


def test_each_schemes_watcher_is_stored_as_its_sluice_trigger(
    migrated_db_url: str, tmp_path: Path
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "queues.py").write_text(textwrap.dedent(DAG_FILE))
    db, _, cipher, _ = parsed_database(migrated_db_url, tmp_path, dags)
    try:
        rows = db.call(lambda s: s.execute(select(Trigger)).scalars().all())
        stored = {row.classpath: cipher.decrypt_kwargs(row.kwargs) for row in rows}
        assert set(stored) == {
            "producers.kafka_trigger.KafkaMessageTrigger",
            "producers.sqs_trigger.SqsMessageTrigger",
        }
        assert stored["producers.kafka_trigger.KafkaMessageTrigger"]["topics"] == ["orders"]
        sqs = stored["producers.sqs_trigger.SqsMessageTrigger"]
        assert sqs["queue_url"].endswith("/123456789012/refunds")

        (dags / "queues.py").write_text(
            textwrap.dedent(DAG_FILE).replace('scheme="kafka"', 'scheme="pulsar"')
        )
        report = parse_in_process(db, cipher, dags)
        (error,) = report.errors.values()
        assert "scheme 'pulsar' is not one Sluice reads" in error.message
        assert "['kafka', 'sqs', 'rabbitmq'" in error.message
    finally:
        db.dispose()
