"""Notify schedulers of asset events queued for DAGs (PostgreSQL)

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-29 09:00:00.000000

- On PostgreSQL, a statement trigger on ``asset_event_queue`` sends a notification on the
  channel ``sluice_scheduler_work`` (``engine.db.listen.SCHEDULER_WORK_CHANNEL``) at the
  commit of every statement that queues events for DAGs. A triggerer's batch of watcher
  events is one autocommitted statement that did not notify: a scheduler in another process
  created their runs only at its next poll (a second while idle). The writes that notified
  themselves (API and CLI events, outlet events) now notify twice in one transaction, which
  PostgreSQL delivers once. SQLite: nothing (its listeners see every commit).
"""

from __future__ import annotations

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

# Kept here rather than imported: a migration states the schema as of its revision.
CHANNEL = "sluice_scheduler_work"

UPGRADE = (
    f"""
    CREATE OR REPLACE FUNCTION sluice_notify_scheduler_work() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('{CHANNEL}', '');
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE TRIGGER sluice_asset_events_queued AFTER INSERT ON asset_event_queue
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_notify_scheduler_work()
    """,
)

DOWNGRADE = (
    "DROP TRIGGER IF EXISTS sluice_asset_events_queued ON asset_event_queue",
    "DROP FUNCTION IF EXISTS sluice_notify_scheduler_work()",
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in UPGRADE:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in DOWNGRADE:
            op.execute(statement)
