"""Notify executors of task instances made scheduled (PostgreSQL)

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27 16:00:00.000000

- On PostgreSQL, two row triggers on ``task_instance`` send a notification on the channel
  ``sluice_scheduled_tasks`` (``engine.db.queries.tasks.SCHEDULED_TASKS_CHANNEL``) when a
  row is inserted ``scheduled`` or becomes ``scheduled`` (the scheduler readied it, a
  triggerer resumed it after its deferral, a retry is due, an interrupted step is
  requeued): an executor that LISTENs claims it at once instead of at its next poll. As
  with 0018, notifications are sent at commit and coalesced per transaction, and the WHEN
  clauses keep every other write to the table free of the function call. SQLite: nothing.
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# Kept here rather than imported: a migration states the schema as of its revision.
CHANNEL = "sluice_scheduled_tasks"

UPGRADE = (
    f"""
    CREATE OR REPLACE FUNCTION sluice_notify_scheduled_tasks() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('{CHANNEL}', '');
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE TRIGGER sluice_task_instance_inserted_scheduled AFTER INSERT ON task_instance
    FOR EACH ROW WHEN (NEW.state = 'scheduled')
    EXECUTE FUNCTION sluice_notify_scheduled_tasks()
    """,
    """
    CREATE TRIGGER sluice_task_instance_scheduled AFTER UPDATE OF state ON task_instance
    FOR EACH ROW WHEN (NEW.state = 'scheduled' AND OLD.state IS DISTINCT FROM 'scheduled')
    EXECUTE FUNCTION sluice_notify_scheduled_tasks()
    """,
)

DOWNGRADE = (
    "DROP TRIGGER IF EXISTS sluice_task_instance_scheduled ON task_instance",
    "DROP TRIGGER IF EXISTS sluice_task_instance_inserted_scheduled ON task_instance",
    "DROP FUNCTION IF EXISTS sluice_notify_scheduled_tasks()",
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in UPGRADE:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in DOWNGRADE:
            op.execute(statement)
