"""What the shared-stream groups report about themselves: one immutable snapshot per key.

``SharedStreamManager.stats()`` returns one ``GroupStats`` per key with a live group. A key
can have two live groups for a while: one still draining its advances (its subscribers
left, e.g. the watcher restarted or its kwargs were edited) and the group that replaced
it. Their snapshots are merged here (``merge_by_key``), so the triggerer's database rows
(``sluice streams list``, primary key ``(triggerer_id, stream_key)``) and the metrics
endpoint (one series per key) never see a key twice. Both consumers read snapshots,
neither touches a group's state.

Counters must never go down while a key has a live group (Prometheus would read a drop as
a counter reset): the manager folds the counters of a group that finished into totals it
keeps for that key (``retired``) while another group of the key lives, and drops them once
none is left.
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

#: How many lanes a report names one by one (metric labels, the snapshot's JSON column);
#: the others are only counted. An SQS FIFO queue has one lane per MessageGroupId with
#: pending events: naming them all would make one series per message group.
REPORTED_LANES: Final = 20
KEY_LABEL_MAX_CHARS: Final = 1000

# Counters (and the subscriber count) add up across the groups of one key.
_SUMMED: Final = (
    "subscribers",
    "events_polled",
    "deliveries",
    "advances",
    "advanced_events",
    "advance_latency_sum_s",
    "overflows",
    "ack_timeouts",
    "rejects",
    "dead_lettered",
)


@dataclass(frozen=True, slots=True)
class GroupStats:
    """Counters are totals since the oldest live group of the key started; gauges are
    values at snapshot time. ``mode`` and ``last_advance_batch`` are the newest group's."""

    key: str  # repr() of the shared_stream_key
    mode: Literal["fast", "ack"]
    subscribers: int
    #: What the group reads (``keys.broker_kind``): "kafka", "sqs", ... or a class name.
    #: Not compared: it follows from ``key`` (and the trigger class), as ``digest`` does.
    broker: str = field(default="", compare=False)
    #: Largest number of unread events any subscriber queue held (high-water mark).
    queue_high_water: int = 0
    #: Unread events in the deepest subscriber queue now (it goes down again).
    queue_depth: int = 0
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
    #: Ack mode: events advanced with a rejected outcome (some subscriber refused them):
    #: what the producer sends its dead-letter way (a dead-letter topic or queue, a
    #: ``reject(requeue=False)``, ...). One per raw event, whatever its subscribers.
    dead_lettered: int = 0
    #: ``shared_stream.keys.stream_key_digest`` of the key, as trigger rows store it
    #: (``trigger.stream_digest``): what ties a snapshot to its triggers in the database.
    #: None for a key without a stable digest. Not compared: it follows from ``key``.
    digest: str | None = field(default=None, compare=False)

    @property
    def outstanding_events(self) -> int:
        """Events not advanced yet, every lane together."""
        return sum(self.outstanding_by_lane.values())


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
    dead_lettered: int = 0

    def count_advance(self, size: int, latency_s: float, *, rejected: int = 0) -> None:
        """An ``advance`` of ``size`` events, ``rejected`` of them with a rejected outcome
        (sent the dead-letter way), returned ``latency_s`` after its dispatch."""
        self.advances += 1
        self.advanced_events += size
        self.last_advance_batch = size
        self.advance_latency_sum_s += max(latency_s, 0.0)
        self.dead_lettered += rejected

    def snapshot(
        self,
        *,
        key: str,
        mode: Literal["fast", "ack"],
        subscribers: int,
        queue_depth: int,
        outstanding_by_lane: dict[str, int],
        oldest_unresolved_age_s: float | None,
        digest: str | None = None,
        broker: str = "",
    ) -> GroupStats:
        """These totals with the gauges read now, as one immutable ``GroupStats``."""
        return GroupStats(
            key=key,
            digest=digest,
            broker=broker,
            mode=mode,
            subscribers=subscribers,
            queue_depth=queue_depth,
            outstanding_by_lane=outstanding_by_lane,
            oldest_unresolved_age_s=oldest_unresolved_age_s,
            **{f.name: getattr(self, f.name) for f in fields(self)},
        )


def merge(older: GroupStats, newer: GroupStats) -> GroupStats:
    """One snapshot of two groups of one key: counters and backlogs add up, high-water
    marks and ages take the larger; ``mode``, ``broker`` and ``last_advance_batch`` are
    ``newer``'s on
    purpose (the group that takes the subscribers now; the older one only drains)."""
    if older.key != newer.key:
        raise ValueError(f"cannot merge the stats of keys {older.key!r} and {newer.key!r}")
    lanes = dict(older.outstanding_by_lane)
    for lane, count in newer.outstanding_by_lane.items():
        lanes[lane] = lanes.get(lane, 0) + count
    ages = [
        age
        for age in (older.oldest_unresolved_age_s, newer.oldest_unresolved_age_s)
        if age is not None
    ]
    summed = {name: getattr(older, name) + getattr(newer, name) for name in _SUMMED}
    return replace(
        newer,
        queue_high_water=max(older.queue_high_water, newer.queue_high_water),
        queue_depth=max(older.queue_depth, newer.queue_depth),
        outstanding_by_lane=lanes,
        oldest_unresolved_age_s=max(ages) if ages else None,
        **summed,
    )


def merge_by_key(stats: Iterable[GroupStats]) -> list[GroupStats]:
    """One snapshot per key, ordered by key; within a key, later snapshots are newer."""
    merged: dict[str, GroupStats] = {}
    for s in stats:
        seen = merged.get(s.key)
        merged[s.key] = s if seen is None else merge(seen, s)
    return sorted(merged.values(), key=lambda s: s.key)


def retired(final: GroupStats) -> GroupStats:
    """What a finished group still contributes to its key: its counters, no gauges."""
    return replace(
        final, subscribers=0, queue_depth=0, outstanding_by_lane={}, oldest_unresolved_age_s=None
    )


def busiest_lanes(
    outstanding: Mapping[str, int], limit: int = REPORTED_LANES
) -> list[tuple[str, int]]:
    """The ``limit`` lanes with the most outstanding events, busiest first (ties by lane).

    O(lanes · log limit): cheap with thousands of lanes.
    """
    return heapq.nsmallest(limit, outstanding.items(), key=lambda item: (-item[1], item[0]))


def key_label(key: str) -> str:
    """A group's key as shown (metric label, snapshot column): a repr longer than
    ``KEY_LABEL_MAX_CHARS`` keeps its head and a digest of the whole (still unique)."""
    if len(key) <= KEY_LABEL_MAX_CHARS:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{key[: KEY_LABEL_MAX_CHARS - 20]}...#{digest}"
