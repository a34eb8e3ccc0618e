"""Migrating a database that holds data keeps every row (SQLite rebuilds altered tables).

On SQLite, Alembic alters a column by copying the table, dropping it and renaming the copy;
with foreign keys on, the DROP cascaded to every row referencing the table: migration 0008
(``asset_event.dedup_key`` nullable) emptied the queue of unconsumed asset events and the
links of runs to their triggering events.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select, text

from engine.db.database import Database
from engine.db.models import AssetEventQueue, DagRunAssetEvent, TaskInstance, Trigger
from engine.db.schema import current_revision, head_revision, migrate

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]

NOW = datetime(2026, 11, 25, tzinfo=UTC).replace(tzinfo=None)


def _seed(db: Database) -> None:
    statements = [
        "INSERT INTO dag (dag_id, fileloc, is_paused, is_active) VALUES ('d', 'f.py', false, true)",
        "INSERT INTO asset (id, name, uri, extra, is_active, created_at, updated_at) "
        "VALUES (1, 'a', 'a', '{}', true, :now, :now)",
        "INSERT INTO asset_event (id, asset_id, payload, dedup_key, timestamp) "
        "VALUES (1, 1, '{}', 'k1', :now), (2, 1, '{}', 'k2', :now)",
        "INSERT INTO asset_event_queue (dag_id, asset_event_id, created_at) VALUES ('d', 1, :now)",
        "INSERT INTO dag_run (id, dag_id, run_id, run_type, state, queued_at) "
        "VALUES (1, 'd', 'r', 'asset_triggered', 'running', :now)",
        "INSERT INTO dag_run_asset_event (dag_run_id, asset_event_id) VALUES (1, 2)",
        "INSERT INTO trigger (id, classpath, kwargs, kind, created_date, failure_count) "
        "VALUES (1, 'triggers.temporal.DateTimeTrigger', 'x', 'task', :now, 0)",
        "INSERT INTO task_instance (id, dag_run_id, dag_id, task_id, state, try_number, "
        "max_tries, trigger_id, runtime_s, deferral_count) "
        "VALUES (1, 1, 'd', 't', 'deferred', 1, 0, 1, 0, 0)",
    ]
    db.call(lambda s: [s.execute(text(sql), {"now": NOW}) for sql in statements])


def _counts(db: Database) -> dict[str, int]:
    def read(s):
        return {
            "queue": s.execute(select(func.count()).select_from(AssetEventQueue)).scalar_one(),
            "run_events": s.execute(
                select(func.count()).select_from(DagRunAssetEvent)
            ).scalar_one(),
            "deferred_on_trigger": s.execute(
                select(func.count())
                .select_from(TaskInstance)
                .where(TaskInstance.trigger_id.is_not(None))
            ).scalar_one(),
            "triggers": s.execute(select(func.count()).select_from(Trigger)).scalar_one(),
        }

    return db.call(read)


def test_migrating_up_and_down_keeps_every_row(db_url: str) -> None:
    db = Database(db_url)
    try:
        migrate(db.engine, "0006")
        _seed(db)
        kept = {"queue": 1, "run_events": 1, "deferred_on_trigger": 1, "triggers": 1}
        assert _counts(db) == kept
        migrate(db.engine)
        assert current_revision(db.engine) == head_revision()
        assert _counts(db) == kept
        migrate(db.engine, "0006")
        assert current_revision(db.engine) == "0006"
        assert _counts(db) == kept
        migrate(db.engine)
        assert _counts(db) == kept
    finally:
        db.dispose()
