"""Assets, aliases, their watchers, and asset conditions (what an asset-scheduled DAG waits for).

An ``Asset`` is a named piece of data. Its ``AssetWatcher``s each hold an event trigger
(a ``BaseEventTrigger``); every event such a trigger fires becomes an asset event, which
can start the DAGs scheduled on the asset. A task updates an asset too: each asset in its
``outlets`` gets an event when the task succeeds. An ``AssetAlias`` names assets a task
only picks at run time (``outlet_events[alias].add(Asset(...))``); a DAG scheduled on the
alias runs when an event is attached through it. A DAG's ``schedule`` is an asset
condition: an ``Asset`` or ``AssetAlias`` (updated), ``a & b`` / ``AssetAll`` (all
updated), ``a | b`` / ``AssetAny`` (any updated), nested freely; a list means all of them.
``Asset.ref(name=...)`` (an ``AssetNameRef``) stands for an asset declared elsewhere (another
DAG file): it declares nothing and is met when the asset of that name is updated.

``evaluate(updated, aliases)`` is pure: ``updated`` holds the names of the assets with at
least one new event since the DAG's last asset-triggered run, ``aliases`` the names of the
aliases with such an event. Conditions are stored in ``dag.schedule`` as JSON (``to_json``
/ ``BaseAsset.from_json``). ``Metadata`` is what a task yields or returns to set the extra
of an outlet's event (Airflow's ``Metadata``).

Only event triggers may drive a watcher: a trigger that waits for a state (a file exists, a
job succeeded) stays true once met and would start the DAG again on every check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.errors import DagDefinitionError
from engine.authoring.locations import caller_location
from triggers.base import BaseEventTrigger, BaseTrigger, classpath_of

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence, Set

ASSET_NAME_MAX_CHARS: Final = 1500
ASSET_TYPE: Final = "asset"
ASSET_ALL_TYPE: Final = "asset_all"
ASSET_ANY_TYPE: Final = "asset_any"
ASSET_ALIAS_TYPE: Final = "asset_alias"
ASSET_NAME_REF_TYPE: Final = "asset_name_ref"
DEFAULT_ASSET_GROUP: Final = "asset"
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

    def evaluate(self, updated: Set[str], aliases: Set[str] = frozenset()) -> bool:
        """True when the condition is met given the names of the updated assets and aliases."""
        raise NotImplementedError

    def iter_asset_leaves(self) -> Iterator[Asset | AssetNameRef]:
        """Every ``Asset`` and ``AssetNameRef`` the condition mentions (possibly more than
        once), in order: the leaves met by an asset's update."""
        raise NotImplementedError

    def iter_assets(self) -> Iterator[Asset]:
        """Every ``Asset`` the condition declares (possibly more than once), in order;
        references (``Asset.ref``) declare nothing and are left out."""
        return (leaf for leaf in self.iter_asset_leaves() if isinstance(leaf, Asset))

    def iter_aliases(self) -> Iterator[AssetAlias]:
        """Every ``AssetAlias`` the condition mentions (possibly more than once), in order."""
        return iter(())

    def asset_names(self) -> list[str]:
        """The distinct names of the assets the condition mentions (declared or referenced by
        name), in order."""
        return list(dict.fromkeys(leaf.name for leaf in self.iter_asset_leaves()))

    def alias_names(self) -> list[str]:
        """The distinct names of the aliases the condition mentions, in order."""
        return list(dict.fromkeys(alias.name for alias in self.iter_aliases()))

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
    """A named piece of data; ``uri`` defaults to the name (the name to the uri); ``watchers``
    update it. ``group`` is stored only (Airflow shows it in its UI)."""

    __slots__ = ("extra", "group", "name", "uri", "watchers")

    def __init__(
        self,
        name: str | None = None,
        uri: str | None = None,
        *,
        group: str = DEFAULT_ASSET_GROUP,
        extra: dict[str, Any] | None = None,
        watchers: Sequence[AssetWatcher] = (),
    ) -> None:
        where = caller_location()
        if name is None and uri is None:
            raise DagDefinitionError(f"{where}: Asset() needs a name or a uri")
        self.name = _check_name("Asset name", uri if name is None else name, where=where)
        label = self.name
        self.uri = _check_name(f"asset {label!r} uri", label if uri is None else uri, where=where)
        self.group = _check_name(f"asset {label!r} group", group, where=where)
        self.extra = _check_extra(label, extra, where=where)
        self.watchers = _check_watchers(label, watchers, where=where)

    @staticmethod
    def ref(*, name: str = "", uri: str = "") -> AssetNameRef:
        """A reference to the asset named ``name``, declared in another DAG file."""
        where = caller_location()
        if uri:
            raise DagDefinitionError(
                f"{where}: Asset.ref(uri={uri!r}) is not supported: assets are matched by "
                "name here; refer to the asset by its name: Asset.ref(name=...)"
            )
        return AssetNameRef(name, where=where)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Asset):
            return NotImplemented
        return (self.name, self.uri) == (other.name, other.uri)

    def __hash__(self) -> int:
        return hash((Asset, self.name, self.uri))

    def __repr__(self) -> str:
        watchers = [watcher.name for watcher in self.watchers]
        return f"Asset(name={self.name!r}, uri={self.uri!r}, watchers={watchers})"

    def evaluate(self, updated: Set[str], aliases: Set[str] = frozenset()) -> bool:
        return self.name in updated

    def iter_asset_leaves(self) -> Iterator[Asset | AssetNameRef]:
        yield self

    def to_json(self) -> dict[str, Any]:
        return {"__type": ASSET_TYPE, "name": self.name, "uri": self.uri}


