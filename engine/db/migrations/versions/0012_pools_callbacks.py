"""Pools and callbacks

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 16:00:00.000000

- ``pool``: named slot pools (Airflow's), with ``default_pool`` (128 slots);
- ``dag_task``: ``pool``, ``pool_slots`` (what the task takes from its pool);
- ``task_instance``: ``pool``, ``pool_slots`` as the executor claimed it (a queued, running
  or deferred instance counts against that pool, even if its DAG file changes meanwhile);
- ``dag``: ``has_on_success_callback``, ``has_on_failure_callback`` (the scheduler requests a
  DAG callback only for DAGs that have one);
- ``callback_request``: callbacks to run (a DAG's when its run ends; a task's when its
  process could not run them), claimed and deleted by an executor.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from engine.db.models import UtcDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pool = op.create_table(
        "pool",
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("include_deferred", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pool")),
    )
    op.bulk_insert(
        pool,
        [
            {
                "name": "default_pool",
                "slots": 128,
                "description": "Default pool",
                "include_deferred": False,
            }
        ],
    )
    with op.batch_alter_table("dag_task") as batch:
        batch.add_column(
            sa.Column("pool", sa.String(length=256), server_default="default_pool", nullable=False)
        )
        batch.add_column(sa.Column("pool_slots", sa.Integer(), server_default="1", nullable=False))
    with op.batch_alter_table("task_instance") as batch:
        batch.add_column(sa.Column("pool", sa.String(length=256), nullable=True))
        batch.add_column(sa.Column("pool_slots", sa.Integer(), nullable=True))
        batch.create_index(batch.f("ix_task_instance_pool_state"), ["pool", "state"], unique=False)
    with op.batch_alter_table("dag") as batch:
        batch.add_column(
            sa.Column(
                "has_on_success_callback", sa.Boolean(), server_default=sa.false(), nullable=False
            )
        )
        batch.add_column(
            sa.Column(
                "has_on_failure_callback", sa.Boolean(), server_default=sa.false(), nullable=False
            )
        )
    op.create_table(
        "callback_request",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("dag_id", sa.String(length=250), nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("executor_job_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_callback_request")),
    )
    with op.batch_alter_table("callback_request") as batch:
        batch.create_index(
            batch.f("ix_callback_request_executor_job_id"), ["executor_job_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("callback_request") as batch:
        batch.drop_index(batch.f("ix_callback_request_executor_job_id"))
    op.drop_table("callback_request")
    with op.batch_alter_table("dag") as batch:
        batch.drop_column("has_on_failure_callback")
        batch.drop_column("has_on_success_callback")
    with op.batch_alter_table("task_instance") as batch:
        batch.drop_index(batch.f("ix_task_instance_pool_state"))
        batch.drop_column("pool_slots")
        batch.drop_column("pool")
    with op.batch_alter_table("dag_task") as batch:
        batch.drop_column("pool_slots")
        batch.drop_column("pool")
    op.drop_table("pool")
