"""RabbitMQ watchers through the real triggerer on SQLite: a connection by id (URI form),
two filtered siblings on one consumer, every match stored once, a republished message id
absorbed, the queue drained."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet

from engine.crypto import KwargsCipher
from engine.db.database import Database
from producers import RabbitMQMessageTrigger
from tests.waiting import wait_until
from tests.watcher_rows import asset_events, fast_triggerer, seed_watchers

if TYPE_CHECKING:
    from shared_stream import SharedStreamManager
    from tests.services_rabbitmq import RabbitQueues

pytestmark = pytest.mark.integration


def _advanced(manager: SharedStreamManager, count: int) -> Any:
    return lambda: sum(s.advanced_events for s in manager.stats()) >= count


async def test_watchers_by_connection_id_through_the_real_triggerer(
    rabbitmq_queues: RabbitQueues, migrated_sqlite_url: str, monkeypatch, caplog
) -> None:
    queue, _ = await rabbitmq_queues.make()
    monkeypatch.setenv("SLUICE_CONN_ORDERS_BROKER", "amqp://guest:guest@127.0.0.1:5672/%2F")
    db = Database(migrated_sqlite_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    triggers = {
        "orders": RabbitMQMessageTrigger(
            conn_id="orders_broker", queue=queue, body_filter={"kind": "order"}
        ),
        "refunds": RabbitMQMessageTrigger(
            conn_id="orders_broker", queue=queue, body_filter={"kind": ["refund", "chargeback"]}
        ),
    }
    assets = seed_watchers(db, cipher, triggers)
    kinds = ["order", "refund", "chargeback", "noise"]
    bodies = [{"kind": kinds[n % 4], "n": n} for n in range(60)]
    triggerer = fast_triggerer(db, cipher)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            key = triggers["orders"].shared_stream_key()
            await wait_until(lambda: triggerer.shared_streams.subscriber_count(key) == 2)
            ids = await rabbitmq_queues.publish(queue, bodies)
            expected = sorted(
                (
                    assets["orders" if kinds[n % 4] == "order" else "refunds"],
                    f"rabbitmq:{queue}:{i}",
                )
                for n, i in enumerate(ids)
                if kinds[n % 4] != "noise"
            )
            await wait_until(lambda: len(asset_events(db)) >= len(expected), within=15)
            # The same messages again (a publisher's retry, a redelivery after a crash):
            # absorbed by their dedup keys, yet acked.
            await rabbitmq_queues.republish(queue, bodies, ids)
            await wait_until(_advanced(triggerer.shared_streams, 120), within=15)
            assert triggerer.shared_streams.group_keys == (key,)  # one consumer for both
            triggerer.shutdown()
    assert sorted(asset_events(db)) == expected  # every match once, nothing else
    assert await rabbitmq_queues.ready(queue) == 0
    assert "guest:guest" not in caplog.text
    db.dispose()
