"""Which group each binding seq belongs to: how a confirmation finds its group.

The binding seqs of every group of one manager come from one counter (``seqs``, handed to
each group's ledger), so a seq names its group. The manager records the group of each seq
it hands out (``bind_pending_event``) and routes ``confirm_persisted`` /
``refuse_persisted`` by it (``take``); a group voids the seqs its ledger released (a
subscriber failed or rejected, the group stopped), which will never be confirmed.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

G = TypeVar("G")


class BindingRoutes(Generic[G]):
    """Binding seq -> the group that handed it out, for seqs not confirmed nor voided."""

    __slots__ = ("_owner", "seqs")

    def __init__(self) -> None:
        self.seqs: Iterator[int] = itertools.count(1)
        self._owner: dict[int, G] = {}

    def add(self, seq: int, group: G) -> None:
        """``group`` handed out ``seq``."""
        self._owner[seq] = group

    def void(self, seqs: Iterable[int]) -> None:
        """These seqs will never count again (their group's ledger released them)."""
        owner = self._owner
        for seq in seqs:
            owner.pop(seq, None)

    def take(self, seqs: Iterable[int]) -> Iterator[tuple[G, list[int]]]:
        """Remove these seqs, yielding them as runs of consecutive seqs of one group.

        Lazy: a run is yielded when the first seq of the next group is taken, and the seqs
        after that one are looked up only once the run is handled; seqs that handling voided
        are then skipped, as are unknown seqs.
        """
        owner = self._owner
        group: G | None = None
        run: list[int] = []
        for seq in seqs:
            owning = owner.pop(seq, None)
            if owning is None:
                continue
            if owning is not group:
                if group is not None:
                    yield group, run
                group, run = owning, []
            run.append(seq)
        if group is not None:
            yield group, run

    def take_all(self, seqs: Iterable[int]) -> list[tuple[G, list[int]]]:
        """Remove these seqs at once, as ``take`` groups them (unknown seqs are skipped).

        For callers whose handling of a run voids no seq of a later run (confirmations):
        one pass, no generator, the common single-run case in one list.
        """
        pop = self._owner.pop
        runs: list[tuple[G, list[int]]] = []
        group: G | None = None
        run: list[int] = []
        for seq in seqs:
            owning = pop(seq, None)
            if owning is None:
                continue
            if owning is group:
                run.append(seq)
            else:
                group, run = owning, [seq]
                runs.append((owning, run))
        return runs

    def __len__(self) -> int:
        return len(self._owner)

    def __repr__(self) -> str:
        return f"<BindingRoutes unconfirmed={len(self._owner)}>"
