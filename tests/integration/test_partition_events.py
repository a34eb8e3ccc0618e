"""Partition keys of asset events on SQLite and PostgreSQL: a watcher's keyed events through
the runtime, dedup and the persister (one statement per batch on PostgreSQL, executemany on
SQLite), and ``sluice assets emit --partition-key``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import select

from engine.db.models import Asset, AssetEvent, AssetEventQueue
from engine.states import TriggerKind
from engine.triggerer.outbox import FiredEvent, Outbox
from engine.triggerer.persister import Persister
from engine.triggerer.runtime import TriggerSpec
from tests.integration.test_backfill import add_dag, config, db, run_cli
from tests.integration.test_dedup import _asset, serving
from tests.persisting import persist
from tests.waiting import wait_until
from triggers.base import MAX_PARTITION_KEY_LENGTH, BaseEventTrigger, TriggerEvent

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from engine.config import Config
    from engine.db.database import Database

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]

__all__ = ("config", "db")  # the fixtures, used by name

OK: dict[str, Any] = {"status": "ok"}
HOUR_9, HOUR_10 = "2026-03-10T09:00:00", "2026-03-10T10:00:00"


def _stored(db: Database, asset_id: int) -> list[tuple[Any, str | None, str | None]]:
    rows = db.call(
        lambda s: s.execute(
            select(AssetEvent.payload, AssetEvent.dedup_key, AssetEvent.partition_key)
            .where(AssetEvent.asset_id == asset_id)
            .order_by(AssetEvent.id)
        ).all()
    )
    return [tuple(row) for row in rows]


class KeyFromField(BaseEventTrigger):
    """A watcher that takes each event's partition key from a field of its message (as a
    Kafka filter would), the delivery's offset as its dedup key; offset 1 comes twice."""

    dedup_by_payload = False
    messages = (
        ({"hour": HOUR_9, "n": 1}, "offset-1"),
        ({"hour": HOUR_9, "n": 1}, "offset-1"),  # a redelivery
        ({"hour": HOUR_10, "n": 2}, "offset-2"),
        ({"n": 3}, "offset-3"),  # no field: an unpartitioned event
    )

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.KeyFromField", {})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        for payload, offset in self.messages:
            yield TriggerEvent(payload, dedup_key=offset, partition_key=payload.get("hour"))
        await anyio.sleep_forever()


class SamePayloadPerHour(KeyFromField):
    """Equal payloads of two hours are two facts even when equal payloads are merged."""

    dedup_by_payload = True
    messages = (
        (OK, None),
        (OK, None),
        (OK, None),
    )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        for (payload, _), key in zip(self.messages, (HOUR_9, HOUR_9, HOUR_10), strict=True):
            yield TriggerEvent(payload, partition_key=key)
        await anyio.sleep_forever()


async def _watch(db: Database, trigger: BaseEventTrigger, fired: int) -> int:
    asset_id = _asset(db, "a")
    with anyio.fail_after(15):
        async with serving(db) as (runner, persister):
            runner.start(TriggerSpec(1, trigger, TriggerKind.WATCHER, watcher=(asset_id, "w")))
            await wait_until(lambda: runner.events_fired >= fired)
            await persister.wait_flushed()
    return asset_id


async def test_a_watchers_keyed_events_are_stored_with_their_keys_and_deduplicated(db) -> None:
    asset_id = await _watch(db, KeyFromField(), 4)
    assert _stored(db, asset_id) == [
        ({"hour": HOUR_9, "n": 1}, "offset-1", HOUR_9),  # the redelivery absorbed
        ({"hour": HOUR_10, "n": 2}, "offset-2", HOUR_10),
        ({"n": 3}, "offset-3", None),
    ]


async def test_payload_dedup_keeps_equal_payloads_of_two_partitions_apart(db) -> None:
    asset_id = await _watch(db, SamePayloadPerHour(), 3)
    assert [(payload, key) for payload, _, key in _stored(db, asset_id)] == [
        (OK, HOUR_9),
        (OK, HOUR_10),
    ]


def test_keyed_events_of_one_batch_are_stored_and_queued_for_the_dag(db: Database) -> None:
    add_dag(db, "on_a", timetable=None, assets=("a",))
    asset_id = _asset_id(db, "a")
    persister = Persister(db=db, outbox=Outbox())
    items = [
        FiredEvent(1, TriggerEvent(OK, partition_key=key), None, 0.0, (asset_id, "w"), dedup)
        for key, dedup in ((HOUR_9, "d1"), (HOUR_10, "d2"), (HOUR_10, "d2"), (None, None))
    ]
    assert persist(db, persister, items).asset_events == 3
    assert [key for _, _, key in _stored(db, asset_id)] == [HOUR_9, HOUR_10, None]
    queued = db.call(lambda s: s.execute(select(AssetEventQueue.dag_id)).scalars().all())
    assert queued == ["on_a"] * 3


class OwnInit(TriggerEvent):
    """A plugin's event whose __init__ skips TriggerEvent's (it sets what it needs)."""

    __slots__ = ()

    def __init__(self, payload: Any) -> None:
        self.payload, self.dedup_key, self.plain = payload, None, True


def test_an_event_of_a_subclass_without_a_key_is_stored_unpartitioned(db: Database) -> None:
    add_dag(db, "on_a", timetable=None, assets=("a",))
    asset_id = _asset_id(db, "a")
    persister = Persister(db=db, outbox=Outbox())
    item = FiredEvent(1, OwnInit(OK), None, 0.0, (asset_id, "w"), None)
    assert persist(db, persister, [item]).asset_events == 1
    assert _stored(db, asset_id) == [(OK, None, None)]
    assert repr(OwnInit(OK)) == "OwnInit<{'status': 'ok'}>"


def _asset_id(db: Database, name: str) -> int:
    return int(db.call(lambda s: s.execute(select(Asset.id).where(Asset.name == name)).scalar()))


def test_a_trigger_event_refuses_a_key_it_cannot_store() -> None:
    with pytest.raises(ValueError, match="251 characters long, more than the 250"):
        TriggerEvent(OK, partition_key="x" * (MAX_PARTITION_KEY_LENGTH + 1))
    with pytest.raises(ValueError, match="must be a str, got int"):
        TriggerEvent(OK, partition_key=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not be empty"):
        TriggerEvent.of_plain(OK, partition_key="")
    assert TriggerEvent(OK, partition_key="us") != TriggerEvent(OK, partition_key="eu")


def test_assets_emit_with_a_partition_key(db: Database, config: Config) -> None:
    add_dag(db, "on_a", timetable=None, assets=("a",))
    result = run_cli(config, "assets", "emit", "a", "--partition-key", HOUR_9)
    assert result.exit_code == 0, result.output
    event_id = int(result.stdout.split()[2])
    event = db.call(lambda s: s.get(AssetEvent, event_id))
    assert event is not None and event.partition_key == HOUR_9
    too_long = run_cli(config, "assets", "emit", "a", "--partition-key", "k" * 251)
    assert too_long.exit_code == 1
    assert "--partition-key: partition key 'kkkk" in too_long.stderr
    assert "more than the 250 a partition key may have" in too_long.stderr
    assert len(db.call(lambda s: s.execute(select(AssetEvent.id)).all())) == 1