class AssetNameRef(BaseAsset):
    """``Asset.ref(name=...)``: the asset of that name, declared by some DAG file.

    It declares nothing (no uri, no watchers): a DAG scheduled on it waits until some file
    declares the asset, then runs on that asset's events like on the asset itself.
    """

    __slots__ = ("name",)

    def __init__(self, name: str, *, where: str | None = None) -> None:
        self.name = _check_name("Asset.ref name", name, where=where or caller_location())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AssetNameRef):
            return NotImplemented
        return self.name == other.name

    def __hash__(self) -> int:
        return hash((AssetNameRef, self.name))

    def __repr__(self) -> str:
        return f"AssetNameRef(name={self.name!r})"

    def evaluate(self, updated: Set[str], aliases: Set[str] = frozenset()) -> bool:
        return self.name in updated

    def iter_asset_leaves(self) -> Iterator[Asset | AssetNameRef]:
        yield self

    def to_json(self) -> dict[str, Any]:
        return {"__type": ASSET_NAME_REF_TYPE, "name": self.name}


class AssetAlias(BaseAsset):
    """A name for the assets a task picks at run time.

    In ``outlets``, the task attaches events to assets through it
    (``outlet_events[alias].add(Asset("s3://bucket/2024-01-01"), extra={...})``); in a
    ``schedule``, the DAG runs when an event is attached through the alias.
    """

    __slots__ = ("group", "name")

    def __init__(self, name: str, *, group: str = DEFAULT_ASSET_GROUP) -> None:
        where = caller_location()
        self.name = _check_name("AssetAlias name", name, where=where)
        self.group = _check_name(f"asset alias {name!r} group", group, where=where)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AssetAlias):
            return NotImplemented
        return self.name == other.name

    def __hash__(self) -> int:
        return hash((AssetAlias, self.name))

    def __repr__(self) -> str:
        return f"AssetAlias(name={self.name!r})"

    def evaluate(self, updated: Set[str], aliases: Set[str] = frozenset()) -> bool:
        return self.name in aliases

    def iter_asset_leaves(self) -> Iterator[Asset | AssetNameRef]:
        yield from ()

    def iter_aliases(self) -> Iterator[AssetAlias]:
        yield self

    def to_json(self) -> dict[str, Any]:
        return {"__type": ASSET_ALIAS_TYPE, "name": self.name}


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

    def iter_asset_leaves(self) -> Iterator[Asset | AssetNameRef]:
        for item in self.objects:
            yield from item.iter_asset_leaves()

    def iter_aliases(self) -> Iterator[AssetAlias]:
        for item in self.objects:
            yield from item.iter_aliases()

    def to_json(self) -> dict[str, Any]:
        return {"__type": self.json_type, "objects": [item.to_json() for item in self.objects]}


class AssetAll(_AssetBooleanCondition):
    """Met when every one of its objects is met (``a & b``)."""

    __slots__ = ()
    json_type = ASSET_ALL_TYPE

    def evaluate(self, updated: Set[str], aliases: Set[str] = frozenset()) -> bool:
        return all(item.evaluate(updated, aliases) for item in self.objects)


