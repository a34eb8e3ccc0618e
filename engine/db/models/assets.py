"""Assets and their events: assets, their watchers (a trigger row each), asset events, aliases
and what they resolved to, and the events each DAG has not consumed yet.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from engine.db.models.base import Base, UtcDateTime, utcnow


class Asset(Base):
    __tablename__ = "asset"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(1500), unique=True)
    uri: Mapped[str] = mapped_column(String(1500))
    extra: Mapped[Any] = mapped_column(JSON, default=dict)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class AssetWatcher(Base):
    __tablename__ = "asset_watcher"
    __table_args__ = (UniqueConstraint("asset_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    asset_id: Mapped[int] = mapped_column(ForeignKey("asset.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(1500))
    trigger_id: Mapped[int] = mapped_column(
        ForeignKey("trigger.id", ondelete="CASCADE"), index=True
    )


class AssetEvent(Base):
    """One update of an asset; ``dedup_key`` makes a redelivered message a no-op.

    The key names the delivery (broker coordinates, a message id, a file's identity). An
    event without one (NULL: the unique constraint never matches NULLs) is never merged.
    """

    __tablename__ = "asset_event"
    __table_args__ = (
        UniqueConstraint("asset_id", "dedup_key"),
        # An asset's latest events without a scan of all of them (a task's
        # inlet_events, `assets events`, the last event of an asset), and a watcher's latest
        # event even when the watcher has been silent for long (`dags why`).
        Index(None, "asset_id", "id"),
        Index(None, "asset_id", "source_watcher", "id"),
        # An asset's events of one partition (`assets partitions`, a rollup's arrived keys).
        Index(None, "asset_id", "partition_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    asset_id: Mapped[int] = mapped_column(ForeignKey("asset.id", ondelete="CASCADE"))
    payload: Mapped[Any] = mapped_column(JSON)
    dedup_key: Mapped[str | None] = mapped_column(String(512))
    source_trigger_id: Mapped[int | None] = mapped_column(Integer)
    source_watcher: Mapped[str | None] = mapped_column(String(1500))
    timestamp: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    # Where the event came from ("watcher", "task", "cli", "api"), the
    # event's ``extra``, the task try that produced it (outlets), the alias it was attached
    # through, and who emitted it from outside ("cli:user@host").
    source: Mapped[str | None] = mapped_column(String(20))
    extra: Mapped[Any | None] = mapped_column(JSON)
    source_dag_id: Mapped[str | None] = mapped_column(String(250))
    source_run_id: Mapped[str | None] = mapped_column(String(250))
    source_task_id: Mapped[str | None] = mapped_column(String(250))
    source_try_number: Mapped[int | None] = mapped_column(Integer)
    source_alias: Mapped[str | None] = mapped_column(String(1500))
    created_by: Mapped[str | None] = mapped_column(String(500))
    #: the slice of the asset this event updated (Airflow 3.3's partitioned asset events);
    #: None for an unpartitioned event
    partition_key: Mapped[str | None] = mapped_column(String(250))


class AssetAlias(Base):
    """A name that tasks attach asset events to at run time (``outlet_events[alias].add``)."""

    __tablename__ = "asset_alias"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(1500), unique=True)


class AssetAliasAsset(Base):
    """The assets an alias has resolved to (a row per asset an event was attached to)."""

    __tablename__ = "asset_alias_asset"

    alias_id: Mapped[int] = mapped_column(
        ForeignKey("asset_alias.id", ondelete="CASCADE"), primary_key=True
    )
    asset_id: Mapped[int] = mapped_column(
        ForeignKey("asset.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class AssetEventQueue(Base):
    """Asset events a DAG has not consumed yet.

    Written in the same transaction as the asset event (one row per DAG scheduled on the
    asset), deleted in the transaction that creates the DAG run consuming it: no event is
    dropped, none is consumed twice, whatever the commit order of concurrent writers.
    """

    __tablename__ = "asset_event_queue"

    dag_id: Mapped[str] = mapped_column(
        ForeignKey("dag.dag_id", ondelete="CASCADE"), primary_key=True
    )
    asset_event_id: Mapped[int] = mapped_column(
        ForeignKey("asset_event.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
