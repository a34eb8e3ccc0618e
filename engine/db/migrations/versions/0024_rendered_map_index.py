"""Rendered map indexes of mapped tasks' copies

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-29 01:00:00.000000

- ``task_instance``: ``rendered_map_index``, what the task's ``map_index_template``
  rendered to once the copy ran (Airflow's named mapping, at most 250 characters); None
  for an unmapped task, a task without a template, or a template that rendered nothing or
  failed (the copy is then shown by its numeric ``map_index``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("task_instance") as batch:
        batch.add_column(sa.Column("rendered_map_index", sa.String(250), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("task_instance") as batch:
        batch.drop_column("rendered_map_index")
