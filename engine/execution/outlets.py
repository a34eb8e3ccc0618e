"""What a successful task writes for its outlets: ``context["outlet_events"]``.

``outlet_events[asset].extra`` is the extra of the event the task writes for an outlet
asset; ``outlet_events[asset].add_partitions(keys)`` makes it one event per partition key
instead (Airflow 3.3's runtime partitions, ``PartitionedAtRuntime``); without it, a task of a
partitioned run writes its events with the run's partition key;
``outlet_events[alias].add(Asset(...), extra={...})`` attaches an event to an asset through
an alias in the task's outlets. ``Metadata`` a task yields or returns is applied
the same way (``OutletEventAccessors.apply``). When the try succeeds,
``collect_outlet_events`` turns all of it into the events to write: one per outlet asset
(its extra, ``{}`` by default; one per key added with ``add_partitions``), then one per event
attached through an alias; an extra that is not JSON fails the try naming the task and the
asset.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.authoring.assets import Asset, AssetAlias, Metadata
from triggers.base import check_partition_key

if TYPE_CHECKING:
    from engine.authoring.baseoperator import BaseOperator


def name_of(key: object) -> str:
    if isinstance(key, Asset | AssetAlias):
        return key.name
    if isinstance(key, str):
        return key
    raise TypeError(f"asset events are looked up by Asset, AssetAlias or name, got {key!r}")


@dataclass(frozen=True, slots=True)
class AssetAliasEvent:
    """An event attached to ``asset`` through the alias ``source_alias_name``."""

    source_alias_name: str
    asset_name: str
    asset_uri: str
    extra: dict[str, Any]


class OutletEventAccessor:
    """``outlet_events[key]``: ``extra`` for an asset; ``add(asset, extra)`` for an alias."""

    def __init__(self, key: Asset | AssetAlias, owner: OutletEventAccessors) -> None:
        self.key = key
        self._extra: dict[str, Any] = {}
        self.asset_alias_events: list[AssetAliasEvent] = []
        self.partition_keys: list[str] = []
        self._owner = owner

    @property
    def extra(self) -> dict[str, Any]:
        """The extra of the event written for this outlet (fill it, or assign a dict)."""
        return self._extra

    @extra.setter
    def extra(self, value: Mapping[str, Any]) -> None:
        if not isinstance(value, Mapping):
            raise TypeError(
                f"outlet_events[{self.key!r}].extra must be a dict, got {type(value).__name__}"
            )
        self._extra = value if isinstance(value, dict) else dict(value)

    def __repr__(self) -> str:
        return f"<OutletEventAccessor {self.key!r} extra={self.extra!r}>"

    def add_partitions(self, partition_keys: str | Iterable[str]) -> None:
        """Write this outlet's event once per key (one key, or several to fan out), each
        with this accessor's ``extra``, instead of once with the run's partition key."""
        key = self.key
        if not isinstance(key, Asset):
            raise TypeError(
                f"outlet_events[{key!r}].add_partitions(): partition keys are added to the "
                "event of an outlet Asset"
            )
        self._owner.check_outlet(key.name)
        keys = [partition_keys] if isinstance(partition_keys, str) else list(partition_keys)
        where = f"outlet_events[{key.name!r}].add_partitions()"
        for item in keys:
            checked = check_partition_key(item, where)
            if checked not in self.partition_keys:
                self.partition_keys.append(checked)

    def add(self, asset: Asset | str, extra: Mapping[str, Any] | None = None) -> None:
        """Attach an event for ``asset`` through this alias (an alias in the task's outlets)."""
        alias = self.key
        if not isinstance(alias, AssetAlias):
            raise TypeError(
                f"outlet_events[{alias!r}].add(): add() attaches events through an "
                "AssetAlias; for an asset, set .extra"
            )
        self._owner.check_alias(alias.name)
        target = self._owner.asset_named(asset)
        if extra is not None and not isinstance(extra, Mapping):
            raise TypeError(f"outlet_events[{alias!r}].add(): extra must be a dict, got {extra!r}")
        event = AssetAliasEvent(alias.name, target.name, target.uri, dict(extra or {}))
        if event not in self.asset_alias_events:
            self.asset_alias_events.append(event)


class OutletEventAccessors:
    """``outlet_events``: one accessor per asset or alias, created on first use.

    ``partition_key`` is the run's: the key of the events written unless ``add_partitions``
    names others."""

    def __init__(
        self, task: BaseOperator | None = None, *, partition_key: str | None = None
    ) -> None:
        outlets = task.outlets if task is not None else []
        self.partition_key = partition_key
        self._task_id = task.task_id if task is not None else None
        self._assets = {item.name: item for item in outlets if isinstance(item, Asset)}
        self._aliases = {item.name for item in outlets if isinstance(item, AssetAlias)}
        self._by_asset: dict[str, OutletEventAccessor] = {}
        self._by_alias: dict[str, OutletEventAccessor] = {}

    def __repr__(self) -> str:
        return (
            f"<OutletEventAccessors assets={list(self._by_asset)} aliases={list(self._by_alias)}>"
        )

    def __getitem__(self, key: Asset | AssetAlias | str) -> OutletEventAccessor:
        if isinstance(key, AssetAlias) or (
            isinstance(key, str) and key in self._aliases and key not in self._assets
        ):
            name = name_of(key)
            alias = key if isinstance(key, AssetAlias) else AssetAlias(name)
            return self._by_alias.setdefault(name, OutletEventAccessor(alias, self))
        asset = self.asset_named(key)
        return self._by_asset.setdefault(asset.name, OutletEventAccessor(asset, self))

    def for_asset(self, *, name: str | None = None, uri: str | None = None) -> OutletEventAccessor:
        """Airflow's ``outlet_events.for_asset(name=..., uri=...)``: the accessor of the outlet
        asset with that name, that URI, or both."""
        matches = [
            asset
            for asset in self._assets.values()
            if (name is None or asset.name == name) and (uri is None or asset.uri == uri)
        ]
        if (name is None and uri is None) or not matches:
            raise KeyError(
                f"task {self._task_id!r}: outlet_events.for_asset(name={name!r}, uri={uri!r}) "
                f"matches none of its outlet assets {sorted(self._assets)}"
            )
        return self[matches[0]]

    def for_asset_alias(self, *, name: str) -> OutletEventAccessor:
        """Airflow's ``outlet_events.for_asset_alias(name=...)``."""
        return self[AssetAlias(name)]

    def asset_named(self, key: object) -> Asset:
        """The outlet asset named ``key`` (an ``Asset`` is taken as it is)."""
        if isinstance(key, Asset):
            return key
        if not isinstance(key, str):
            raise TypeError(f"outlet_events takes an Asset, an AssetAlias or a name, got {key!r}")
        return self._assets.get(key) or Asset(key)

    def check_alias(self, name: str) -> None:
        if name not in self._aliases:
            raise ValueError(
                f"task {self._task_id!r}: AssetAlias {name!r} is not in its outlets; add it to "
                "outlets=[...] to attach events through it"
            )

    def check_outlet(self, name: str) -> None:
        if name not in self._assets:
            raise ValueError(
                f"task {self._task_id!r}: Asset {name!r} is not in its outlets; add it to "
                "outlets=[...] to write its partitions"
            )

    def partition_keys_of(self, asset_name: str) -> list[str | None]:
        """The partition keys of the events written for an outlet asset: those added with
        ``add_partitions``, else the run's (None for an unpartitioned run)."""
        accessor = self._by_asset.get(asset_name)
        if accessor is not None and accessor.partition_keys:
            return list(accessor.partition_keys)
        return [self.partition_key]

    def extra_of(self, asset_name: str) -> dict[str, Any]:
        accessor = self._by_asset.get(asset_name)
        return {} if accessor is None else accessor.extra

    def alias_events(self) -> list[AssetAliasEvent]:
        return [event for item in self._by_alias.values() for event in item.asset_alias_events]

    def apply(self, metadata: Metadata) -> None:
        """What yielding or returning ``metadata`` does (as in Airflow)."""
        self[metadata.asset].extra.update(metadata.extra)
        alias = metadata.alias
        if alias is not None:
            self[alias if isinstance(alias, AssetAlias) else AssetAlias(alias)].add(
                metadata.asset, extra=metadata.extra
            )


def outlet_events_of(context: dict[str, Any], task: BaseOperator) -> OutletEventAccessors:
    """The context's ``outlet_events`` (created when a plain dict has none)."""
    accessors = context.get("outlet_events")
    if not isinstance(accessors, OutletEventAccessors):
        accessors = OutletEventAccessors(task)
        context["outlet_events"] = accessors
    return accessors


def _plain_extra(task: BaseOperator, asset_name: str, extra: object) -> dict[str, Any]:
    what = f"task {task.task_id!r}: the extra of its event for asset {asset_name!r}"
    if not isinstance(extra, Mapping):
        raise TypeError(f"{what} must be a dict, got {type(extra).__name__}")
    if not all(isinstance(key, str) for key in extra):
        raise TypeError(f"{what} must have string keys, got {list(extra)!r}")
    try:
        plain: dict[str, Any] = json.loads(json.dumps(dict(extra), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} is not JSON: {exc}") from exc
    return plain


def is_metadata_result(returned: object) -> bool:
    """True when a task returned ``Metadata`` (one or a list): outlet extras, not a result."""
    return bool(_returned_metadata(returned))


def _returned_metadata(returned: object) -> list[Metadata]:
    if isinstance(returned, Metadata):
        return [returned]
    if isinstance(returned, list | tuple) and returned:
        if all(isinstance(item, Metadata) for item in returned):
            return list(returned)
    return []


def collect_outlet_events(
    context: dict[str, Any], task: BaseOperator, returned: object = None
) -> list[dict[str, Any]]:
    """The asset events a successful task writes: ``{"asset", "uri", "extra", "alias",
    "partition_key"}``.

    One per ``Asset`` in ``task.outlets`` (its extra from ``outlet_events``, ``{}`` by
    default) and partition key (``partition_keys_of``), then one per event attached through
    an alias (with the run's partition key). ``Metadata`` the task returned
    (``returned``: one, or a list of them) is applied first. An extra that is not JSON is a
    ``TypeError`` naming the task and the asset.
    """
    accessors = outlet_events_of(context, task)
    for metadata in _returned_metadata(returned):
        accessors.apply(metadata)
    events = [
        {
            "asset": outlet.name,
            "uri": outlet.uri,
            "extra": _plain_extra(task, outlet.name, accessors.extra_of(outlet.name)),
            "alias": None,
            "partition_key": key,
        }
        for outlet in task.outlets
        if isinstance(outlet, Asset)
        for key in accessors.partition_keys_of(outlet.name)
    ]
    for event in accessors.alias_events():
        extra = _plain_extra(task, event.asset_name, event.extra)
        events.append(
            {
                "asset": event.asset_name,
                "uri": event.asset_uri,
                "extra": extra,
                "alias": event.source_alias_name,
                "partition_key": accessors.partition_key,
            }
        )
    return events
