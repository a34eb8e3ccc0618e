"""The task and asset state stores of Airflow 3.3 (AIP-103), as a task sees them:
``context["task_state_store"]`` and ``context["asset_state_store"]``, and ``NEVER_EXPIRE``.

Theory of operation. The task state store holds small JSON values by key for one task
instance (dag_id + run_id + task_id + map_index) across its tries: what a try stored (an
external job's id, a checkpoint) the next try reads, after a failure or a worker that died.
The asset state store holds values by key for an asset across runs (a watermark, a cursor),
offered for the task's concrete ``Asset`` inlets and outlets. Neither holds ``None``: a
value is any JSON (text, number, boolean, list, object).

A task process has no database: each call is a request to the executor that supervises it,
through the process's store (``engine.authoring.store``; the task's request channel). The
executor scopes the task state store to the task instance it started (a task cannot name
another) and computes each entry's expiry when it is written: ``retention=`` (a
``timedelta``), ``NEVER_EXPIRE``, or ``[state_store] default_retention_days`` when omitted
(0: never). ``sluice db clean`` deletes expired entries; asset entries never expire.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from engine.authoring.store import StoreUnavailableError, current_store

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = (
    "NEVER_EXPIRE",
    "AssetStateStore",
    "AssetStateStores",
    "StateStoring",
    "TaskStateStore",
)


class _NeverExpire:
    """The type of ``NEVER_EXPIRE`` (one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEVER_EXPIRE"

    def __reduce__(self) -> str:
        return "NEVER_EXPIRE"


#: ``task_state_store.set(key, value, retention=NEVER_EXPIRE)``: the entry never expires,
#: whatever ``[state_store] default_retention_days`` says
NEVER_EXPIRE: Final = _NeverExpire()


@runtime_checkable
class StateStoring(Protocol):
    """What the task process's store (its request channel) does for the state stores."""

    def task_state_get(self, key: str) -> tuple[bool, Any]: ...
    def task_state_set(
        self, key: str, value: Any, *, retention_s: float | None, never_expire: bool
    ) -> None: ...
    def task_state_delete(self, key: str) -> None: ...
    def task_state_clear(self) -> None: ...
    def asset_state_get(self, asset: str, key: str) -> tuple[bool, Any]: ...
    def asset_state_set(self, asset: str, key: str, value: Any) -> None: ...
    def asset_state_delete(self, asset: str, key: str) -> None: ...
    def asset_state_clear(self, asset: str) -> None: ...


def _backend(what: str) -> StateStoring:
    store = current_store(what)
    if not isinstance(store, StateStoring):
        raise StoreUnavailableError(
            f"{what}: the state stores are only available inside a running task"
        )
    return store


def _check_key(key: object, what: str) -> str:
    if not isinstance(key, str) or not key:
        raise TypeError(f"{what}: a key must be a non-empty string, got {key!r}")
    return key


def _check_value(value: object, what: str) -> Any:
    if value is None:
        raise ValueError(f"{what}: the value must not be None (delete the key instead)")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what}: the value must be JSON (str, int, float, bool, list, dict): {exc}"
        ) from exc
    return value


def _retention(retention: object, what: str) -> tuple[float | None, bool]:
    """``(retention_s, never_expire)`` of ``set``'s ``retention=``."""
    if retention is None:
        return None, False
    if retention is NEVER_EXPIRE:
        return None, True
    if not isinstance(retention, timedelta):
        raise TypeError(
            f"{what}: retention must be a timedelta, NEVER_EXPIRE or None, got {retention!r}"
        )
    seconds = retention.total_seconds()
    if seconds <= 0:
        raise ValueError(f"{what}: retention must be positive, got {retention}")
    return seconds, False


