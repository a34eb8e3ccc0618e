"""shared-stream broker, lanes and dead-lettered count; where a trigger's upstream was unreachable

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29 03:00:00.000000

- ``shared_stream_snapshot``: ``broker``, what the group reads (the first element of its
  ``shared_stream_key()`` when it is a string: ``kafka``, ``sqs``, ``rabbitmq``, ...; else
  the trigger class's name); ``dead_lettered``, the events its producer advanced with a
  rejected outcome (sent the dead-letter way); ``lanes``, how many lanes have events not
  advanced yet (``outstanding_by_lane`` names the busiest 20 only). Rows written before it
  read ``''`` and 0 until their triggerer publishes again (every heartbeat).
- ``trigger``: ``unreachable_broker`` and ``unreachable_address``, set when the trigger's
  last failure was an upstream it could not reach (the broker kind as above, and the address
  the producer's error named: bootstrap servers, a queue URL, ``host:port``), cleared by a
  failure of another kind; ``sluice dags why`` names them ("cannot reach its Kafka broker at
  ...") without parsing the error text.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("shared_stream_snapshot") as batch:
        batch.add_column(
            sa.Column("broker", sa.String(length=100), nullable=False, server_default="")
        )
        batch.add_column(
            sa.Column("dead_lettered", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("lanes", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("trigger") as batch:
        batch.add_column(sa.Column("unreachable_broker", sa.String(length=100), nullable=True))
        batch.add_column(sa.Column("unreachable_address", sa.String(length=1000), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trigger") as batch:
        batch.drop_column("unreachable_address")
        batch.drop_column("unreachable_broker")
    with op.batch_alter_table("shared_stream_snapshot") as batch:
        batch.drop_column("lanes")
        batch.drop_column("dead_lettered")
        batch.drop_column("broker")
