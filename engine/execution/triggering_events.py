"""``context["triggering_asset_events"]`` read when the task first looks at it.

A task's spec does not carry the asset events that triggered its run (a run a backlog drain
created can hold tens of thousands; most tasks never read them). ``LazyAssetEvents`` is the
same ``{asset name: [AssetEvent, ...]}`` mapping as the eager ``AssetEvents`` (keys by
name, ``Asset`` or alias; iteration, ``len``, ``in``, ``==``, ``repr``, templates), that
asks the executor for the run's events (``triggering_events`` on the request channel,
``engine.executor.event_requests``) the first time anything reads it, page by page in id
order, and keeps them. Each payload is decoded once, here (``triggers.serde``; a payload
another program stored in its own JSON is handed over as it is).

The reader is the process's request channel, set when the process opens it
(``use_events_reader``); a context built where there is none (a test hydrating a context by
hand) and whose raw data carries no events reads as no events, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from engine.execution.asset_events import AssetEvent, AssetEvents, event_view
from triggers.exceptions import SerializationError
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = (
    "EVENTS_PAGE_SIZE",
    "EventsReader",
    "LazyAssetEvents",
    "events_reader",
    "read_all",
    "use_events_reader",
)

#: the events one request asks for (the executor may answer fewer: its byte limit)
EVENTS_PAGE_SIZE: Final = 2_000


class EventsReader(Protocol):
    def triggering_events(self, *, after_id: int | None, limit: int) -> dict[str, Any]:
        """``{"more": bool, "events": [event dict, ...]}``: the run's events after
        ``after_id``, in id order."""


_reader: EventsReader | None = None


def use_events_reader(reader: EventsReader | None) -> None:
    """Where this process reads its run's triggering events (its executor's channel)."""
    global _reader
    _reader = reader


def events_reader() -> EventsReader | None:
    return _reader


def _payload(stored: Any) -> Any:
    try:
        return deserialize_value(stored)
    except SerializationError:
        return stored  # stored by another program: hand it over as it is


def read_all(reader: EventsReader, page_size: int = EVENTS_PAGE_SIZE) -> AssetEvents:
    """Every triggering event of the process's run, grouped by asset name, in id order."""
    grouped: dict[str, list[AssetEvent]] = {}
    after: int | None = None
    while True:
        page = reader.triggering_events(after_id=after, limit=page_size)
        for raw in page["events"]:
            raw["payload"] = _payload(raw.get("payload"))
            name = str(raw["asset"])
            grouped.setdefault(name, []).append(event_view(name, raw))
            after = int(raw["id"])
        if not page["more"]:
            return AssetEvents(grouped)


class LazyAssetEvents(Mapping[str, list[AssetEvent]]):
    """``AssetEvents`` read from ``reader`` on first use (any read, copy or comparison).

    A ``Mapping`` rather than a ``dict``, as Airflow's ``TriggeringAssetEventsAccessor``: a
    dict's C fast paths (``json.dumps``) would see an empty dict before the first read."""

    __slots__ = ("_events", "_reader")

    def __init__(self, reader: EventsReader) -> None:
        self._reader = reader
        self._events: AssetEvents | None = None

    def load(self) -> AssetEvents:
        """The run's events, read now if they were not yet (once)."""
        if self._events is None:
            self._events = read_all(self._reader)
        return self._events

    def __getitem__(self, key: object) -> list[AssetEvent]:
        return self.load()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.load())

    def __len__(self) -> int:
        return len(self.load())

    def __contains__(self, key: object) -> bool:
        return key in self.load()

    def get(self, key: object, default: Any = None) -> Any:
        return self.load().get(key, default)

    def __eq__(self, other: object) -> bool:
        return self.load() == (other.load() if isinstance(other, LazyAssetEvents) else other)

    __hash__ = None  # type: ignore[assignment]

    def __or__(self, other: Mapping[str, list[AssetEvent]]) -> AssetEvents:
        return AssetEvents({**self.load(), **other})

    def __ror__(self, other: Mapping[str, list[AssetEvent]]) -> AssetEvents:
        return AssetEvents({**other, **self.load()})

    def copy(self) -> AssetEvents:
        return AssetEvents(self.load())

    def __repr__(self) -> str:
        return repr(self.load())

    def __reduce__(self) -> tuple[Any, ...]:
        """Copies and pickles are the eager ``AssetEvents`` of the events."""
        return (AssetEvents, (dict(self.load()),))
