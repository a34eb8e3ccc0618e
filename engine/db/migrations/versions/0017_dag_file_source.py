"""The last good source of each DAG file

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-25 19:30:00.000000

- ``dag_file``: ``source``, the text of the file that gave its last good parse, Fernet-
  encrypted like ``result`` (a DAG file may hold secrets). A task whose file is broken now
  (or no longer defines its DAG or task) runs this version; the sha256 of the source is in
  ``result``. Rows written before this revision get it at the file's next parse.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dag_file") as batch:
        batch.add_column(sa.Column("source", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dag_file") as batch:
        batch.drop_column("source")
