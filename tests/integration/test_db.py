"""Migrations, schema checks and trigger-row queries on SQLite and on real PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import OperationalError

from engine.db import models
from engine.db.database import Database, create_db_engine
from engine.db.models import Job, Trigger
from engine.db.queries import jobs
from engine.db.queries import triggers as trigger_rows
from engine.db.schema import (
    check_schema,
    current_revision,
    head_revision,
    migrate,
    reset,
    schema_drift,
)
from engine.exceptions import SchemaNotCurrentError
from engine.states import TriggerKind
from engine.triggerer.triggerer import claiming

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]

TABLES = {
    "trigger",
    "job",
    "dag",
    "asset",
    "asset_watcher",
    "asset_event",
    "dag_run",
    "task_instance",
    "dag_run_asset_event",
    "alembic_version",
}


@pytest.fixture
def database(db_url: str):
    db = Database(db_url)
    migrate(db.engine)
    yield db
    db.dispose()


def test_migrate_from_empty_reaches_head_with_no_drift(db_url: str) -> None:
    db = Database(db_url)
    try:
        with pytest.raises(SchemaNotCurrentError, match="sluice db migrate"):
            check_schema(db.engine)
        before, head = migrate(db.engine)
        assert before is None
        assert head == head_revision() == current_revision(db.engine)
        assert TABLES <= set(inspect(db.engine).get_table_names())
        assert schema_drift(db.engine) == []
        check_schema(db.engine)
        assert migrate(db.engine) == (head, head)  # idempotent
    finally:
        db.dispose()


def test_reset_drops_data_and_recreates_schema(database: Database) -> None:
    database.call(lambda s: jobs.start_job(s, job_type="triggerer"))
    reset(database.engine)
    check_schema(database.engine)
    assert database.call(lambda s: s.execute(select(Job)).all()) == []


def test_sqlite_connections_use_wal_and_foreign_keys(sqlite_url: str) -> None:
    db = Database(sqlite_url)
    try:
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    finally:
        db.dispose()


def test_sqlite_read_only_transaction_does_not_wait_for_a_writer(sqlite_url: str) -> None:
    """A writer holds the write lock (another process's claim, say); a read-only transaction
    reads the last committed state meanwhile, and a read-write one would wait for it."""
    db = Database(sqlite_url)
    migrate(db.engine)
    other = create_db_engine(sqlite_url)
    try:
        db.call(lambda s: jobs.start_job(s, job_type="triggerer"))
        with other.begin() as writer:  # BEGIN IMMEDIATE: holds the write lock
            writer.execute(text("UPDATE job SET hostname = 'uncommitted'"))
            hostnames = db.call(
                lambda s: s.execute(select(Job.hostname)).scalars().all(), read_only=True
            )
            assert hostnames and "uncommitted" not in hostnames
            with db.engine.connect() as conn:
                conn.connection.driver_connection.execute("PRAGMA busy_timeout=0")
                with pytest.raises(OperationalError, match="locked"):
                    conn.begin()  # the read-write BEGIN IMMEDIATE needs the lock
                conn.invalidate()  # not back into the pool with that timeout
    finally:
        other.dispose()
        db.dispose()


def _insert_triggers(db: Database, n: int) -> list[int]:
    def add(session):
        return [
            trigger_rows.add_trigger_row(
                session,
                _PlainCipher(),
                "triggers.temporal.DateTimeTrigger",
                {"i": i},
                kind=TriggerKind.TASK,
            )
            for i in range(n)
        ]

    return db.call(add)


class _PlainCipher:
    """Stands in for the Fernet cipher where encryption is not what is under test."""

    def encrypt_kwargs(self, kwargs, *, owner):
        return repr(sorted(kwargs.items()))


def test_claim_respects_capacity_and_is_disjoint_between_triggerers(database: Database) -> None:
    ids = _insert_triggers(database, 25)
    a = database.call(lambda s: jobs.start_job(s, job_type="triggerer"))
    b = database.call(lambda s: jobs.start_job(s, job_type="triggerer"))
    got_a = database.call(
        lambda s: claiming.claim_round(s, triggerer_id=a, capacity_left=10, threshold_s=30).rows
    )
    got_b = database.call(
        lambda s: claiming.claim_round(s, triggerer_id=b, capacity_left=100, threshold_s=30).rows
    )
    assert len(got_a) == 10
    assert len(got_b) == 15
    assert {r.id for r in got_a} | {r.id for r in got_b} == set(ids)
    assert not {r.id for r in got_a} & {r.id for r in got_b}
    assert database.call(lambda s: trigger_rows.owned_trigger_ids(s, triggerer_id=a)) == {
        r.id for r in got_a
    }


def test_rows_of_a_dead_triggerer_are_taken_over(database: Database) -> None:
    _insert_triggers(database, 5)
    dead = database.call(lambda s: jobs.start_job(s, job_type="triggerer"))
    database.call(
        lambda s: claiming.claim_round(s, triggerer_id=dead, capacity_left=5, threshold_s=30).rows
    )
    alive = database.call(lambda s: jobs.start_job(s, job_type="triggerer"))
    # While the owner heartbeats, nothing is taken over.
    assert (
        database.call(
            lambda s: (
                claiming.claim_round(s, triggerer_id=alive, capacity_left=5, threshold_s=30).rows
            )
        )
        == []
    )
    database.call(
        lambda s: s.execute(
            text("UPDATE job SET latest_heartbeat = :old WHERE id = :id"),
            {"old": models.utcnow().replace(year=2000, tzinfo=None), "id": dead},
        )
    )
    taken = database.call(
        lambda s: claiming.claim_round(s, triggerer_id=alive, capacity_left=5, threshold_s=30).rows
    )
    assert len(taken) == 5
    assert database.call(lambda s: trigger_rows.release_triggers(s, triggerer_id=alive)) == 5
    owners = database.call(lambda s: set(s.execute(select(Trigger.triggerer_id)).scalars()))
    assert owners == {None}


def test_a_watchers_last_event_is_read_on_its_own_index(database: Database) -> None:
    """``sluice dags why`` reads each watcher's latest event: on the (asset_id,
    source_watcher, id) index of migration 0016, not by scanning its asset's events."""
    from sqlalchemy.dialects import sqlite

    from engine.db.models import AssetEvent

    indexes = {
        tuple(ix["column_names"]): ix["name"]
        for ix in inspect(database.engine).get_indexes("asset_event")
    }
    name = "ix_asset_event_asset_id_source_watcher_id"
    assert indexes.get(("asset_id", "source_watcher", "id")) == name
    if not database.is_sqlite:
        return
    query = (
        select(AssetEvent.timestamp)
        .where(AssetEvent.asset_id == 1, AssetEvent.source_watcher == "w")
        .order_by(AssetEvent.id.desc())
        .limit(1)
    )
    compiled = query.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True})
    with database.engine.connect() as conn:
        plan = " ".join(
            str(row[-1]) for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}")
        )
    assert name in plan, plan
