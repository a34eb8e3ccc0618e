"""Which group each binding seq belongs to: how a confirmation finds its group.

A group's binding seqs name it: ``open(group)`` gives the group a serial, never reused
while the routes live, and a seq counter whose values carry that serial in their high
bits (``serial << SERIAL_SHIFT | n``). ``confirm_persisted`` / ``refuse_persisted`` find the
group of a seq with one shift and one lookup: nothing is recorded per seq on the fan-out
hot path, and a seq of a group already closed is unknown (skipped). Seqs a group's ledger
released (a subscriber failed or rejected, the group stopped) are still routed to it; its
ledger ignores seqs it no longer holds.

Seqs below ``1 << SERIAL_SHIFT`` (serial 0) are routed by explicit entries instead
(``add`` / ``void``, numbered by ``seqs``), one dict entry each.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Final, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

G = TypeVar("G")

# 2**48 binding seqs per group (a million a second for 8.9 years); a group's counter ends
# there (``bind`` would raise) rather than run into the next serial's range. Seqs stay
# machine-size ints for the first 2**15 serials (they live in memory only: never stored).
SERIAL_SHIFT: Final = 48


class BindingRoutes(Generic[G]):
    """Binding seq -> the group that handed it out (by serial, or by explicit entry)."""

    __slots__ = ("_owner", "_serials", "by_serial", "seqs")

    def __init__(self) -> None:
        self.seqs: Iterator[int] = itertools.count(1)  # for explicit entries (serial 0)
        self._owner: dict[int, G] = {}  # explicit entries
        # serial -> open group; read it, never change it (``open`` and ``close`` do): the
        # group of seq ``s`` with a serial is ``by_serial.get(s >> SERIAL_SHIFT)``, the hot
        # path of confirmations
        self.by_serial: dict[int, G] = {}
        self._serials = itertools.count(1)

    def open(self, group: G) -> tuple[int, Iterator[int]]:
        """Route the seqs of a new serial to ``group``; returns the serial and the group's
        seq counter (1, 2, ... in its serial's range)."""
        serial = next(self._serials)
        self.by_serial[serial] = group
        base = serial << SERIAL_SHIFT
        return serial, _bounded_count(base + 1, base + (1 << SERIAL_SHIFT))

    def close(self, serial: int) -> None:
        """The group of ``serial`` ended: its seqs are unknown from now on."""
        self.by_serial.pop(serial, None)

    def add(self, seq: int, group: G) -> None:
        """``group`` handed out ``seq`` (an explicit entry, for seqs of serial 0)."""
        self._owner[seq] = group

    def void(self, seqs: Iterable[int]) -> None:
        """These seqs will never count again (their group's ledger released them)."""
        owner = self._owner
        for seq in seqs:
            owner.pop(seq, None)

    def take_explicit(self, seq: int) -> G | None:
        """Remove the explicit entry of ``seq`` (serial 0); its group, None when unknown."""
        return self._owner.pop(seq, None)

    def _owner_of(self, seq: int) -> G | None:
        serial = seq >> SERIAL_SHIFT
        return self.by_serial.get(serial) if serial else self._owner.pop(seq, None)

    def take(self, seqs: Iterable[int]) -> Iterator[tuple[G, list[int]]]:
        """Remove these seqs, yielding them as runs of consecutive seqs of one group.

        Lazy: a run is yielded when the first seq of the next group is taken, and the seqs
        after that one are looked up only once the run is handled; explicit seqs that
        handling voided are then skipped, as are unknown seqs.
        """
        group: G | None = None
        run: list[int] = []
        for seq in seqs:
            owning = self._owner_of(seq)
            if owning is None:
                continue
            if owning is not group:
                if group is not None:
                    yield group, run
                group, run = owning, []
            run.append(seq)
        if group is not None:
            yield group, run

    def __len__(self) -> int:
        """Explicit entries not confirmed nor voided (serial-routed seqs are not counted
        here: their groups' ledgers hold them)."""
        return len(self._owner)

    def __repr__(self) -> str:
        return f"<BindingRoutes unconfirmed={len(self._owner)} open_groups={len(self.by_serial)}>"


def _bounded_count(start: int, stop: int) -> Iterator[int]:
    """``itertools.count(start)`` up to ``stop`` (excluded): C speed, ends instead of
    running into the next range."""
    return iter(range(start, stop))
