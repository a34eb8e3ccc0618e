"""Notify triggerers of new trigger rows (PostgreSQL)

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 13:00:00.000000

- On PostgreSQL, two row triggers on ``trigger`` send a notification on the channel
  ``sluice_trigger_rows`` (``engine.db.queries.claims.NEW_TRIGGER_ROWS_CHANNEL``) when a
  row is inserted unassigned or is unassigned (a triggerer released it): a running
  triggerer that LISTENs claims it at once instead of at its next poll. Notifications are
  sent at commit and coalesced per transaction (same channel, same empty payload), so a
  burst of 10,000 rows in one transaction is one notification. SQLite has no such thing:
  nothing to do.
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
    CREATE OR REPLACE FUNCTION sluice_notify_trigger_rows() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('{CHANNEL}', '');
        RETURN NULL;
    END
    $$
    """,
    # Row triggers with a WHEN clause: the condition is checked without calling the function,
    # so a claim (which sets triggerer_id) costs nothing; statement triggers with transition
    # tables added about 0.7 ms to every single-row INSERT (a task's deferral).
    """
    CREATE TRIGGER sluice_trigger_rows_inserted AFTER INSERT ON trigger
    FOR EACH ROW WHEN (NEW.triggerer_id IS NULL)
    EXECUTE FUNCTION sluice_notify_trigger_rows()
    """,
    """
    CREATE TRIGGER sluice_trigger_rows_released AFTER UPDATE OF triggerer_id ON trigger
    FOR EACH ROW WHEN (NEW.triggerer_id IS NULL AND OLD.triggerer_id IS NOT NULL)
    EXECUTE FUNCTION sluice_notify_trigger_rows()
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
