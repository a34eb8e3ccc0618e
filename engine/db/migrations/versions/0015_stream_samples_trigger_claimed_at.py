"""Shared-stream samples and when a trigger was claimed

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25 19:00:00.000000

- ``shared_stream_sample``: the last samples of each shared-stream group (a triggerer's
  group of one stream key: outstanding events, oldest unresolved age, counters) that
  triggerers write beside their snapshots, for advance rates and a short history;
- ``trigger.claimed_at``: when the current triggerer claimed the row.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import engine.db.models

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shared_stream_sample",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("triggerer_id", sa.Integer(), nullable=False),
        sa.Column("stream_key", sa.String(length=1000), nullable=False),
        sa.Column("sampled_at", engine.db.models.UtcDateTime(), nullable=False),
        sa.Column("outstanding", sa.Integer(), nullable=False),
        sa.Column("oldest_unresolved_age_s", sa.Float(), nullable=True),
        sa.Column("events_polled", sa.BigInteger(), nullable=False),
        sa.Column("advances", sa.BigInteger(), nullable=False),
        sa.Column("advanced_events", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["triggerer_id"],
            ["job.id"],
            name=op.f("fk_shared_stream_sample_triggerer_id_job"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_shared_stream_sample")),
    )
    op.create_index(
        op.f("ix_shared_stream_sample_triggerer_id_stream_key_id"),
        "shared_stream_sample",
        ["triggerer_id", "stream_key", "id"],
    )
    op.create_index(
        op.f("ix_shared_stream_sample_sampled_at"), "shared_stream_sample", ["sampled_at"]
    )
    with op.batch_alter_table("trigger") as batch:
        batch.add_column(sa.Column("claimed_at", engine.db.models.UtcDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trigger") as batch:
        batch.drop_column("claimed_at")
    op.drop_index(op.f("ix_shared_stream_sample_sampled_at"), table_name="shared_stream_sample")
    op.drop_index(
        op.f("ix_shared_stream_sample_triggerer_id_stream_key_id"),
        table_name="shared_stream_sample",
    )
    op.drop_table("shared_stream_sample")
