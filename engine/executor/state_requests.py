"""The state stores served to a task's process over its request channel: the kinds
``task_state_*`` and ``asset_state_*`` of ``engine.executor.task_requests``.

The task state store is scoped by the executor, never by the task: its entries are those of
the task instance the executor started the process for (its row: dag_id + run_id + task_id +
map_index, kept across tries), so a task cannot read or write another's. An entry's expiry
is computed here when it is written: the retention the task gave (seconds), none
(``NEVER_EXPIRE``), or ``[state_store] default_retention_days`` (0: none). The asset state
store is scoped by the asset's name (the task process offers it for its concrete inlets and
outlets only, as Airflow does).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from engine.db.queries import state_store as sql
from engine.exceptions import SluiceError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from engine.db.database import Database

logger = logging.getLogger(__name__)

KEY_MAX_CHARS = 512


class StateRequestError(SluiceError, ValueError):
    """A state store request that cannot be served as sent."""


class StateStoreRequests:
    """The handlers, for ``TaskRequestServer.handlers``; ``ti_id`` None: no task (a callback's
    process), whose task state requests are refused."""

    def __init__(
        self,
        *,
        db: Database,
        ti_id: int | None,
        default_retention_days: int,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._db = db
        self._ti_id = ti_id
        self._default_days = default_retention_days
        self._clock = clock

    def __repr__(self) -> str:
        return f"<StateStoreRequests ti_id={self._ti_id} default_days={self._default_days}>"

    def handlers(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        return {
            "task_state_get": self.task_state_get,
            "task_state_set": self.task_state_set,
            "task_state_delete": self.task_state_delete,
            "task_state_clear": self.task_state_clear,
            "asset_state_get": self.asset_state_get,
            "asset_state_set": self.asset_state_set,
            "asset_state_delete": self.asset_state_delete,
            "asset_state_clear": self.asset_state_clear,
        }

    # --- the task state store ---------------------------------------------------------

    async def task_state_get(self, *, key: str) -> dict[str, Any]:
        found, value = await self._db.read(
            partial(sql.get_task_state, ti_id=self._task(), key=_key(key))
        )
        return {"found": found, "value": value}

    async def task_state_set(
        self, *, key: str, value: Any, retention_s: float | None = None, never_expire: bool = False
    ) -> None:
        if value is None:
            raise StateRequestError("a task state store value must not be None")
        now = self._clock()
        write = partial(
            sql.set_task_state,
            ti_id=self._task(),
            key=_key(key),
            value=value,
            now=now,
            expires_at=self.expires_at(now, retention_s=retention_s, never_expire=never_expire),
        )
        await self._db.run(write)

    async def task_state_delete(self, *, key: str) -> int:
        return int(
            await self._db.run(partial(sql.delete_task_state, ti_id=self._task(), key=_key(key)))
        )

    async def task_state_clear(self) -> int:
        return int(await self._db.run(partial(sql.delete_task_state, ti_id=self._task(), key=None)))

    def expires_at(
        self, now: datetime, *, retention_s: float | None, never_expire: bool
    ) -> datetime | None:
        """When an entry written at ``now`` expires (None: never)."""
        if never_expire:
            return None
        if retention_s is not None:
            if isinstance(retention_s, bool) or not isinstance(retention_s, (int, float)):
                raise StateRequestError(f"retention_s must be a number, got {retention_s!r}")
            if retention_s <= 0:
                raise StateRequestError(f"a retention must be positive, got {retention_s}s")
            return now + timedelta(seconds=retention_s)
        return None if self._default_days == 0 else now + timedelta(days=self._default_days)

    def _task(self) -> int:
        if self._ti_id is None:
            raise StateRequestError("the task state store is only available to a task's process")
        return self._ti_id

    # --- the asset state store --------------------------------------------------------

    async def asset_state_get(self, *, asset: str, key: str) -> dict[str, Any]:
        read = partial(sql.get_asset_state, asset=_name(asset), key=_key(key))
        found, value = await self._db.read(read)
        return {"found": found, "value": value}

    async def asset_state_set(self, *, asset: str, key: str, value: Any) -> None:
        if value is None:
            raise StateRequestError("an asset state store value must not be None")
        write = partial(
            sql.set_asset_state, asset=_name(asset), key=_key(key), value=value, now=self._clock()
        )
        if not await self._db.run(write):
            raise StateRequestError(f"asset {asset!r} is not in the metadata database")

    async def asset_state_delete(self, *, asset: str, key: str) -> int:
        delete = partial(sql.delete_asset_state, asset=_name(asset), key=_key(key))
        return int(await self._db.run(delete))

    async def asset_state_clear(self, *, asset: str) -> int:
        return int(
            await self._db.run(partial(sql.delete_asset_state, asset=_name(asset), key=None))
        )


def _key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise StateRequestError(f"a state store key must be a non-empty string, got {key!r}")
    if len(key) > KEY_MAX_CHARS:
        raise StateRequestError(f"a state store key is at most {KEY_MAX_CHARS} characters")
    return key


def _name(asset: object) -> str:
    if not isinstance(asset, str) or not asset:
        raise StateRequestError(f"an asset name must be a non-empty string, got {asset!r}")
    return asset
