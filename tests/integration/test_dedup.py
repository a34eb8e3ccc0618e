"""Deduplication recognises redeliveries, never equal payloads (runner -> outbox -> database).

Each test runs real triggers in the runtime, and the persister stores what they fired on
SQLite and on PostgreSQL: two genuine events with equal payloads are two asset events, a
redelivery (same broker coordinates, same SQS message id, same file) is one.
"""

from __future__ import annotations

import math
import os
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import pytest
from sqlalchemy import insert, select

from engine.db.database import Database
from engine.db.models import Asset, AssetEvent
from engine.states import TriggerKind
from engine.triggerer.outbox import FiredEvent, Outbox
from engine.triggerer.persister import Persister
from engine.triggerer.runtime import TriggerRunner, TriggerSpec
from producers import KafkaMessage, KafkaMessageTrigger, SqsMessageTrigger
from producers.sqs_core import SqsMessage
from tests.persisting import persist
from tests.waiting import wait_until
from triggers.base import TriggerEvent
from triggers.file import FileDeleteTrigger
from triggers.serde import payload_digest
from triggers.testing import ReplayTrigger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

    from triggers.base import BaseTrigger

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]

OK: dict[str, Any] = {"status": "ok"}


@pytest.fixture
def db(migrated_db_url: str) -> Iterator[Database]:
    database = Database(migrated_db_url)
    yield database
    database.dispose()


def _asset(db: Database, name: str) -> int:
    return int(
        db.call(
            lambda s: s.execute(
                insert(Asset).values(name=name, uri=f"test://{name}", extra={}).returning(Asset.id)
            ).scalar_one()
        )
    )


def _events(db: Database, asset_id: int) -> list[tuple[Any, str | None]]:
    rows = db.call(
        lambda s: s.execute(
            select(AssetEvent.payload, AssetEvent.dedup_key)
            .where(AssetEvent.asset_id == asset_id)
            .order_by(AssetEvent.id)
        ).all()
    )
    return [(payload, key) for payload, key in rows]


@asynccontextmanager
async def serving(db: Database) -> AsyncIterator[tuple[TriggerRunner, Persister]]:
    """The runtime and the persister, as the triggerer wires them (without the claim loop)."""
    outbox = Outbox()
    runner = TriggerRunner(outbox=outbox)
    persister = Persister(db=db, outbox=outbox)
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        await tg.start(persister.run)
        yield runner, persister
        await runner.aclose(grace_s=1.0)
        outbox.close()


async def stored(
    db: Database, trigger: BaseTrigger, fired: int, *, until: Callable[[], bool] | None = None
) -> list[tuple[Any, str | None]]:
    """Run ``trigger`` as a watcher until it fired ``fired`` events, all persisted."""
    asset_id = _asset(db, "a")
    with anyio.fail_after(15):
        async with serving(db) as (runner, persister):
            runner.start(TriggerSpec(1, trigger, TriggerKind.WATCHER, watcher=(asset_id, "w")))
            await wait_until(lambda: runner.events_fired >= fired)
            await persister.wait_flushed()
    return _events(db, asset_id)


class PayloadDedupReplay(ReplayTrigger):
    dedup_by_payload = True


async def test_a_sensor_sending_the_same_payload_twice_makes_two_asset_events(db) -> None:
    rows = await stored(db, ReplayTrigger(((OK, None), (OK, None))), 2)
    assert rows == [(OK, None), (OK, None)]


async def test_an_event_key_still_absorbs_a_redelivery(db) -> None:
    rows = await stored(db, ReplayTrigger(((OK, "k"), (OK, "k"), (OK, None))), 3)
    assert rows == [(OK, "k"), (OK, None)]


async def test_a_trigger_that_asks_for_payload_dedup_gets_it(db) -> None:
    events = ((OK, None), (OK, None), ({"status": "late"}, None), (OK, "own-key"))
    rows = await stored(db, PayloadDedupReplay(events), 4)
    assert rows == [
        (OK, payload_digest(OK)),
        ({"status": "late"}, payload_digest({"status": "late"})),
        (OK, "own-key"),  # an event's own key wins over its payload
    ]


