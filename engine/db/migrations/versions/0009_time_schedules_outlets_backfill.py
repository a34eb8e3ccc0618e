"""Time schedules, outlets, asset aliases and backfills

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 13:00:00.000000

- ``dag``: the timetable and the DAG arguments (start/end date, catchup, limits, tags,
  params, docs), and the scheduler's next time run;
- ``dag_run``: logical date, data interval, run_after, backfill; unique (dag_id,
  logical_date), so two schedulers never create one interval twice;
- ``asset_event``: its source (watcher, task, cli, api), extra, producing task try, alias
  and creator;
- ``dag_task``: outlets, outlet aliases, inlets, inlet aliases;
- new tables ``asset_alias``, ``asset_alias_asset``, ``dag_schedule_asset_alias``,
  ``backfill``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from engine.db.models import UtcDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "asset_alias",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=1500), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_asset_alias")),
        sa.UniqueConstraint("name", name=op.f("uq_asset_alias_name")),
    )
    op.create_table(
        "asset_alias_asset",
        sa.Column("alias_id", sa.Integer(), nullable=False),
        sa.Column("asset_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["alias_id"],
            ["asset_alias.id"],
            name=op.f("fk_asset_alias_asset_alias_id_asset_alias"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["asset_id"],
            ["asset.id"],
            name=op.f("fk_asset_alias_asset_asset_id_asset"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("alias_id", "asset_id", name=op.f("pk_asset_alias_asset")),
    )
    op.create_index(
        op.f("ix_asset_alias_asset_asset_id"), "asset_alias_asset", ["asset_id"], unique=False
    )
    op.create_table(
        "dag_schedule_asset_alias",
        sa.Column("dag_id", sa.String(length=250), nullable=False),
        sa.Column("alias_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["alias_id"],
            ["asset_alias.id"],
            name=op.f("fk_dag_schedule_asset_alias_alias_id_asset_alias"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["dag_id"],
            ["dag.dag_id"],
            name=op.f("fk_dag_schedule_asset_alias_dag_id_dag"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("dag_id", "alias_id", name=op.f("pk_dag_schedule_asset_alias")),
    )
    op.create_index(
        op.f("ix_dag_schedule_asset_alias_alias_id"),
        "dag_schedule_asset_alias",
        ["alias_id"],
        unique=False,
    )
    op.create_table(
        "backfill",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dag_id", sa.String(length=250), nullable=False),
        sa.Column("from_date", UtcDateTime(), nullable=False),
        sa.Column("to_date", UtcDateTime(), nullable=False),
        sa.Column("reprocess", sa.String(length=20), nullable=False),
        sa.Column("max_active_runs", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(length=500), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("completed_at", UtcDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["dag_id"], ["dag.dag_id"], name=op.f("fk_backfill_dag_id_dag"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_backfill")),
    )
    with op.batch_alter_table("dag") as batch:
        batch.add_column(sa.Column("timetable", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("timetable_summary", sa.String(length=1000), nullable=True))
        batch.add_column(
            sa.Column("timezone", sa.String(length=100), server_default="UTC", nullable=False)
        )
        batch.add_column(sa.Column("start_date", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("end_date", UtcDateTime(), nullable=True))
        batch.add_column(
            sa.Column("catchup", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch.add_column(
            sa.Column("max_active_runs", sa.Integer(), server_default="16", nullable=False)
        )
        batch.add_column(
            sa.Column("max_active_tasks", sa.Integer(), server_default="16", nullable=False)
        )
        batch.add_column(sa.Column("dagrun_timeout_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("tags", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("params", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("doc_md", sa.Text(), nullable=True))
        batch.add_column(sa.Column("display_name", sa.String(length=2000), nullable=True))
        batch.add_column(
            sa.Column(
                "next_dagrun_computed", sa.Boolean(), server_default=sa.false(), nullable=False
            )
        )
        batch.add_column(sa.Column("next_dagrun", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("next_dagrun_data_interval_start", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("next_dagrun_data_interval_end", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("next_dagrun_create_after", UtcDateTime(), nullable=True))
    with op.batch_alter_table("dag_run") as batch:
        batch.add_column(sa.Column("logical_date", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("data_interval_start", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("data_interval_end", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("run_after", UtcDateTime(), nullable=True))
        batch.add_column(sa.Column("backfill_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            op.f("fk_dag_run_backfill_id_backfill"),
            "backfill",
            ["backfill_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_index(op.f("ix_dag_run_backfill_id"), ["backfill_id"], unique=False)
        batch.create_unique_constraint(
            op.f("uq_dag_run_dag_id_logical_date"), ["dag_id", "logical_date"]
        )
    with op.batch_alter_table("asset_event") as batch:
        batch.add_column(sa.Column("source", sa.String(length=20), nullable=True))
        batch.add_column(sa.Column("extra", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("source_dag_id", sa.String(length=250), nullable=True))
        batch.add_column(sa.Column("source_run_id", sa.String(length=250), nullable=True))
        batch.add_column(sa.Column("source_task_id", sa.String(length=250), nullable=True))
        batch.add_column(sa.Column("source_try_number", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("source_alias", sa.String(length=1500), nullable=True))
        batch.add_column(sa.Column("created_by", sa.String(length=500), nullable=True))
    # Events stored before this revision all came from watchers.
    op.execute("UPDATE asset_event SET source = 'watcher' WHERE source_watcher IS NOT NULL")
    with op.batch_alter_table("dag_task") as batch:
        batch.add_column(sa.Column("outlets", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("outlet_aliases", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("inlets", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("inlet_aliases", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dag_task") as batch:
        batch.drop_column("inlet_aliases")
        batch.drop_column("inlets")
        batch.drop_column("outlet_aliases")
        batch.drop_column("outlets")
    with op.batch_alter_table("asset_event") as batch:
        for column in (
            "created_by",
            "source_alias",
            "source_try_number",
            "source_task_id",
            "source_run_id",
            "source_dag_id",
            "extra",
            "source",
        ):
            batch.drop_column(column)
    with op.batch_alter_table("dag_run") as batch:
        batch.drop_constraint(op.f("uq_dag_run_dag_id_logical_date"), type_="unique")
        batch.drop_index(op.f("ix_dag_run_backfill_id"))
        batch.drop_constraint(op.f("fk_dag_run_backfill_id_backfill"), type_="foreignkey")
        for column in (
            "backfill_id",
            "run_after",
            "data_interval_end",
            "data_interval_start",
            "logical_date",
        ):
            batch.drop_column(column)
    with op.batch_alter_table("dag") as batch:
        for column in (
            "next_dagrun_create_after",
            "next_dagrun_data_interval_end",
            "next_dagrun_data_interval_start",
            "next_dagrun",
            "next_dagrun_computed",
            "display_name",
            "doc_md",
            "params",
            "tags",
            "dagrun_timeout_s",
            "max_active_tasks",
            "max_active_runs",
            "catchup",
            "end_date",
            "start_date",
            "timezone",
            "timetable_summary",
            "timetable",
        ):
            batch.drop_column(column)
    op.drop_table("backfill")
    op.drop_index(
        op.f("ix_dag_schedule_asset_alias_alias_id"), table_name="dag_schedule_asset_alias"
    )
    op.drop_table("dag_schedule_asset_alias")
    op.drop_index(op.f("ix_asset_alias_asset_asset_id"), table_name="asset_alias_asset")
    op.drop_table("asset_alias_asset")
    op.drop_table("asset_alias")
