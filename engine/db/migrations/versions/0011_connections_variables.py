"""Connections and variables

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 16:00:00.000000

- ``connection``: named connections; ``password`` and ``extra`` hold Fernet tokens;
- ``variable``: named variables; ``val`` holds a Fernet token.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from engine.db.models import UtcDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "connection",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("conn_id", sa.String(length=250), nullable=False),
        sa.Column("conn_type", sa.String(length=500), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("host", sa.String(length=500), nullable=True),
        sa.Column("schema", sa.String(length=500), nullable=True),
        sa.Column("login", sa.Text(), nullable=True),
        sa.Column("password", sa.Text(), nullable=True),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("extra", sa.Text(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_connection")),
        sa.UniqueConstraint("conn_id", name=op.f("uq_connection_conn_id")),
    )
    op.create_table(
        "variable",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=250), nullable=False),
        sa.Column("val", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_variable")),
        sa.UniqueConstraint("key", name=op.f("uq_variable_key")),
    )


def downgrade() -> None:
    op.drop_table("variable")
    op.drop_table("connection")
