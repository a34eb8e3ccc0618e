"""trigger stream digest: one owner per shared-stream key across triggerers

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 05:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows keep NULL: the triggerer that loads such a row computes its digest and
    # hands the row back to be claimed with its group (engine.triggerer).
    with op.batch_alter_table("trigger") as batch:
        batch.add_column(sa.Column("stream_digest", sa.String(length=64), nullable=True))
        batch.create_index(
            batch.f("ix_trigger_stream_digest_triggerer_id"), ["stream_digest", "triggerer_id"]
        )
        batch.create_index(
            batch.f("ix_trigger_triggerer_id_stream_digest"), ["triggerer_id", "stream_digest"]
        )


def downgrade() -> None:
    with op.batch_alter_table("trigger") as batch:
        batch.drop_index(batch.f("ix_trigger_triggerer_id_stream_digest"))
        batch.drop_index(batch.f("ix_trigger_stream_digest_triggerer_id"))
        batch.drop_column("stream_digest")
