"""The state stores of Airflow 3.3 (AIP-103): small JSON values kept under a key, for a task
instance across its tries (``task_state_store``) or for an asset across runs
(``asset_state_store``).

A task instance's row stands for ``dag_id`` + ``run_id`` + ``task_id`` + ``map_index`` and is
kept across its tries, so its id scopes the task's entries; they go with it (a run deleted by
``sluice db clean``), or once ``expires_at`` passed (``sluice db clean``; None: never). An
asset's entries go with the asset row.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from engine.db.models.base import Base, UtcDateTime, utcnow


class TaskStateEntry(Base):
    __tablename__ = "task_state_store"
    __table_args__ = (
        UniqueConstraint("task_instance_id", "key"),
        Index(None, "expires_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_instance_id: Mapped[int] = mapped_column(
        ForeignKey("task_instance.id", ondelete="CASCADE")
    )
    key: Mapped[str] = mapped_column(String(512))
    #: the value as the task gave it (any JSON but null)
    value: Mapped[Any] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    #: when ``sluice db clean`` may delete it; None: never (``NEVER_EXPIRE``)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class AssetStateEntry(Base):
    __tablename__ = "asset_state_store"
    __table_args__ = (UniqueConstraint("asset_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    asset_id: Mapped[int] = mapped_column(ForeignKey("asset.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(512))
    value: Mapped[Any] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
