"""Deadline alerts: the DAG's alerts, and each run's deadlines

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29 00:10:00.000000

- ``dag``: ``deadline_alerts``, the DAG's ``deadline=`` alerts as JSON (None without any);
  rows written before this revision get it at their file's next parse.
- ``deadline``: one row per alert and run, written by the scheduler when it first sees the
  run: when the deadline falls (None when the reference has no value for the run), whether
  it was missed (its callback requested) and when.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import engine.db.models

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dag") as batch:
        batch.add_column(sa.Column("deadline_alerts", sa.JSON(), nullable=True))
    op.create_table(
        "deadline",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dag_run_id", sa.Integer(), nullable=False),
        sa.Column("alert_index", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=250), nullable=True),
        sa.Column("reference", sa.String(length=100), nullable=False),
        sa.Column("deadline_time", engine.db.models.UtcDateTime(), nullable=True),
        sa.Column("alert", sa.JSON(), nullable=False),
        sa.Column("missed", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("missed_at", engine.db.models.UtcDateTime(), nullable=True),
        sa.Column("created_at", engine.db.models.UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["dag_run_id"],
            ["dag_run.id"],
            name=op.f("fk_deadline_dag_run_id_dag_run"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deadline")),
        sa.UniqueConstraint(
            "dag_run_id", "alert_index", name=op.f("uq_deadline_dag_run_id_alert_index")
        ),
    )
    op.create_index(
        op.f("ix_deadline_missed_deadline_time"), "deadline", ["missed", "deadline_time"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_deadline_missed_deadline_time"), table_name="deadline")
    op.drop_table("deadline")
    with op.batch_alter_table("dag") as batch:
        batch.drop_column("deadline_alerts")
