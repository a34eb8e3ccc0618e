"""Assets, their watchers, and asset conditions (what an asset-scheduled DAG waits for).

An ``Asset`` is a named piece of data. Its ``AssetWatcher``s each hold an event trigger
(a ``BaseEventTrigger``); every event such a trigger fires becomes an asset event, which
can start the DAGs scheduled on the asset. A DAG's ``schedule`` is an asset condition:
an ``Asset`` (updated), ``a & b`` / ``AssetAll`` (all updated), ``a | b`` / ``AssetAny``
(any updated), nested freely; a list of assets means all of them.

``evaluate(updated)`` is pure: ``updated`` holds the names of the assets with at least one
new event since the DAG's last asset-triggered run. Conditions are stored in ``dag.schedule``
as JSON (``to_json`` / ``BaseAsset.from_json``).

Only event triggers may drive a watcher: a trigger that waits for a state (a file exists, a
job succeeded) stays true once met and would start the DAG again on every check.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.context import DagDefinitionError, caller_location
from triggers.base import BaseEventTrigger, BaseTrigger, classpath_of

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence, Set

ASSET_NAME_MAX_CHARS: Final = 1500
ASSET_TYPE: Final = "asset"
ASSET_ALL_TYPE: Final = "asset_all"
ASSET_ANY_TYPE: Final = "asset_any"
EVENT_TRIGGER_HINT: Final = (
    "only a BaseEventTrigger can drive an asset watcher (a trigger that waits for a state "
    "stays true once met and would start the DAG again and again); use an event trigger such "
    "as triggers.FileDeleteTrigger or triggers.DirectoryWatchTrigger, or write one that "
    "inherits BaseEventTrigger"
)


def _check_name(kind: str, value: object, *, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DagDefinitionError(f"{where}: {kind} must be a non-empty string, got {value!r}")
    if len(value) > ASSET_NAME_MAX_CHARS:
        raise DagDefinitionError(
            f"{where}: {kind} {value[:40]!r}... is longer than {ASSET_NAME_MAX_CHARS} characters"
        )
    return value


class BaseAsset:
    """An asset condition: combine with ``&`` (all) and ``|`` (any)."""

    __slots__ = ()

    def __and__(self, other: BaseAsset) -> AssetAll:
        if not isinstance(other, BaseAsset):
            return NotImplemented
        return AssetAll(*_flatten(AssetAll, (self, other)))

    def __or__(self, other: BaseAsset) -> AssetAny:
        if not isinstance(other, BaseAsset):
            return NotImplemented
        return AssetAny(*_flatten(AssetAny, (self, other)))

    def evaluate(self, updated: Set[str]) -> bool:
        """True when the condition is met given the names of the updated assets."""
        raise NotImplementedError

    def iter_assets(self) -> Iterator[Asset]:
        """Every ``Asset`` the condition mentions (possibly more than once), in order."""
        raise NotImplementedError

    def asset_names(self) -> list[str]:
        """The distinct names of the assets the condition mentions, in order."""
        return list(dict.fromkeys(asset.name for asset in self.iter_assets()))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data; ``BaseAsset.from_json`` rebuilds the condition (without watchers)."""
        raise NotImplementedError

    @staticmethod
    def from_json(data: object) -> BaseAsset:
        """Rebuild a condition stored by ``to_json``; raises ``ValueError`` on bad data."""
        try:
            return _from_json(data)
        except RecursionError as exc:
            raise ValueError("asset condition nested too deeply") from exc


class AssetWatcher:
    """Watches an external source for an asset through an event trigger.

    The trigger type is checked by the ``Asset`` the watcher is given to, so the error can
    name the DAG file, the asset and the watcher.
    """

    __slots__ = ("name", "trigger")

    def __init__(self, name: str, trigger: BaseEventTrigger) -> None:
        self.name = _check_name("AssetWatcher name", name, where=caller_location())
        self.trigger = trigger

    def __repr__(self) -> str:
        return f"AssetWatcher(name={self.name!r}, trigger={classpath_of(self.trigger)})"

    def check(self, asset_name: str, *, where: str) -> None:
        """Raise ``DagDefinitionError`` unless the trigger is a ``BaseEventTrigger`` instance."""
        trigger = self.trigger
        if isinstance(trigger, BaseEventTrigger):
            return
        prefix = f"{where}: asset {asset_name!r} watcher {self.name!r}"
        if isinstance(trigger, BaseTrigger):
            raise DagDefinitionError(
                f"{prefix}: trigger {classpath_of(trigger)} is a BaseTrigger, not a "
                f"BaseEventTrigger; {EVENT_TRIGGER_HINT}"
            )
        if isinstance(trigger, type) and issubclass(trigger, BaseTrigger):
            raise DagDefinitionError(
                f"{prefix}: got the trigger class {classpath_of(trigger)}, not an instance; "
                f"call it with its arguments, e.g. {trigger.__name__}(...)"
            )
        raise DagDefinitionError(
            f"{prefix}: trigger must be a BaseEventTrigger instance, got {trigger!r}"
        )


class Asset(BaseAsset):
    """A named piece of data; ``uri`` defaults to the name; ``watchers`` update it."""

    __slots__ = ("extra", "name", "uri", "watchers")

    def __init__(
        self,
        name: str,
        uri: str | None = None,
        *,
        extra: dict[str, Any] | None = None,
        watchers: Sequence[AssetWatcher] = (),
    ) -> None:
        where = caller_location()
        self.name = _check_name("Asset name", name, where=where)
        self.uri = _check_name(f"asset {name!r} uri", name if uri is None else uri, where=where)
        self.extra = _check_extra(name, extra, where=where)
        self.watchers = _check_watchers(name, watchers, where=where)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Asset):
            return NotImplemented
        return (self.name, self.uri) == (other.name, other.uri)

    def __hash__(self) -> int:
        return hash((Asset, self.name, self.uri))

    def __repr__(self) -> str:
        watchers = [watcher.name for watcher in self.watchers]
        return f"Asset(name={self.name!r}, uri={self.uri!r}, watchers={watchers})"

    def evaluate(self, updated: Set[str]) -> bool:
        return self.name in updated

    def iter_assets(self) -> Iterator[Asset]:
        yield self

    def to_json(self) -> dict[str, Any]:
        return {"__type": ASSET_TYPE, "name": self.name, "uri": self.uri}


