"""What every shared-stream group of one manager shares: plain values, no config object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """Limits of a manager's groups, and the clock of their ack timeouts (monotonic seconds).

    The routing of binding seqs to groups is not a setting: see ``routes.BindingRoutes``.
    """

    max_queue: int
    ack_timeout_s: float
    cohort_grace_s: float
    stop_grace_s: float
    clock: Callable[[], float]
    #: how long a key's new group waits for the subscribers of its failed predecessor, and
    #: a group for a subscriber that failed (ack mode), before it fans out without them
    cohort_return_s: float
    #: asked right before every ``producer.advance``, which waits while it is False: while
    #: the owner of the groups cannot tell it still holds its lease (a fenced manager ends
    #: its groups instead, ``SharedStreamManager.fence``)
    may_advance: Callable[[], bool] = lambda: True
