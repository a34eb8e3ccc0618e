"""trigger last failure date

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import engine.db.models

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trigger") as batch:
        batch.add_column(
            sa.Column("last_failure_date", engine.db.models.UtcDateTime(), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("trigger") as batch:
        batch.drop_column("last_failure_date")