class AssetAny(_AssetBooleanCondition):
    """Met when at least one of its objects is met (``a | b``)."""

    __slots__ = ()
    json_type = ASSET_ANY_TYPE

    def evaluate(self, updated: Set[str], aliases: Set[str] = frozenset()) -> bool:
        return any(item.evaluate(updated, aliases) for item in self.objects)


class Metadata:
    """The ``extra`` of an outlet's event, yielded or returned by a task (Airflow's ``Metadata``).

    ``yield Metadata(asset, {"rows": 10})`` sets ``outlet_events[asset].extra``; with
    ``alias=``, the event is also attached to ``asset`` through that alias (the alias must be
    in the task's ``outlets``). ``asset`` and ``alias`` may be given by name.
    """

    __slots__ = ("alias", "asset", "extra")

    def __init__(
        self,
        asset: Asset | str,
        extra: Mapping[str, Any] | None = None,
        alias: AssetAlias | str | None = None,
    ) -> None:
        where = caller_location()
        if not isinstance(asset, Asset | str):
            raise TypeError(f"{where}: Metadata asset must be an Asset or a name, got {asset!r}")
        if alias is not None and not isinstance(alias, AssetAlias | str):
            raise TypeError(
                f"{where}: Metadata alias must be an AssetAlias, a name or None, got {alias!r}"
            )
        if extra is not None and not isinstance(extra, Mapping):
            raise TypeError(f"{where}: Metadata extra must be a dict, got {extra!r}")
        self.asset = asset
        self.extra: dict[str, Any] = dict(extra or {})
        self.alias = alias

    @property
    def asset_name(self) -> str:
        return self.asset if isinstance(self.asset, str) else self.asset.name

    @property
    def alias_name(self) -> str | None:
        return self.alias if self.alias is None or isinstance(self.alias, str) else self.alias.name

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Metadata):
            return NotImplemented
        mine = (self.asset_name, self.extra, self.alias_name)
        return mine == (other.asset_name, other.extra, other.alias_name)

    __hash__ = None  # type: ignore[assignment]  # extra is a mutable dict

    def __repr__(self) -> str:
        alias = "" if self.alias is None else f", alias={self.alias_name!r}"
        return f"Metadata({self.asset_name!r}, extra={self.extra!r}{alias})"


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
    if kind in (ASSET_ALIAS_TYPE, ASSET_NAME_REF_TYPE):
        name = data.get("name")
        if not isinstance(name, str):
            raise ValueError(f"stored {kind} needs a string name, got {data!r}")
        return AssetAlias(name) if kind == ASSET_ALIAS_TYPE else AssetNameRef(name)
    if kind in (ASSET_ALL_TYPE, ASSET_ANY_TYPE):
        objects = data.get("objects")
        if not isinstance(objects, list) or not objects:
            raise ValueError(f"stored {kind} needs a non-empty list of objects, got {data!r}")
        children = [_from_json(item) for item in objects]
        return AssetAll(*children) if kind == ASSET_ALL_TYPE else AssetAny(*children)
    raise ValueError(f"unknown asset condition type {kind!r}")


def is_condition_met(
    condition: BaseAsset | None, updated: Set[str], aliases: Set[str] = frozenset()
) -> bool:
    """Whether a DAG scheduled on ``condition`` runs, given the assets updated since its last
    asset-triggered run (and the aliases those assets belong to). A DAG with no asset
    schedule is never asset-triggered. The scheduler's decision (``engine.advancing.rules``)."""
    return condition is not None and bool(updated) and condition.evaluate(updated, aliases)


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
        f"{where}: an asset schedule must be an Asset, an AssetAlias, an Asset.ref(name=...), a "
        f"list of them or an asset condition (a & b, a | b), got {schedule!r}"
    )


def as_asset_list(where: str, name: str, value: object) -> list[Asset | AssetAlias]:
    """``outlets=`` / ``inlets=`` as a list: one asset or alias, or a list of them."""
    if value is None:
        return []
    items = list(value) if isinstance(value, list | tuple | set | frozenset) else [value]
    for item in items:
        if not isinstance(item, Asset | AssetAlias):
            raise DagDefinitionError(
                f"{where}: {name} takes Asset and AssetAlias objects (or a list of them), "
                f"got {item!r}"
            )
    return items  # type: ignore[return-value]  # checked above
