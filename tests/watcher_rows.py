"""Watchers as the DAG processor would store them, and the real triggerer that runs them.

For the integration tests that drive a broker trigger through the engine's triggerer on
SQLite: ``seed_watchers`` writes one asset per trigger, watched by it (the trigger row holds
its ``serialize()`` output, encrypted as the DAG processor stores it); ``fast_triggerer``
claims them at once; ``asset_events`` reads back what the persister stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import insert, select

from engine.db.models import Asset, AssetEvent, AssetWatcher
from engine.db.queries import triggers as trigger_rows
from engine.states import TriggerKind
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer

if TYPE_CHECKING:
    from collections.abc import Mapping

    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from triggers.base import BaseEventTrigger

#: claims new rows within 50 ms, gives a stopping watcher 5 s
FAST_TRIGGERER: TriggererSettings = TriggererSettings(
    capacity=10, heartbeat_s=1, claim_idle_interval_s=0.05, shutdown_grace_s=5
)


def seed_watchers(
    db: Database, cipher: KwargsCipher, triggers: Mapping[str, BaseEventTrigger]
) -> dict[str, int]:
    """One asset per trigger, named by its key and watched by it: asset name -> id."""

    def seed(session: Any) -> dict[str, int]:
        assets = {}
        for name, trigger in triggers.items():
            asset_id = session.execute(
                insert(Asset).values(name=name, uri=f"test://{name}", extra={}).returning(Asset.id)
            ).scalar_one()
            classpath, kwargs = trigger.serialize()
            tid = trigger_rows.add_trigger_row(
                session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )
            assets[name] = asset_id
        return assets

    return db.call(seed)


def asset_events(db: Database) -> list[tuple[int, str]]:
    """(asset id, dedup key) of every stored asset event."""
    return db.call(
        lambda s: [(e.asset_id, e.dedup_key) for e in s.execute(select(AssetEvent)).scalars()]
    )


def keyed_asset_events(db: Database) -> list[tuple[int, str, str | None]]:
    """(asset id, dedup key, partition key) of every stored asset event."""
    return db.call(
        lambda s: [
            (e.asset_id, e.dedup_key, e.partition_key)
            for e in s.execute(select(AssetEvent)).scalars()
        ]
    )


def fast_triggerer(db: Database, cipher: KwargsCipher) -> Triggerer:
    """The engine's triggerer, with ``FAST_TRIGGERER``'s settings."""
    return Triggerer(db=db, cipher=cipher, settings=FAST_TRIGGERER)
