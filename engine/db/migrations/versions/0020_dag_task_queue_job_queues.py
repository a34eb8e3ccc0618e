"""The Celery queue of each task, and the queues of each Celery worker

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27 16:20:00.000000

- ``dag_task``: ``queue``, the operator's ``queue=`` (None: ``[celery] default_queue``): the
  Celery executor sends the task's tries to that queue. Rows written before this revision get
  it at their file's next parse.
- ``job``: ``queues``, the comma-separated Celery queues a ``sluice celery worker`` (an
  ``executor`` job) consumes; None for every other part.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dag_task") as batch:
        batch.add_column(sa.Column("queue", sa.String(256), nullable=True))
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("queues", sa.String(2000), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("queues")
    with op.batch_alter_table("dag_task") as batch:
        batch.drop_column("queue")
