"""Setup and teardown tasks, and the labels of a DAG's edges

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29 00:00:00.000000

- ``dag_task``: ``is_setup`` / ``is_teardown`` (Airflow's setup and teardown tasks: the
  scheduler runs a teardown once its setups ran, whatever its work did) and
  ``on_failure_fail_dagrun`` (a teardown whose failure fails the run; other teardowns' do
  not); ``edge_labels``, the ``Label`` of each edge to a downstream task (downstream task id
  -> label; None without labels). Rows written before this revision get them at their
  file's next parse.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dag_task") as batch:
        for name in ("is_setup", "is_teardown", "on_failure_fail_dagrun"):
            batch.add_column(
                sa.Column(name, sa.Boolean(), nullable=False, server_default=sa.false())
            )
        batch.add_column(sa.Column("edge_labels", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dag_task") as batch:
        for name in ("edge_labels", "on_failure_fail_dagrun", "is_teardown", "is_setup"):
            batch.drop_column(name)
