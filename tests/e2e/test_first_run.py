"""A first run: ``sluice run`` on the example DAGs with no broker is quiet (issue 17).

The engine runs as ``make run`` runs it (text logs, the repository's ``dags/`` folder, a
fresh ``SLUICE_HOME``) while the Kafka, SQS, RabbitMQ and NATS example DAGs point at a port
that refuses connections. Once every broker watcher has failed and retried several times (counted in
the trigger rows, since the retries are logged at DEBUG), the log holds no traceback and no
ERROR line, and each broker watcher said exactly once that it cannot reach its broker,
naming the address and the backoff.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import select

from engine.db.database import Database
from engine.db.models import Asset, AssetWatcher, Trigger
from tests.e2e.helpers import engine_env, log_tail, run_cli, start_engine, stop, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.e2e

EXAMPLE_DAGS = Path(__file__).resolve().parents[2] / "dags"
BROKER_WATCHERS = (
    "kafka-orders-eu",
    "kafka-orders-us",
    "sqs-invoices",
    "sqs-receipts",
    "rabbitmq-shipments-dhl",
    "rabbitmq-shipments-ups",
    "redis-shipments-dhl",
    "redis-shipments-ups",
    "mqtt-temperature",
    "mqtt-humidity",
    "nats-orders-eu",
    "nats-orders-us",
)
RETRIES = 2  # failed attempts of each broker watcher before the log is read: the second
# must not warn again (one warning per watcher, not one per failure)
WARNING = re.compile(
    r" WARNING +engine\.triggerer\.runtime: Trigger (\d+) \(watcher\) cannot reach "
)


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port that is bound but not listening: a connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def test_a_first_run_without_brokers_logs_one_warning_per_watcher_and_no_traceback(
    tmp_path: Path, refused_port: int
) -> None:
    home = tmp_path / "home"
    address = f"127.0.0.1:{refused_port}"
    url = f"sqlite:///{home / 'sluice.db'}"
    env = engine_env(
        home,
        url=url,
        dags=EXAMPLE_DAGS,
        parallelism=4,
        SLUICE_EXAMPLE_KAFKA=address,
        SLUICE_EXAMPLE_SQS_ENDPOINT=f"http://{address}",
        SLUICE_EXAMPLE_SQS_QUEUE_URL=f"http://{address}/123456789012/documents",
        SLUICE_EXAMPLE_RABBITMQ_URL=f"amqp://guest:guest@{address}/",
        SLUICE_EXAMPLE_REDIS_URL=f"redis://{address}/0",
        SLUICE_EXAMPLE_MQTT_HOST="127.0.0.1",
        SLUICE_EXAMPLE_MQTT_PORT=str(refused_port),
        SLUICE_EXAMPLE_NATS=f"nats://{address}",
    )
    home.mkdir()
    assert run_cli("db", "migrate", env=env).returncode == 0
    log = tmp_path / "engine.log"
    proc = start_engine(env, log)
    db = Database(url)
    try:

        def failures() -> dict[str, int]:
            rows = db.call(
                lambda s: s.execute(
                    select(Asset.name, Trigger.id, Trigger.failure_count)
                    .join(AssetWatcher, AssetWatcher.asset_id == Asset.id)
                    .join(Trigger, Trigger.id == AssetWatcher.trigger_id)
                    .where(Asset.name.in_(BROKER_WATCHERS))
                ).all()
            )
            return {name: int(count or 0) for name, _, count in rows}

        wait_for(
            lambda: (
                (counts := failures()).keys() == set(BROKER_WATCHERS)
                and min(counts.values()) >= RETRIES
            ),
            timeout=180,
            step=0.5,
            what=f"every broker watcher to fail {RETRIES} times ({failures()})",
        )
        # Meanwhile the rest of the engine ran: the cron producer, then its consumer.
        wait_for(
            lambda: "Created asset-triggered run" in log.read_text(errors="replace"),
            timeout=120,
            step=0.5,
            what="the example consumer's run after the producer's",
        )
        trigger_ids = db.call(
            lambda s: dict(
                s.execute(
                    select(Trigger.id, Asset.name)
                    .join(AssetWatcher, AssetWatcher.trigger_id == Trigger.id)
                    .join(Asset, Asset.id == AssetWatcher.asset_id)
                    .where(Asset.name.in_(BROKER_WATCHERS))
                ).all()
            )
        )
    finally:
        code = stop(proc, timeout=60)
        db.dispose()
    text = log.read_text(errors="replace")
    assert code == 0, log_tail(log)
    assert "Traceback" not in text, text
    assert not [line for line in text.splitlines() if " ERROR " in line], text
    warned: dict[str, int] = {}
    for line in text.splitlines():
        if match := WARNING.search(line):
            name = trigger_ids.get(int(match[1]), f"trigger {match[1]}")
            warned[name] = warned.get(name, 0) + 1
            assert str(refused_port) in line  # the broker's address
            assert "retrying in 1s, then with a backoff doubling up to 60s" in line
    assert warned == dict.fromkeys(BROKER_WATCHERS, 1), text
