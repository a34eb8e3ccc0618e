"""A Kafka watcher that sets the partition key from a message field drives a partitioned
consumer under ``sluice run`` (SQLite and PostgreSQL): messages for three regions make three
consumer runs (``PartitionedAssetTimetable``, ``IdentityMapper``), each with its region as
``context["partition_key"]``; a message without the field is dead-lettered and the ones
after it in its partition still run."""

from __future__ import annotations

import asyncio
import json
import textwrap
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, DagRun, TaskInstance
from tests.e2e.helpers import engine_env, start_engine, stop, wait_for
from tests.services_kafka import FAST_GROUP, produce, read_topic
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from pathlib import Path

    from tests.services_kafka import KafkaBroker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

DAGS = """
from engine import Asset, AssetWatcher, DAG, IdentityMapper, PartitionedAssetTimetable, task
from producers import KafkaMessageTrigger

orders = Asset(
    "orders",
    watchers=[
        AssetWatcher(
            "orders_by_region",
            KafkaMessageTrigger(
                topics=[{topic!r}],
                group_id="sluice-orders",
                bootstrap_servers={bootstrap!r},
                auto_offset_reset="earliest",
                partition_key_field="region",
                dead_letter_topic={dead!r},
                **{fast_group!r},
            ),
        )
    ],
)


@task
def report(**context):
    return context["partition_key"]


with DAG(
    "regional_report",
    schedule=PartitionedAssetTimetable(assets=orders, default_partition_mapper=IdentityMapper()),
    max_active_runs=3,
):
    report()
"""

REGIONS = ["eu", "us", "ap"]


def _reports(db: Database) -> dict[str | None, Any]:
    """partition key -> what the run's task returned, for the consumer's successful runs."""
    rows = db.call(
        lambda s: s.execute(
            select(DagRun.partition_key, TaskInstance.xcoms)
            .join(TaskInstance, TaskInstance.dag_run_id == DagRun.id)
            .where(DagRun.dag_id == "regional_report", DagRun.state == "success")
        ).all()
    )
    return {key: deserialize_value(xcoms["return_value"]) for key, xcoms in rows}


@pytest.mark.parametrize("migrated_db_url", ["sqlite", "postgres"], indirect=True)
def test_a_kafka_watcher_keyed_by_a_field_drives_one_consumer_run_per_key(
    kafka: KafkaBroker, migrated_db_url: str, tmp_path: Path
) -> None:
    topic, dead = kafka.create_topic(1), kafka.create_topic(1, prefix="dlt")
    home, dags = tmp_path / "home", tmp_path / "dags"
    for folder in (home, dags):
        folder.mkdir()
    source = DAGS.format(topic=topic, bootstrap=kafka.bootstrap, dead=dead, fast_group=FAST_GROUP)
    (dags / "orders.py").write_text(textwrap.dedent(source))
    env = engine_env(home, url=migrated_db_url, dags=dags, parallelism=3)
    db = Database(migrated_db_url)
    # One partition, in order: eu, a message without a region, us, ap.
    values = [{"region": "eu"}, {"amount": 3}, {"region": "us"}, {"region": "ap"}]
    records = [(0, None, json.dumps(v).encode(), []) for v in values]
    asyncio.run(produce(kafka.bootstrap, topic, records))
    engine = start_engine(env, tmp_path / "engine.log")
    try:
        wait_for(
            lambda: len(_reports(db)) == 3,
            timeout=60,
            what="one consumer run per region to succeed",
        )
    finally:
        code = stop(engine, timeout=60)
    assert code == 0
    assert _reports(db) == {region: region for region in REGIONS}
    keys = db.call(
        lambda s: (
            s.execute(
                select(AssetEvent.partition_key)
                .join(Asset, Asset.id == AssetEvent.asset_id)
                .where(Asset.name == "orders")
            )
            .scalars()
            .all()
        )
    )
    assert sorted(keys) == sorted(REGIONS)  # the keyless message made no event
    [letter] = asyncio.run(read_topic(kafka.bootstrap, dead, expected=1))
    assert json.loads(letter.value) == {"amount": 3}
    assert dict(letter.headers)["sluice.dead_letter.source"] == f"{topic}/0/1".encode()
    db.dispose()
