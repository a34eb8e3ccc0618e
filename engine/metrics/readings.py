"""What the parts of a process report: plain counters, and immutable readings of them.

A part counts as it works, with plain integers and ``Buckets`` (a histogram without a
Prometheus call per value), and answers ``metrics_reading()`` with an immutable copy of
its counters; the collector asks at scrape time. The parts import this module, never the
other way round.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from shared_stream.stats import GroupStats


@dataclass
class Buckets:
    """A histogram as plain counters (read by the metrics endpoint at scrape time).

    ``counts[i]`` counts the values ``<= bounds[i]`` and ``> bounds[i - 1]``; the last slot
    counts the values above every bound.
    """

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value


@dataclass(frozen=True, slots=True)
class HistogramReading:
    """Bucket bounds, per-bucket (not cumulative) counts with a last +Inf slot, and sum."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float

    @classmethod
    def of(cls, buckets: Buckets) -> HistogramReading:
        return cls(buckets.bounds, tuple(buckets.counts), buckets.total)

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: ``(le, count of values <= le)``, ending with ``+Inf``."""
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


@dataclass(frozen=True, slots=True)
class TriggererReading:
    job_id: int | None
    running: int
    capacity: int
    events_fired: int
    failures_reported: int
    outbox_pending: int
    events_persisted: int
    events_refused: int
    asset_events_created: int
    tasks_resumed: int
    failures_persisted: int
    persist_dropped: int
    batch_size: HistogramReading
    commit_s: HistogramReading
    blocked_loops: int
    groups: tuple[GroupStats, ...] | None  # None: not readable at this scrape


@dataclass(frozen=True, slots=True)
class SchedulerReading:
    job_id: int | None
    runs_created: tuple[tuple[str, int], ...]  # (run type, runs of that type)
    tasks_scheduled: int
    runs_finished: int


@dataclass(frozen=True, slots=True)
class QueueReading:
    """One Celery queue as the Celery executor's sender sees it."""

    queue: str
    queued: int  # tries sent to it that no worker started yet
    running: int  # tries of its tasks running on a worker
    sent: int  # messages published to it by this sender (re-sends included)


@dataclass(frozen=True, slots=True)
class ExecutorReading:
    job_id: int | None
    slots_used: int
    slots_total: int
    claimed: int
    outcomes: tuple[tuple[str, int], ...]
    #: the Celery executor's queues (none for the local executor)
    queues: tuple[QueueReading, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineReading:
    triggerer: TriggererReading | None = None
    scheduler: SchedulerReading | None = None
    executor: ExecutorReading | None = None
    loop_responsive: bool = True


class ReportsTriggerer(Protocol):
    """A triggerer as the collector sees it."""

    def metrics_reading(self, *, with_groups: bool = True) -> TriggererReading: ...


class ReportsScheduler(Protocol):
    def metrics_reading(self) -> SchedulerReading: ...


class ReportsExecutor(Protocol):
    def metrics_reading(self) -> ExecutorReading: ...