class TaskStateStore:
    """``context["task_state_store"]``: this task instance's values, kept across its tries."""

    def __init__(
        self, *, dag_id: str | None, run_id: str | None, task_id: str, map_index: int
    ) -> None:
        self.dag_id = dag_id
        self.run_id = run_id
        self.task_id = task_id
        self.map_index = map_index

    def __repr__(self) -> str:
        where = f"{self.dag_id}/{self.run_id}/{self.task_id}"
        return f"<TaskStateStore {where}{'' if self.map_index < 0 else f'[{self.map_index}]'}>"

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key``, or ``default`` if there is none."""
        what = f"task_state_store.get({key!r})"
        found, value = _backend(what).task_state_get(_check_key(key, what))
        return value if found else default

    def set(
        self, key: str, value: Any, *, retention: timedelta | _NeverExpire | None = None
    ) -> None:
        """Store ``value`` (JSON, not None) under ``key``, replacing any. ``retention``: how
        long it is kept from now (a ``timedelta``), ``NEVER_EXPIRE``, or None for ``[state_store]
        default_retention_days``."""
        what = f"task_state_store.set({key!r})"
        retention_s, never = _retention(retention, what)
        _backend(what).task_state_set(
            _check_key(key, what),
            _check_value(value, what),
            retention_s=retention_s,
            never_expire=never,
        )

    def delete(self, key: str) -> None:
        """Delete ``key`` (nothing happens if it is not set)."""
        what = f"task_state_store.delete({key!r})"
        _backend(what).task_state_delete(_check_key(key, what))

    def clear(self) -> None:
        """Delete every key of this task instance."""
        _backend("task_state_store.clear()").task_state_clear()


class AssetStateStore:
    """One asset's values, kept across runs: ``context["asset_state_store"][asset]``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<AssetStateStore {self.name!r}>"

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key``, or ``default`` if there is none."""
        what = f"asset_state_store[{self.name!r}].get({key!r})"
        found, value = _backend(what).asset_state_get(self.name, _check_key(key, what))
        return value if found else default

    def set(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON, not None) under ``key``, replacing any."""
        what = f"asset_state_store[{self.name!r}].set({key!r})"
        _backend(what).asset_state_set(self.name, _check_key(key, what), _check_value(value, what))

    def delete(self, key: str) -> None:
        """Delete ``key`` (nothing happens if it is not set)."""
        what = f"asset_state_store[{self.name!r}].delete({key!r})"
        _backend(what).asset_state_delete(self.name, _check_key(key, what))

    def clear(self) -> None:
        """Delete every key of this asset."""
        _backend(f"asset_state_store[{self.name!r}].clear()").asset_state_clear(self.name)


class AssetStateStores:
    """``context["asset_state_store"]``: subscript it with one of the task's concrete inlets
    or outlets (the ``Asset``, or its name); with exactly one such asset, ``get`` / ``set`` /
    ``delete`` / ``clear`` act on it directly (with several they raise ``ValueError``)."""

    def __init__(self, names: Iterable[str], *, task_id: str) -> None:
        self._names = tuple(dict.fromkeys(names))
        self._task_id = task_id

    def __repr__(self) -> str:
        return f"<AssetStateStores {list(self._names)}>"

    def __getitem__(self, asset: object) -> AssetStateStore:
        name = asset if isinstance(asset, str) else getattr(asset, "name", None)
        if name not in self._names:
            raise KeyError(
                f"task {self._task_id!r}: {asset!r} is not one of its concrete asset inlets or "
                f"outlets {list(self._names)}; add it to inlets=[...] or outlets=[...] to use "
                "its asset state store"
            )
        return AssetStateStore(str(name))

    def __contains__(self, asset: object) -> bool:
        name = asset if isinstance(asset, str) else getattr(asset, "name", None)
        return name in self._names

    def __iter__(self) -> Any:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def _only(self, method: str) -> AssetStateStore:
        if len(self._names) != 1:
            raise ValueError(
                f"task {self._task_id!r} has {len(self._names)} concrete asset inlets and "
                f"outlets {list(self._names)}: asset_state_store.{method}() needs exactly "
                f"one; use asset_state_store[asset].{method}() instead"
            )
        return AssetStateStore(self._names[0])

    def get(self, key: str, default: Any = None) -> Any:
        return self._only("get").get(key, default)

    def set(self, key: str, value: Any) -> None:
        self._only("set").set(key, value)

    def delete(self, key: str) -> None:
        self._only("delete").delete(key)

    def clear(self) -> None:
        self._only("clear").clear()
