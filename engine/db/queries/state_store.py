"""SQL of the state stores (``engine.db.models.state_store``): a task instance's entries by
key (read, written, deleted, cleared; the expired ones counted and deleted by ``sluice db
clean``) and an asset's entries by key. A write is one upsert on the (owner, key) unique
constraint, so two writers of one key never fail on each other: the later value wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, delete, select

from engine.db.database import rowcount, upsert_insert
from engine.db.models import Asset, AssetStateEntry, DagRun, TaskInstance, TaskStateEntry

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy import ColumnElement
    from sqlalchemy.orm import Session


@dataclass(frozen=True, slots=True)
class StateEntry:
    """One entry as the CLI shows it."""

    key: str
    value: Any
    updated_at: datetime
    expires_at: datetime | None


# --- the task state store --------------------------------------------------------------------


def get_task_state(session: Session, *, ti_id: int, key: str) -> tuple[bool, Any]:
    """``(found, value)`` of ``key`` for task instance ``ti_id``."""
    value = session.execute(
        select(TaskStateEntry.value).where(
            TaskStateEntry.task_instance_id == ti_id, TaskStateEntry.key == key
        )
    ).scalar_one_or_none()
    return value is not None, value


def set_task_state(
    session: Session,
    *,
    ti_id: int,
    key: str,
    value: Any,
    now: datetime,
    expires_at: datetime | None,
) -> None:
    """Write ``value`` under ``key`` for task instance ``ti_id`` (replacing any)."""
    row = {"value": value, "updated_at": now, "expires_at": expires_at}
    stmt = upsert_insert(session, TaskStateEntry).values(task_instance_id=ti_id, key=key, **row)
    session.execute(
        stmt.on_conflict_do_update(index_elements=["task_instance_id", "key"], set_=row)
    )


def delete_task_state(session: Session, *, ti_id: int, key: str | None) -> int:
    """Delete ``key`` (None: every key) of task instance ``ti_id``; how many went."""
    condition = TaskStateEntry.task_instance_id == ti_id
    if key is not None:
        condition = and_(condition, TaskStateEntry.key == key)
    return rowcount(session.execute(delete(TaskStateEntry).where(condition)))


def task_state_entries(
    session: Session, *, dag_id: str, run_id: str, task_id: str, map_index: int
) -> list[StateEntry] | None:
    """The entries of one task instance, by key; None when there is no such instance."""
    ti_id = session.execute(
        select(TaskInstance.id)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(
            DagRun.dag_id == dag_id,
            DagRun.run_id == run_id,
            TaskInstance.task_id == task_id,
            TaskInstance.map_index == map_index,
        )
    ).scalar_one_or_none()
    if ti_id is None:
        return None
    rows = session.execute(
        select(TaskStateEntry)
        .where(TaskStateEntry.task_instance_id == ti_id)
        .order_by(TaskStateEntry.key)
    ).scalars()
    return [StateEntry(r.key, r.value, r.updated_at, r.expires_at) for r in rows]


def expired_task_state(now: datetime) -> ColumnElement[bool]:
    """What ``sluice db clean`` may delete: entries whose ``expires_at`` passed (an entry
    stored with ``NEVER_EXPIRE`` has none and stays)."""
    return and_(TaskStateEntry.expires_at.is_not(None), TaskStateEntry.expires_at <= now)


# --- the asset state store -------------------------------------------------------------------


def _asset_id(session: Session, name: str) -> int | None:
    found = session.execute(select(Asset.id).where(Asset.name == name)).scalar_one_or_none()
    return None if found is None else int(found)


def get_asset_state(session: Session, *, asset: str, key: str) -> tuple[bool, Any]:
    """``(found, value)`` of ``key`` for the asset named ``asset``."""
    value = session.execute(
        select(AssetStateEntry.value)
        .join(Asset, Asset.id == AssetStateEntry.asset_id)
        .where(Asset.name == asset, AssetStateEntry.key == key)
    ).scalar_one_or_none()
    return value is not None, value


def set_asset_state(session: Session, *, asset: str, key: str, value: Any, now: datetime) -> bool:
    """Write ``value`` under ``key`` for the asset named ``asset``; False if no such asset."""
    asset_id = _asset_id(session, asset)
    if asset_id is None:
        return False
    row = {"value": value, "updated_at": now}
    stmt = upsert_insert(session, AssetStateEntry).values(asset_id=asset_id, key=key, **row)
    session.execute(stmt.on_conflict_do_update(index_elements=["asset_id", "key"], set_=row))
    return True


def delete_asset_state(session: Session, *, asset: str, key: str | None) -> int:
    """Delete ``key`` (None: every key) of the asset named ``asset``; how many went."""
    asset_id = _asset_id(session, asset)
    if asset_id is None:
        return 0
    condition = AssetStateEntry.asset_id == asset_id
    if key is not None:
        condition = and_(condition, AssetStateEntry.key == key)
    return rowcount(session.execute(delete(AssetStateEntry).where(condition)))


def asset_state_entries(session: Session, *, asset: str) -> list[StateEntry] | None:
    """The entries of the asset named ``asset``, by key; None when there is no such asset."""
    asset_id = _asset_id(session, asset)
    if asset_id is None:
        return None
    rows = session.execute(
        select(AssetStateEntry)
        .where(AssetStateEntry.asset_id == asset_id)
        .order_by(AssetStateEntry.key)
    ).scalars()
    return [StateEntry(r.key, r.value, r.updated_at, None) for r in rows]
