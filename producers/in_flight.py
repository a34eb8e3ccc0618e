"""``InFlightLedger``: the deliveries a producer holds and keeps alive, by key.

Pure: no ``await``, no clock (``now`` is a parameter), no broker client. A producer that must
keep restarting a timer of each delivery it holds (NATS: the ack wait, ``in_progress``; Redis
Streams: the idle time, ``XCLAIM``) adds each one as it is fetched, asks which are ``due``,
restarts them, reports them ``restarted``, and takes each out as it is advanced.

A dict keeps insertion order and ``restarted`` moves an entry to the end, so the entry
restarted longest ago is always first: ``next_due`` reads one entry and ``due`` stops at the
first that is not. A broker's subclass says how an entry is keyed and where its restart
time lives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterable

KeyT = TypeVar("KeyT", bound="Hashable")
EntryT = TypeVar("EntryT")


class InFlightLedger(Generic[KeyT, EntryT]):
    """Held entries by key, the one restarted longest ago first."""

    def __init__(self) -> None:
        self._entries: dict[KeyT, EntryT] = {}

    # -- what a broker's entries are ------------------------------------------------------

    def _key_of(self, entry: EntryT) -> KeyT:
        raise NotImplementedError

    def _restarted_at(self, entry: EntryT) -> float:
        raise NotImplementedError

    def _set_restarted_at(self, entry: EntryT, now: float) -> None:
        raise NotImplementedError

    # -- the ledger -----------------------------------------------------------------------

    def add(self, entry: EntryT) -> None:
        self._entries[self._key_of(entry)] = entry

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def _take(self, key: KeyT) -> EntryT | None:
        """The entry of ``key``, out of the ledger (None: it is not held)."""
        return self._entries.pop(key, None)

    def next_due(self, every_s: float) -> float | None:
        """When the entry restarted longest ago is ``every_s`` old (None: nothing held)."""
        for entry in self._entries.values():
            return self._restarted_at(entry) + every_s
        return None

    def due(self, now: float, every_s: float) -> list[EntryT]:
        """Entries restarted ``every_s`` or more before ``now``."""
        due = []
        for entry in self._entries.values():
            if self._restarted_at(entry) + every_s > now:
                break
            due.append(entry)
        return due

    def restarted(self, entries: Iterable[EntryT], now: float) -> None:
        """``entries`` had their timer restarted at ``now``; those advanced meanwhile (no
        longer held) are ignored."""
        for entry in entries:
            key = self._key_of(entry)
            if self._entries.pop(key, None) is None:
                continue
            self._set_restarted_at(entry, now)
            self._entries[key] = entry

    def drain(self) -> list[EntryT]:
        """Take every entry out (the producer is closing)."""
        entries = list(self._entries.values())
        self._entries.clear()
        return entries

    def __len__(self) -> int:
        return len(self._entries)
