"""State stores: the task state store and the asset state store (AIP-103)

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-29 01:00:00.000000

- ``task_state_store``: a task instance's JSON values by key, kept across its tries (the row
  of a task instance stands for dag_id + run_id + task_id + map_index), deleted with it;
  ``expires_at`` says when ``sluice db clean`` may delete one (None: never), indexed for it.
- ``asset_state_store``: an asset's JSON values by key, kept across runs, deleted with the
  asset.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import engine.db.models

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_state_store",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_instance_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=512), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("updated_at", engine.db.models.UtcDateTime(), nullable=False),
        sa.Column("expires_at", engine.db.models.UtcDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["task_instance_id"],
            ["task_instance.id"],
            name=op.f("fk_task_state_store_task_instance_id_task_instance"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_state_store")),
        sa.UniqueConstraint(
            "task_instance_id", "key", name=op.f("uq_task_state_store_task_instance_id_key")
        ),
    )
    op.create_index(op.f("ix_task_state_store_expires_at"), "task_state_store", ["expires_at"])
    op.create_table(
        "asset_state_store",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("asset_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=512), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("updated_at", engine.db.models.UtcDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["asset_id"],
            ["asset.id"],
            name=op.f("fk_asset_state_store_asset_id_asset"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_asset_state_store")),
        sa.UniqueConstraint("asset_id", "key", name=op.f("uq_asset_state_store_asset_id_key")),
    )


def downgrade() -> None:
    op.drop_table("asset_state_store")
    op.drop_index(op.f("ix_task_state_store_expires_at"), table_name="task_state_store")
    op.drop_table("task_state_store")
