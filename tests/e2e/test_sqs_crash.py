"""A ``sluice triggerer`` draining an SQS queue is killed (-9) mid-run and restarted.

Two watchers (even / odd ``n``) share one queue of N = 2,000 messages (moto's SQS keeps
test loads to a few thousand; about 15-25 s here). The first triggerer is killed once a
fraction of the asset events are committed; the second takes its trigger rows over after
the heartbeat threshold, and the messages the first had in flight come back after their
visibility timeout. At the end every message has exactly one asset event (on the right
asset), none lost, none duplicated, and the queue is empty.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import func, insert, select

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, AssetWatcher
from engine.db.queries import triggers as trigger_rows
from engine.states import TriggerKind
from producers import SqsMessageTrigger
from tests.e2e.helpers import sluice_env, start_cli, stop, wait_for

if TYPE_CHECKING:
    from pathlib import Path

    from tests.services_sqs import SqsEndpoint

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

N_MESSAGES = 2000
VISIBILITY_TIMEOUT_S = 5
HEARTBEAT_S = 1.0
KILL_AFTER_EVENTS = N_MESSAGES // 4


def _client(endpoint: SqsEndpoint) -> Any:
    return boto3.client("sqs", **endpoint.client_kwargs())


def _send(client: Any, url: str) -> list[str]:
    ids = []
    for start in range(0, N_MESSAGES, 10):
        entries = [
            {"Id": str(n), "MessageBody": json.dumps({"n": n, "parity": n % 2})}
            for n in range(start, start + 10)
        ]
        response = client.send_message_batch(QueueUrl=url, Entries=entries)
        assert not response.get("Failed")
        by_id = {item["Id"]: item["MessageId"] for item in response["Successful"]}
        ids.extend(by_id[e["Id"]] for e in entries)
    return ids


def _seed(db: Database, cipher: KwargsCipher, endpoint: SqsEndpoint, url: str) -> dict[int, int]:
    """Two watchers on the queue; returns parity -> asset id."""

    def seed(session: Any) -> dict[int, int]:
        assets = {}
        for parity in (0, 1):
            asset_id = session.execute(
                insert(Asset)
                .values(name=f"parity-{parity}", uri=f"test://parity-{parity}", extra={})
                .returning(Asset.id)
            ).scalar_one()
            trigger = SqsMessageTrigger(
                queue_url=url,
                body_filter={"parity": parity},
                wait_time_s=1,
                **endpoint.client_kwargs(),
            )
            classpath, kwargs = trigger.serialize()
            tid = trigger_rows.add_trigger_row(
                session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )
            assets[parity] = asset_id
        return assets

    return db.call(seed)


def _event_count(db: Database) -> int:
    return int(db.call(lambda s: s.execute(select(func.count(AssetEvent.id))).scalar_one()))


def _queue_empty(client: Any, url: str) -> bool:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return all(attributes[name] == "0" for name in names)


def test_kill_9_mid_run_loses_and_duplicates_nothing(
    sqs_endpoint: SqsEndpoint, sqs_queue_name: str, tmp_path: Path, migrated_sqlite_url: str
) -> None:
    client = _client(sqs_endpoint)
    url = client.create_queue(
        QueueName=sqs_queue_name, Attributes={"VisibilityTimeout": str(VISIBILITY_TIMEOUT_S)}
    )["QueueUrl"]
    db_url = migrated_sqlite_url
    db = Database(db_url)
    key = Fernet.generate_key().decode()
    assets = _seed(db, KwargsCipher(key), sqs_endpoint, url)
    ids = _send(client, url)
    env = sluice_env(
        tmp_path / "home",
        SLUICE__CORE__SQL_ALCHEMY_CONN=db_url,
        SLUICE__CORE__FERNET_KEY=key,
        SLUICE__TRIGGERER__JOB_HEARTBEAT_SEC=str(HEARTBEAT_S),
    )

    first = start_cli("triggerer", env=env, log=tmp_path / "first.log")
    second = None
    try:
        wait_for(
            lambda: _event_count(db) >= KILL_AFTER_EVENTS,
            timeout=30,
            what=f"the first triggerer to commit {KILL_AFTER_EVENTS} asset events",
        )
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        at_kill = _event_count(db)
        assert at_kill < N_MESSAGES, "the run ended before the kill: raise N_MESSAGES"

        second = start_cli("triggerer", env=env, log=tmp_path / "second.log")
        wait_for(
            lambda: _event_count(db) >= N_MESSAGES and _queue_empty(client, url),
            timeout=60,
            what="the restarted triggerer to drain the queue",
        )
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        if second is not None:
            assert stop(second) == 0

    rows = db.call(lambda s: s.execute(select(AssetEvent.asset_id, AssetEvent.dedup_key)).all())
    per_message = Counter(dedup_key for _, dedup_key in rows)
    assert set(per_message) == {f"sqs:{message_id}" for message_id in ids}  # none lost
    assert max(per_message.values()) == 1  # none duplicated
    expected = {f"sqs:{message_id}": assets[n % 2] for n, message_id in enumerate(ids)}
    assert all(expected[dedup_key] == asset_id for asset_id, dedup_key in rows)
    db.dispose()