class _AssetBooleanCondition(BaseAsset):
    __slots__ = ("objects",)
    json_type: str = ""

    def __init__(self, *objects: BaseAsset) -> None:
        kind = type(self).__name__
        if not objects:
            raise DagDefinitionError(f"{caller_location()}: {kind}() needs at least one asset")
        for item in objects:
            if not isinstance(item, BaseAsset):
                raise DagDefinitionError(
                    f"{caller_location()}: {kind}() takes assets or asset conditions, got {item!r}"
                )
        self.objects: tuple[BaseAsset, ...] = tuple(objects)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _AssetBooleanCondition):
            return NotImplemented
        return type(self) is type(other) and self.objects == other.objects

    def __hash__(self) -> int:
        return hash((type(self), self.objects))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.objects))})"

    def iter_assets(self) -> Iterator[Asset]:
        for item in self.objects:
            yield from item.iter_assets()

    def to_json(self) -> dict[str, Any]:
        return {"__type": self.json_type, "objects": [item.to_json() for item in self.objects]}


class AssetAll(_AssetBooleanCondition):
    """Met when every one of its objects is met (``a & b``)."""

    __slots__ = ()
    json_type = ASSET_ALL_TYPE

    def evaluate(self, updated: Set[str]) -> bool:
        return all(item.evaluate(updated) for item in self.objects)


class AssetAny(_AssetBooleanCondition):
    """Met when at least one of its objects is met (``a | b``)."""

    __slots__ = ()
    json_type = ASSET_ANY_TYPE

    def evaluate(self, updated: Set[str]) -> bool:
        return any(item.evaluate(updated) for item in self.objects)


def _flatten(kind: type[_AssetBooleanCondition], items: Iterable[BaseAsset]) -> list[BaseAsset]:
    """``(a & b) & c`` becomes ``AssetAll(a, b, c)``: same meaning, flatter JSON."""
    flat: list[BaseAsset] = []
    for item in items:
        flat.extend(item.objects if type(item) is kind else (item,))
    return flat


def _check_extra(name: str, extra: object, *, where: str) -> dict[str, Any]:
    if extra is None:
        return {}
    try:
        if not isinstance(extra, dict):
            raise TypeError(f"expected a dict, got {type(extra).__name__}")
        json.dumps(extra, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DagDefinitionError(
            f"{where}: asset {name!r} extra must be a JSON-serializable dict with string keys "
            f"({exc})"
        ) from exc
    return dict(extra)


def _check_watchers(name: str, watchers: object, *, where: str) -> tuple[AssetWatcher, ...]:
    if isinstance(watchers, AssetWatcher) or not isinstance(watchers, list | tuple):
        raise DagDefinitionError(
            f"{where}: asset {name!r} watchers must be a list of AssetWatcher, got {watchers!r}"
        )
    seen: set[str] = set()
    for watcher in watchers:
        if not isinstance(watcher, AssetWatcher):
            raise DagDefinitionError(
                f"{where}: asset {name!r} watchers must hold AssetWatcher objects, got "
                f"{watcher!r}; wrap the trigger: AssetWatcher(name=..., trigger=...)"
            )
        watcher.check(name, where=where)
        if watcher.name in seen:
            raise DagDefinitionError(
                f"{where}: asset {name!r} has two watchers named {watcher.name!r}; "
                "watcher names must be unique per asset"
            )
        seen.add(watcher.name)
    return tuple(watchers)


def _from_json(data: object) -> BaseAsset:
    if not isinstance(data, dict):
        raise ValueError(f"asset condition must be a JSON object, got {data!r}")
    kind = data.get("__type")
    if kind == ASSET_TYPE:
        name, uri = data.get("name"), data.get("uri")
        if not isinstance(name, str) or not isinstance(uri, str):
            raise ValueError(f"stored asset needs string name and uri, got {data!r}")
        return Asset(name, uri)
    if kind in (ASSET_ALL_TYPE, ASSET_ANY_TYPE):
        objects = data.get("objects")
        if not isinstance(objects, list) or not objects:
            raise ValueError(f"stored {kind} needs a non-empty list of objects, got {data!r}")
        children = [_from_json(item) for item in objects]
        return AssetAll(*children) if kind == ASSET_ALL_TYPE else AssetAny(*children)
    raise ValueError(f"unknown asset condition type {kind!r}")


def as_condition(schedule: object, *, where: str) -> BaseAsset | None:
    """Normalize a DAG's ``schedule`` argument to a condition (None: manual runs only)."""
    if schedule is None or isinstance(schedule, BaseAsset):
        return schedule
    if isinstance(schedule, list | tuple):
        if not schedule:
            raise DagDefinitionError(
                f"{where}: schedule=[] would never run; use schedule=None for manual runs only"
            )
        for item in schedule:
            if not isinstance(item, BaseAsset):
                raise DagDefinitionError(f"{where}: a schedule list must hold assets, got {item!r}")
        return schedule[0] if len(schedule) == 1 else AssetAll(*schedule)
    raise DagDefinitionError(
        f"{where}: schedule must be None, an Asset, a list of assets or an asset condition "
        f"(a & b, a | b), got {schedule!r}; time-based schedules are not supported"
    )
