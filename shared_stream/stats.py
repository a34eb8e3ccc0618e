"""What a shared-stream group reports about itself: one immutable snapshot per group.

``SharedStreamManager.stats()`` returns one ``GroupStats`` per live group. The triggerer
publishes them to the database (``sluice streams list``) and the metrics endpoint exposes
them; both read snapshots, neither touches a group's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class GroupStats:
    """Counters are totals since the group started; gauges are values at snapshot time."""

    key: str  # repr() of the shared_stream_key
    mode: Literal["fast", "ack"]
    subscribers: int
    #: Largest number of unread events any subscriber queue held (high-water mark).
    queue_high_water: int = 0
    #: Ack mode: events not yet advanced, per lane (lane repr -> count).
    outstanding_by_lane: dict[str, int] = field(default_factory=dict)
    #: Ack mode: seconds since the oldest event not yet resolved by all was broadcast.
    oldest_unresolved_age_s: float | None = None
    events_polled: int = 0
    deliveries: int = 0
    advances: int = 0
    advanced_events: int = 0
    last_advance_batch: int = 0
    advance_latency_sum_s: float = 0.0
    overflows: int = 0
    ack_timeouts: int = 0
    rejects: int = 0


@dataclass(slots=True)
class GroupCounters:
    """The mutable totals a group keeps as it runs (plain integer bumps on the hot path)."""

    events_polled: int = 0
    deliveries: int = 0
    queue_high_water: int = 0
    advances: int = 0
    advanced_events: int = 0
    last_advance_batch: int = 0
    advance_latency_sum_s: float = 0.0
    overflows: int = 0
    ack_timeouts: int = 0
    rejects: int = 0
