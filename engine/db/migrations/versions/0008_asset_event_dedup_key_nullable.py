"""asset_event.dedup_key nullable: an event without a delivery key is never deduplicated

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 06:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Dedup recognises redeliveries by their broker-derived key; an event without one is
    # stored with NULL, which the (asset_id, dedup_key) unique constraint never matches on
    # PostgreSQL or SQLite. Existing rows keep their keys (payload digests included).
    with op.batch_alter_table("asset_event") as batch:
        batch.alter_column("dedup_key", existing_type=sa.String(length=512), nullable=True)


def downgrade() -> None:
    # Give every keyless event a key of its own, so none of them is merged by the constraint.
    op.execute("UPDATE asset_event SET dedup_key = 'event:' || id WHERE dedup_key IS NULL")
    with op.batch_alter_table("asset_event") as batch:
        batch.alter_column("dedup_key", existing_type=sa.String(length=512), nullable=False)
