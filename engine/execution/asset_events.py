"""The asset events a task's context shows: ``AssetEvent`` (one event, read by item and by
attribute), ``AssetEvents`` (``{asset name: [AssetEvent, ...]}`` that also takes an ``Asset``
or alias as key: ``triggering_asset_events``) and ``InletEvents`` (``inlet_events``). The raw
event dict's keys are ``EVENT_KEYS`` (``engine.execution.context`` documents them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.assets import Asset
from engine.authoring.context import as_moment
from engine.execution.outlets import name_of

if TYPE_CHECKING:
    from engine.authoring.baseoperator import BaseOperator

EVENT_KEYS: Final = (
    "id",
    "asset",
    "uri",
    "extra",
    "payload",
    "timestamp",
    "source",
    "source_watcher",
    "source_dag_id",
    "source_run_id",
    "source_task_id",
    "source_try_number",
    "source_alias",
    "created_by",
    "partition_key",
)


class AttributeDict(dict[str, Any]):
    """A dict whose keys also read as attributes (``e.extra`` is ``e["extra"]``)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no {name!r}") from None


class AssetEvent(AttributeDict):
    """One asset event as a task sees it; ``asset`` has ``name`` and ``uri``."""

    __slots__ = ()


def event_view(asset_name: str, raw: object) -> AssetEvent:
    if not isinstance(raw, Mapping):
        raise TypeError(f"an asset event of {asset_name!r} must be a mapping, got {raw!r}")
    data: dict[str, Any] = dict.fromkeys(EVENT_KEYS)
    data.update(raw)
    name = data["asset"] if isinstance(data["asset"], str) else asset_name
    data["uri"] = data["uri"] or name
    data["asset"] = AttributeDict(name=name, uri=data["uri"])
    data["extra"] = dict(data["extra"] or {})
    data["timestamp"] = as_moment(data["timestamp"])
    return AssetEvent(data)


class AssetEvents(dict[str, list[AssetEvent]]):
    """``{asset name: [AssetEvent, ...]}`` that also takes an ``Asset`` or alias as key."""

    __slots__ = ()

    @classmethod
    def from_raw(cls, raw: object) -> AssetEvents:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise TypeError(f"asset events must be a mapping of names to lists, got {raw!r}")
        return cls({name: [event_view(name, event) for event in raw[name]] for name in raw})

    def __getitem__(self, key: object) -> list[AssetEvent]:
        return super().__getitem__(name_of(key))

    def __contains__(self, key: object) -> bool:
        return super().__contains__(name_of(key))

    def get(self, key: object, default: Any = None) -> Any:
        return super().get(name_of(key), default)


class InletEvents(AssetEvents):
    """``inlet_events``: an inlet of the task without events gives ``[]``."""

    __slots__ = ("_inlets", "_task_id", "_uris")

    def __init__(self, events: Mapping[str, list[AssetEvent]], task: BaseOperator) -> None:
        super().__init__(events)
        self._inlets = {item.name for item in task.inlets}
        self._uris = {item.name: item.uri for item in task.inlets if isinstance(item, Asset)}
        self._task_id = task.task_id

    def for_asset(self, *, name: str | None = None, uri: str | None = None) -> list[AssetEvent]:
        """Airflow's ``inlet_events.for_asset(name=..., uri=...)`` (templates use it): the
        events of the inlet asset with that name, that URI, or both."""
        if name is None and uri is None:
            raise TypeError(f"task {self._task_id!r}: inlet_events.for_asset() needs name= or uri=")
        if uri is not None:
            named = [key for key, value in self._uris.items() if value == uri]
            if name is not None and name not in named:
                raise KeyError(
                    f"task {self._task_id!r}: no inlet asset named {name!r} has the URI {uri!r}"
                )
            if name is None:
                if not named:
                    raise KeyError(
                        f"task {self._task_id!r}: no inlet asset has the URI {uri!r} "
                        f"(inlets: {sorted(self._inlets)})"
                    )
                name = named[0]
        return self[name]

    def for_asset_alias(self, *, name: str) -> list[AssetEvent]:
        """Airflow's ``inlet_events.for_asset_alias(name=...)``: the events of that alias."""
        return self[name]

    def __missing__(self, name: str) -> list[AssetEvent]:
        if name in self._inlets:
            return []
        raise KeyError(
            f"task {self._task_id!r}: {name!r} is not one of its inlets {sorted(self._inlets)}; "
            "add it to inlets=[...] to read its events"
        )
