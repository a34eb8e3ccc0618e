"""Dynamic task mapping

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25 16:00:00.000000

- ``task_instance``: ``map_index`` (-1: an unmapped task, or a mapped one not expanded yet;
  0..N-1: the copies of a mapped task); one row per (run, task, map index);
- ``dag_task``: ``mapping``, what a mapped task maps over (literal lengths, or the upstream
  task and key), so the scheduler expands it without importing the DAG file.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("task_instance") as batch:
        batch.add_column(sa.Column("map_index", sa.Integer(), server_default="-1", nullable=False))
        batch.drop_constraint("uq_task_instance_dag_run_id_task_id", type_="unique")
        batch.create_unique_constraint(
            "uq_task_instance_dag_run_id_task_id_map_index", ["dag_run_id", "task_id", "map_index"]
        )
    with op.batch_alter_table("dag_task") as batch:
        batch.add_column(sa.Column("mapping", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dag_task") as batch:
        batch.drop_column("mapping")
    op.execute("DELETE FROM task_instance WHERE map_index > 0")
    with op.batch_alter_table("task_instance") as batch:
        batch.drop_constraint("uq_task_instance_dag_run_id_task_id_map_index", type_="unique")
        batch.create_unique_constraint(
            "uq_task_instance_dag_run_id_task_id", ["dag_run_id", "task_id"]
        )
        batch.drop_column("map_index")
