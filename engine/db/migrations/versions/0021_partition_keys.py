"""Partition keys of asset events and DAG runs

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29 00:00:00.000000

- ``asset_event``: ``partition_key``, the slice of the asset the event updated (Airflow
  3.3's partitioned asset events, at most 250 characters; None for an unpartitioned
  event), indexed with its asset so an asset's events of one key are read without a scan.
- ``dag_run``: ``partition_key``, the slice a partitioned run stands for (a
  ``CronPartitionTimetable`` tick, a ``PartitionedAssetTimetable``'s downstream key, a
  partition backfill's key); indexed with its DAG, so a DAG's runs of one key are found
  at once. Rows written before this revision have none.
- ``backfill``: ``partition_keys``, the keys a partition backfill (``sluice dags backfill
  --partitions``) runs, one run each; such a backfill has no date range, so ``from_date``
  and ``to_date`` may be None.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from engine.db.models import UtcDateTime

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("asset_event") as batch:
        batch.add_column(sa.Column("partition_key", sa.String(250), nullable=True))
    with op.batch_alter_table("dag_run") as batch:
        batch.add_column(sa.Column("partition_key", sa.String(250), nullable=True))
    op.create_index(
        "ix_asset_event_asset_id_partition_key", "asset_event", ["asset_id", "partition_key"]
    )
    op.create_index("ix_dag_run_dag_id_partition_key", "dag_run", ["dag_id", "partition_key"])
    with op.batch_alter_table("backfill") as batch:
        batch.add_column(sa.Column("partition_keys", sa.JSON(), nullable=True))
        batch.alter_column("from_date", existing_type=UtcDateTime(), nullable=True)
        batch.alter_column("to_date", existing_type=UtcDateTime(), nullable=True)


def downgrade() -> None:
    # A partition backfill has no dates: it cannot be kept by the old schema.
    op.execute("DELETE FROM backfill WHERE from_date IS NULL OR to_date IS NULL")
    with op.batch_alter_table("backfill") as batch:
        batch.alter_column("to_date", existing_type=UtcDateTime(), nullable=False)
        batch.alter_column("from_date", existing_type=UtcDateTime(), nullable=False)
        batch.drop_column("partition_keys")
    op.drop_index("ix_dag_run_dag_id_partition_key", table_name="dag_run")
    op.drop_index("ix_asset_event_asset_id_partition_key", table_name="asset_event")
    with op.batch_alter_table("dag_run") as batch:
        batch.drop_column("partition_key")
    with op.batch_alter_table("asset_event") as batch:
        batch.drop_column("partition_key")