async def test_the_persister_stores_the_key_the_fired_event_carries(db) -> None:
    asset_id = _asset(db, "a")
    persister = Persister(db=db, outbox=Outbox())
    items = [
        FiredEvent(1, TriggerEvent(OK), None, 0.0, (asset_id, "w"), dedup_key=key)
        for key in ("hook", "hook", None, None)
    ]
    result = persist(db, persister, items)
    assert result.asset_events == 3
    assert _events(db, asset_id) == [(OK, "hook"), (OK, None), (OK, None)]


# -- the built-in triggers --------------------------------------------------------------


def _kafka(offset: int, value: bytes = b'{"status": "ok"}') -> KafkaMessage:
    return KafkaMessage("orders", 0, offset, b"k", value, timestamp_ms=1_000)


class ReplayedKafka(KafkaMessageTrigger):
    """A Kafka watcher fed a fixed list of records: offset 3 comes twice (a redelivery)."""

    messages: ClassVar[list[KafkaMessage]] = [_kafka(3), _kafka(3), _kafka(4)]

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async def records() -> AsyncIterator[KafkaMessage]:
            for message in self.messages:
                yield message
            await anyio.sleep(math.inf)

        async for event in self.filter_shared_stream(records()):
            yield event


async def test_a_redelivered_kafka_message_is_one_asset_event(db) -> None:
    trigger = ReplayedKafka(topics=["orders"], bootstrap_servers="b:9092", group_id="g")
    rows = await stored(db, trigger, 3)
    assert [key for _, key in rows] == ["kafka:orders:0:3", "kafka:orders:0:4"]
    assert [payload["value"] for payload, _ in rows] == [OK, OK]


def _sqs(message_id: str, receive_count: int) -> SqsMessage:
    attributes = {"ApproximateReceiveCount": str(receive_count)}
    return SqsMessage(message_id, OK, '{"status": "ok"}', attributes, {}, None)


class ReplayedSqs(SqsMessageTrigger):
    """An SQS watcher fed m-1, m-1 again (received a second time), then m-2 (same body)."""

    messages: ClassVar[list[SqsMessage]] = [_sqs("m-1", 1), _sqs("m-1", 2), _sqs("m-2", 1)]

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async def messages() -> AsyncIterator[SqsMessage]:
            for message in self.messages:
                yield message
            await anyio.sleep(math.inf)

        async for event in self.filter_shared_stream(messages()):
            yield event


async def test_a_redelivered_sqs_message_is_one_asset_event(db) -> None:
    # The redelivery's payload differs (its receive count): only its message id says so.
    trigger = ReplayedSqs(queue_url="http://sqs.local/000000000000/q")
    rows = await stored(db, trigger, 3)
    assert [key for _, key in rows] == ["sqs:m-1", "sqs:m-2"]
    assert [payload["body"] for payload, _ in rows] == [OK, OK]


async def test_a_file_replaced_within_its_mtime_is_two_asset_events(db, tmp_path: Path) -> None:
    # The same path, size and mtime twice: only the file's identity tells them apart.
    flag, keep = tmp_path / "ready.flag", tmp_path / "keep"
    keep.mkdir()
    asset_id = _asset(db, "a")
    trigger = FileDeleteTrigger(str(flag), poke_interval=0.01)
    with anyio.fail_after(15):
        async with serving(db) as (runner, persister):
            runner.start(TriggerSpec(1, trigger, TriggerKind.WATCHER, watcher=(asset_id, "w")))
            for n in range(2):
                staged = keep / str(n)
                staged.write_text("x")
                os.utime(staged, ns=(5_000_000_000, 5_000_000_000))
                # A second link keeps the inode alive: the next file cannot reuse its number.
                os.link(staged, tmp_path / "staged")
                os.rename(tmp_path / "staged", flag)
                await wait_until(lambda n=n: runner.events_fired > n)
            await persister.wait_flushed()
    rows = _events(db, asset_id)
    assert [payload for payload, _ in rows] == [{"filepath": str(flag), "mtime": 5.0}] * 2
    first, second = (key for _, key in rows)
    assert first is not None and second is not None and first != second
    assert all(key.endswith(f":{flag}") for key in (first, second))
