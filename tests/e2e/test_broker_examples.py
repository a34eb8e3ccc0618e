"""The four newer brokers' example DAGs, as a user runs them: ``sluice run`` on SQLite with
``dags/example_{rabbitmq,redis,nats,mqtt}_watchers.py``, pointed at the machine's brokers.

One message per watcher is published with each broker's own client, the way each example's
docstring says (a RabbitMQ message with a ``message_id``, a Redis entry whose ``body`` field
holds JSON, a JetStream message on ``orders.created``, an MQTT QoS 1 reading with an ``id``);
each example's DAG then runs once per event and succeeds, and each asset holds exactly its
own event. A non-JSON message on each broker goes its broker's dead-letter way and makes no
event. The MQTT reading is published again until the engine's session has subscribed (a
broker keeps nothing for a session it has not seen): its ``dedup_field`` makes the repeats
one asset event, which the test checks too.

The examples use fixed names (queue and stream ``shipments``, JetStream stream
``SLUICE_EXAMPLE_ORDERS``, MQTT client ``sluice-example-sensors``): the test clears them
before and after, and Redis runs on a database number of its own.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aio_pika
import nats
import paho.mqtt.publish as mqtt_publish
import pytest
import redis
from sqlalchemy import func, select

from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, DagRun
from tests.e2e.helpers import engine_env, log_tail, run_cli, start_engine, stop, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.e2e

EXAMPLES = ("rabbitmq", "redis", "nats", "mqtt")
AMQP = "amqp://guest:guest@127.0.0.1:5672/"
REDIS_URL = "redis://127.0.0.1:6379/13"
NATS_URL = "nats://127.0.0.1:4222"
DAGS = {
    "rabbitmq_shipments": ("rabbitmq-shipments-dhl", "rabbitmq-shipments-ups"),
    "redis_shipments": ("redis-shipments-dhl", "redis-shipments-ups"),
    "nats_orders": ("nats-orders-eu", "nats-orders-us"),
    "mqtt_sensor_readings": ("mqtt-temperature", "mqtt-humidity"),
}


async def _clear_brokers() -> None:
    connection = await aio_pika.connect(AMQP)
    async with connection:
        channel = await connection.channel()
        for queue in ("shipments", "shipments.dead-letter"):
            await channel.queue_delete(queue)
    redis.Redis.from_url(REDIS_URL).flushdb()
    client = await nats.connect(NATS_URL)
    try:
        try:
            await client.jetstream().delete_stream("SLUICE_EXAMPLE_ORDERS")
        except nats.js.errors.NotFoundError:
            pass
    finally:
        await client.close()


@pytest.fixture
def example_dags(tmp_path: Path) -> Iterator[Path]:
    dags = tmp_path / "dags"
    dags.mkdir()
    source = Path(__file__).resolve().parents[2] / "dags"
    for kind in EXAMPLES:
        shutil.copy(source / f"example_{kind}_watchers.py", dags)
    asyncio.run(_clear_brokers())
    yield dags
    asyncio.run(_clear_brokers())


async def _publish_rabbitmq() -> None:
    connection = await aio_pika.connect(AMQP)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue("shipments.dead-letter", durable=True)  # keeps them
        # The example declares it with these arguments when its consumer starts: the same
        # declaration here is a no-op then, and keeps the messages until it does.
        await channel.declare_queue(
            "shipments",
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "shipments.dead-letter",
            },
        )
        for body in (b'{"carrier": "dhl", "parcel": 1}', b'{"carrier": "ups", "parcel": 2}', b"x"):
            message = aio_pika.Message(body, message_id=uuid.uuid4().hex)
            await channel.default_exchange.publish(message, routing_key="shipments")


def _publish_redis() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    for body in ('{"carrier": "dhl", "parcel": 1}', '{"carrier": "ups", "parcel": 2}', "x"):
        client.xadd("shipments", {"body": body})


async def _publish_nats() -> None:
    client = await nats.connect(NATS_URL)
    try:
        js = client.jetstream()
        await js.add_stream(
            name="SLUICE_EXAMPLE_ORDERS", subjects=["orders.>", "orders-dead-letter"]
        )
        for body in (b'{"region": "eu", "order": 1}', b'{"region": "us", "order": 2}', b"x"):
            await js.publish("orders.created", body)
    finally:
        await client.close()


def _publish_mqtt() -> None:
    messages: list[Any] = [
        {
            "topic": "sluice-example/sensors/temperature/kitchen",
            "payload": '{"id": "t1"}',
            "qos": 1,
        },
        {"topic": "sluice-example/sensors/humidity/kitchen", "payload": '{"id": "h1"}', "qos": 1},
    ]
    mqtt_publish.multiple(messages, hostname="127.0.0.1", port=1883)


def _counts(db: Database) -> dict[str, int]:
    rows = db.call(
        lambda s: s.execute(
            select(Asset.name, func.count(AssetEvent.id))
            .join(AssetEvent, AssetEvent.asset_id == Asset.id)
            .group_by(Asset.name)
        ).all()
    )
    return {name: int(count) for name, count in rows}


def _successful_runs(db: Database) -> dict[str, int]:
    rows = db.call(
        lambda s: s.execute(
            select(DagRun.dag_id, func.count(DagRun.id))
            .where(DagRun.state == "success")
            .group_by(DagRun.dag_id)
        ).all()
    )
    return {dag: int(count) for dag, count in rows}


def test_each_newer_broker_example_runs_its_dag_once_per_event(
    tmp_path: Path, example_dags: Path
) -> None:
    home = tmp_path / "home"
    url = f"sqlite:///{home / 'sluice.db'}"
    env = engine_env(
        home,
        url=url,
        dags=example_dags,
        parallelism=4,
        SLUICE_EXAMPLE_RABBITMQ_URL=AMQP,
        SLUICE_EXAMPLE_REDIS_URL=REDIS_URL,
        SLUICE_EXAMPLE_NATS=NATS_URL,
    )
    home.mkdir()
    assert run_cli("db", "migrate", env=env).returncode == 0
    log = tmp_path / "engine.log"
    asyncio.run(_publish_rabbitmq())
    _publish_redis()
    asyncio.run(_publish_nats())
    proc = start_engine(env, log)
    db = Database(url)
    try:
        expected = {asset: 1 for assets in DAGS.values() for asset in assets}

        def mqtt_stored() -> bool:
            counts = _counts(db)
            if counts.get("mqtt-temperature") and counts.get("mqtt-humidity"):
                return True
            _publish_mqtt()  # until the engine's session has subscribed (see the docstring)
            return False

        wait_for(mqtt_stored, timeout=60, what="the MQTT readings' asset events", step=0.5)
        wait_for(
            lambda: _counts(db) == expected,
            timeout=60,
            what=f"one asset event per watcher: {_counts(db)}\n{log_tail(log)}",
            step=0.2,
        )
        # Each DAG runs on its events (one run may take both of its assets' events).
        wait_for(
            lambda: _successful_runs(db).keys() == DAGS.keys(),
            timeout=90,
            what=f"a successful run of each example DAG: {_successful_runs(db)}",
            step=0.3,
        )
        assert _counts(db) == expected  # the repeated MQTT readings stayed one event each
    finally:
        assert stop(proc) == 0
        db.dispose()
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, log_tail(log)
    assert asyncio.run(_dead_letters()) == {"rabbitmq": 1, "redis": [b"x"], "nats": b"x"}


async def _dead_letters() -> dict[str, Any]:
    """What each broker's dead-letter place holds: the non-JSON message, once."""
    connection = await aio_pika.connect(AMQP)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("shipments.dead-letter", passive=True)
        rabbitmq = queue.declaration_result.message_count
    dead: Any = redis.Redis.from_url(REDIS_URL).xrange("shipments:dead")
    client = await nats.connect(NATS_URL)
    try:
        last = await client.jetstream().get_last_msg("SLUICE_EXAMPLE_ORDERS", "orders-dead-letter")
    finally:
        await client.close()
    return {
        "rabbitmq": rabbitmq,
        "redis": [fields.get(b"body") for _, fields in dead],
        "nats": last.data,
    }
