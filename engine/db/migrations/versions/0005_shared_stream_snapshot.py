"""shared stream snapshot

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 09:10:41.502113
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import engine.db.models

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shared_stream_snapshot",
        sa.Column("triggerer_id", sa.Integer(), nullable=False),
        sa.Column("stream_key", sa.String(length=1000), nullable=False),
        sa.Column("mode", sa.String(length=10), nullable=False),
        sa.Column("subscribers", sa.Integer(), nullable=False),
        sa.Column("queue_high_water", sa.Integer(), nullable=False),
        sa.Column("outstanding_by_lane", sa.JSON(), nullable=False),
        sa.Column("oldest_unresolved_age_s", sa.Float(), nullable=True),
        sa.Column("events_polled", sa.BigInteger(), nullable=False),
        sa.Column("deliveries", sa.BigInteger(), nullable=False),
        sa.Column("advances", sa.BigInteger(), nullable=False),
        sa.Column("advanced_events", sa.BigInteger(), nullable=False),
        sa.Column("last_advance_batch", sa.Integer(), nullable=False),
        sa.Column("advance_latency_sum_s", sa.Float(), nullable=False),
        sa.Column("overflows", sa.Integer(), nullable=False),
        sa.Column("ack_timeouts", sa.Integer(), nullable=False),
        sa.Column("rejects", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", engine.db.models.UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["triggerer_id"],
            ["job.id"],
            name=op.f("fk_shared_stream_snapshot_triggerer_id_job"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "triggerer_id", "stream_key", name=op.f("pk_shared_stream_snapshot")
        ),
    )


def downgrade() -> None:
    op.drop_table("shared_stream_snapshot")
