"""shared-stream snapshot digest, asset events by asset and id

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 10:00:00.000000

- ``shared_stream_snapshot``: ``stream_digest``, the digest of the group's key as trigger
  rows store it (``trigger.stream_digest``), so a watcher's trigger row leads to the
  snapshot of the group it belongs to (``sluice dags why``). Rows written before it have
  none until their triggerer publishes again (every heartbeat).
- ``asset_event``: an index on ``(asset_id, id)``, so an asset's latest events are read
  without a scan of all its events: ``sluice dags why`` (the last event of each asset and
  of each watcher), a task's ``inlet_events``, ``sluice assets events``; and one on
  ``(asset_id, source_watcher, id)``, so a watcher's latest event is found without reading
  all of its asset's events when the watcher has been silent for long.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("shared_stream_snapshot") as batch:
        batch.add_column(sa.Column("stream_digest", sa.String(length=64), nullable=True))
    op.create_index("ix_asset_event_asset_id_id", "asset_event", ["asset_id", "id"])
    op.create_index(
        "ix_asset_event_asset_id_source_watcher_id",
        "asset_event",
        ["asset_id", "source_watcher", "id"],
    )


def downgrade() -> None:
    op.drop_index("ix_asset_event_asset_id_source_watcher_id", table_name="asset_event")
    op.drop_index("ix_asset_event_asset_id_id", table_name="asset_event")
    with op.batch_alter_table("shared_stream_snapshot") as batch:
        batch.drop_column("stream_digest")
