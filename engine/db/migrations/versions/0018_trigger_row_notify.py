"""Notify triggerers of new trigger rows (PostgreSQL)

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 13:00:00.000000

- On PostgreSQL, two statement-level triggers on ``trigger`` send a notification on the
  channel ``sluice_trigger_rows`` (``engine.db.queries.claims.NEW_TRIGGER_ROWS_CHANNEL``)
  when a statement inserts rows or leaves rows unassigned (a triggerer released them): a
  running triggerer that LISTENs claims them at once instead of at its next poll.
  Notifications are sent at commit and coalesced per transaction, so a burst of 10,000
  rows in one transaction is one notification. SQLite has no such thing: nothing to do.
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# Kept here rather than imported: a migration states the schema as of its revision.
CHANNEL = "sluice_trigger_rows"

UPGRADE = (
    f"""
    CREATE FUNCTION sluice_notify_trigger_rows() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM new_rows WHERE triggerer_id IS NULL) THEN
            PERFORM pg_notify('{CHANNEL}', '');
        END IF;
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE TRIGGER sluice_trigger_rows_inserted AFTER INSERT ON trigger
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_notify_trigger_rows()
    """,
    """
    CREATE TRIGGER sluice_trigger_rows_released AFTER UPDATE ON trigger
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_notify_trigger_rows()
    """,
)

DOWNGRADE = (
    "DROP TRIGGER IF EXISTS sluice_trigger_rows_released ON trigger",
    "DROP TRIGGER IF EXISTS sluice_trigger_rows_inserted ON trigger",
    "DROP FUNCTION IF EXISTS sluice_notify_trigger_rows()",
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in UPGRADE:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in DOWNGRADE:
            op.execute(statement)
