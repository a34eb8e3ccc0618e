"""Trigger rules and retry delays

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 14:00:00.000000

- ``dag_task``: ``trigger_rule``, ``retry_delay_s``, ``retry_exponential_backoff``,
  ``max_retry_delay_s``;
- ``task_instance``: ``next_retry_at`` (an ``up_for_retry`` try waits until then).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from engine.db.models import UtcDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dag_task") as batch:
        batch.add_column(
            sa.Column(
                "trigger_rule", sa.String(length=50), server_default="all_success", nullable=False
            )
        )
        batch.add_column(
            sa.Column("retry_delay_s", sa.Float(), server_default="300", nullable=False)
        )
        batch.add_column(
            sa.Column(
                "retry_exponential_backoff",
                sa.Boolean(),
                server_default=sa.false(),
                nullable=False,
            )
        )
        batch.add_column(sa.Column("max_retry_delay_s", sa.Float(), nullable=True))
    with op.batch_alter_table("task_instance") as batch:
        batch.add_column(sa.Column("next_retry_at", UtcDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("task_instance") as batch:
        batch.drop_column("next_retry_at")
    with op.batch_alter_table("dag_task") as batch:
        batch.drop_column("max_retry_delay_s")
        batch.drop_column("retry_exponential_backoff")
        batch.drop_column("retry_delay_s")
        batch.drop_column("trigger_rule")
