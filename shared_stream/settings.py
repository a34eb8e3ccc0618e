"""What every shared-stream group of one manager shares: plain values, no config object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from shared_stream.group import SharedStreamGroup


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """Limits and shared routing of a manager's groups.

    ``binding_seqs`` hands out binding seqs for every group of the manager, so that
    ``binding_owner`` (binding seq -> group) routes ``confirm_persisted`` calls. ``on_gone``
    tells the manager a group stopped taking subscribers.
    """

    max_queue: int
    ack_timeout_s: float
    cohort_grace_s: float
    stop_grace_s: float
    clock: Callable[[], float]
    binding_seqs: Iterator[int]
    binding_owner: dict[int, SharedStreamGroup]
    on_gone: Callable[[SharedStreamGroup], None]
