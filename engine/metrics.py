"""The Prometheus endpoint: what the engine parts of this process count, read at scrape time.

Theory of operation. The parts keep plain integer counters (and, in the persister, a couple
of bucket arrays) as they work: a fan-out path that delivers more than 100,000 events a
second must not pay for a Prometheus call per event. ``EngineCollector`` is a custom
collector in a per-process ``CollectorRegistry`` (not the global default, so tests can build
several engines in one process). At each scrape it takes an ``EngineReading`` (immutable
copies of those counters and of ``SharedStreamManager.stats()``) on the event loop thread,
where the parts mutate their state, and turns it into metric families in the HTTP server's
thread (``families``, a pure function).

When the loop does not answer within ``READ_TIMEOUT_S`` (a trigger blocks it: exactly when
an operator looks at the metrics), the reading is taken from the scrape thread instead, and
``sluice_event_loop_responsive`` says 0. Everything read there is a plain attribute read,
except the shared-stream snapshots, which are left out if the loop changed them under us.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from engine.db.queries.runs import ASSET_TRIGGERED
from engine.db.queries.streams import stream_key_column
from engine.exceptions import ConfigError
from shared_stream.stats import REPORTED_LANES, busiest_lanes

if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator, Sequence
    from wsgiref.simple_server import WSGIServer

    from engine.config import MetricsConfig
    from engine.executor.local import LocalExecutor
    from engine.scheduler.scheduler import Scheduler
    from engine.triggerer.persister import Buckets
    from engine.triggerer.triggerer import Triggerer
    from shared_stream.stats import GroupStats

__all__ = (
    "READ_TIMEOUT_S",
    "EngineCollector",
    "EngineReading",
    "ExecutorReading",
    "HistogramReading",
    "MetricsServer",
    "SchedulerReading",
    "TriggererReading",
    "families",
    "start_metrics_server",
)

logger = logging.getLogger(__name__)

READ_TIMEOUT_S: Final = 2.0
SERVER_STOP_TIMEOUT_S: Final = 5.0


# --- readings: immutable copies of the parts' counters ------------------------------------


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

    @classmethod
    def of(cls, triggerer: Triggerer, *, with_groups: bool = True) -> TriggererReading:
        stats = triggerer.persister.stats
        return cls(
            job_id=triggerer.job_id,
            running=len(triggerer.runner),
            capacity=triggerer.settings.capacity,
            events_fired=triggerer.runner.events_fired,
            failures_reported=triggerer.runner.failures_reported,
            outbox_pending=len(triggerer.outbox),
            events_persisted=stats.events,
            events_refused=stats.refused,
            asset_events_created=stats.asset_events,
            tasks_resumed=stats.tasks_resumed,
            failures_persisted=stats.failures_recorded,
            persist_dropped=stats.dropped,
            batch_size=HistogramReading.of(stats.batch_size),
            commit_s=HistogramReading.of(stats.commit_s),
            blocked_loops=triggerer.watchdog.blocked_count,
            groups=tuple(triggerer.shared_streams.stats()) if with_groups else None,
        )


@dataclass(frozen=True, slots=True)
class SchedulerReading:
    job_id: int | None
    runs_created: int
    tasks_scheduled: int
    runs_finished: int

    @classmethod
    def of(cls, scheduler: Scheduler) -> SchedulerReading:
        s = scheduler.stats
        return cls(scheduler.job_id, s.runs_created, s.tasks_scheduled, s.runs_finished)


@dataclass(frozen=True, slots=True)
class ExecutorReading:
    job_id: int | None
    slots_used: int
    slots_total: int
    claimed: int
    outcomes: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, executor: LocalExecutor) -> ExecutorReading:
        return cls(
            job_id=executor.job_id,
            slots_used=executor.running,
            slots_total=executor.settings.parallelism,
            claimed=executor.stats.claimed,
            outcomes=tuple(sorted(executor.stats.outcomes.items())),
        )


@dataclass(frozen=True, slots=True)
class EngineReading:
    triggerer: TriggererReading | None = None
    scheduler: SchedulerReading | None = None
    executor: ExecutorReading | None = None
    loop_responsive: bool = True


# --- the collector -------------------------------------------------------------------------


class EngineCollector(Collector):
    """Reads the registered parts at each scrape (on their event loop when one is given)."""

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self._loop = loop
        self._read_timeout_s = read_timeout_s
        self.triggerer: Triggerer | None = None
        self.scheduler: Scheduler | None = None
        self.executor: LocalExecutor | None = None

    def __repr__(self) -> str:
        parts = [
            name
            for name, part in (
                ("triggerer", self.triggerer),
                ("scheduler", self.scheduler),
                ("executor", self.executor),
            )
            if part is not None
        ]
        return f"<EngineCollector parts={parts} on_loop={self._loop is not None}>"

    def read(self, *, loop_responsive: bool = True, with_groups: bool = True) -> EngineReading:
        """Copy the counters now; call it on the loop thread (``collect`` does)."""
        t = self.triggerer
        return EngineReading(
            triggerer=TriggererReading.of(t, with_groups=with_groups) if t else None,
            scheduler=SchedulerReading.of(self.scheduler) if self.scheduler else None,
            executor=ExecutorReading.of(self.executor) if self.executor else None,
            loop_responsive=loop_responsive,
        )

    def collect(self) -> Iterator[Metric]:
        yield from families(self._read_for_scrape())

    def _read_for_scrape(self) -> EngineReading:
        loop = self._loop
        if loop is None or _running_loop() is loop:  # already on the loop thread
            return self.read()
        future: concurrent.futures.Future[EngineReading] = concurrent.futures.Future()

        def read_on_loop() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(self.read())
                except Exception as exc:  # noqa: BLE001 - re-raised in the scrape thread
                    future.set_exception(exc)

        try:
            loop.call_soon_threadsafe(read_on_loop)
            return future.result(timeout=self._read_timeout_s)
        except (TimeoutError, RuntimeError):  # blocked, or the loop closed meanwhile
            future.cancel()
            return self._read_from_this_thread()

    def _read_from_this_thread(self) -> EngineReading:
        """The loop is stuck: read the counters from here, without the shared-stream
        snapshots (``stats()`` walks state that only the loop thread may read)."""
        try:
            return self.read(loop_responsive=False, with_groups=False)
        except RuntimeError:  # a dict changed size under us: the loop came back meanwhile
            return EngineReading(loop_responsive=False)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# --- families: a reading as Prometheus metrics (pure) ---------------------------------------


def families(reading: EngineReading) -> list[Metric]:
    """The metric families of one reading, every name prefixed ``sluice_``."""
    out: list[Metric] = [
        GaugeMetricFamily("sluice_up", "1 while the engine process serves metrics.", value=1),
        _build_info(),
        GaugeMetricFamily(
            "sluice_event_loop_responsive",
            "1 when the event loop answered the scrape in time; 0 when it is blocked.",
            value=1 if reading.loop_responsive else 0,
        ),
        _job_info(reading),
    ]
    if reading.triggerer is not None:
        out += _triggerer_families(reading.triggerer)
        if reading.triggerer.groups is not None:
            out += _group_families(reading.triggerer.groups)
    if reading.scheduler is not None:
        out += _scheduler_families(reading.scheduler)
    if reading.executor is not None:
        out += _executor_families(reading.executor)
    return out


def _build_info() -> Metric:
    info = InfoMetricFamily("sluice_build", "Sluice and Python versions of this process.")
    info.add_metric([], {"version": _version(), "python": sys.version.split()[0]})
    return info


def _version() -> str:
    try:
        return dist_version("sluice")
    except PackageNotFoundError:
        return "unknown"


def _job_info(reading: EngineReading) -> Metric:
    info = InfoMetricFamily(
        "sluice_job", "The job row of each part in this process.", labels=["part"]
    )
    for part, job_id in (
        ("triggerer", reading.triggerer.job_id if reading.triggerer else None),
        ("scheduler", reading.scheduler.job_id if reading.scheduler else None),
        ("executor", reading.executor.job_id if reading.executor else None),
    ):
        if job_id is not None:
            info.add_metric([part], {"job_id": str(job_id)})
    return info


def _gauge(name: str, doc: str, value: float) -> Metric:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> Metric:
    return CounterMetricFamily(name, doc, value=value)


def _histogram(name: str, doc: str, reading: HistogramReading) -> Metric:
    family = HistogramMetricFamily(name, doc)
    family.add_metric([], reading.cumulative(), reading.total)
    return family


def _triggerer_families(t: TriggererReading) -> list[Metric]:
    return [
        _gauge("sluice_triggers_running", "Triggers running in this triggerer.", t.running),
        _gauge("sluice_triggerer_capacity", "Triggers this triggerer may run.", t.capacity),
        _gauge(
            "sluice_triggerer_capacity_left",
            "Triggers this triggerer may still claim.",
            max(t.capacity - t.running, 0),
        ),
        _counter("sluice_events_fired", "Trigger events put in the outbox.", t.events_fired),
        _counter(
            "sluice_trigger_failures",
            "Failures of running triggers (raised, bad yield, exited) reported by the runner.",
            t.failures_reported,
        ),
        _gauge("sluice_outbox_pending", "Trigger outcomes waiting to be stored.", t.outbox_pending),
        _counter(
            "sluice_events_persisted",
            "Trigger events committed to the metadata database.",
            t.events_persisted,
        ),
        _counter(
            "sluice_events_refused",
            "Trigger events not stored: payload over [core] max_asset_event_payload_bytes.",
            t.events_refused,
        ),
        _counter(
            "sluice_asset_events_created",
            "Asset events inserted (after deduplication).",
            t.asset_events_created,
        ),
        _counter(
            "sluice_deferred_tasks_resumed",
            "Deferred task instances resumed by a trigger event.",
            t.tasks_resumed,
        ),
        _counter(
            "sluice_trigger_failures_persisted",
            "Trigger failures (load failures included) recorded in the database.",
            t.failures_persisted,
        ),
        _counter(
            "sluice_persister_dropped",
            "Outbox items that could not be stored (the bad item of a failing batch).",
            t.persist_dropped,
        ),
        _histogram(
            "sluice_persister_batch_size", "Outbox items per committed batch.", t.batch_size
        ),
        _histogram(
            "sluice_persister_commit_seconds",
            "Time to write and commit one batch.",
            t.commit_s,
        ),
        _counter(
            "sluice_event_loop_blocked",
            "Stretches during which the event loop was blocked past the threshold.",
            t.blocked_loops,
        ),
    ]


_GROUP_GAUGES: Final = (
    ("subscribers", "sluice_shared_stream_subscribers", "Subscribers of the group."),
    (
        "queue_high_water",
        "sluice_shared_stream_queue_high_water",
        "Most unread events any subscriber queue of the group held.",
    ),
    (
        "queue_depth",
        "sluice_shared_stream_queue_depth",
        "Unread events in the group's deepest subscriber queue now.",
    ),
    (
        "outstanding_events",
        "sluice_shared_stream_outstanding_events",
        "Ack mode: events of every lane not advanced yet.",
    ),
    (
        "last_advance_batch",
        "sluice_shared_stream_last_advance_batch",
        "Events in the group's last broker advance.",
    ),
)
_GROUP_COUNTERS: Final = (
    ("events_polled", "sluice_shared_stream_events_polled", "Raw events the shared poll read."),
    ("deliveries", "sluice_shared_stream_deliveries", "Raw events delivered to subscribers."),
    (
        "advanced_events",
        "sluice_shared_stream_advanced_events",
        "Events handed to the producer's advance (commit / delete / ack).",
    ),
    ("overflows", "sluice_shared_stream_overflows", "Subscribers failed by a full queue."),
    ("ack_timeouts", "sluice_shared_stream_ack_timeouts", "Subscribers failed by AckTimeout."),
    ("rejects", "sluice_shared_stream_rejects", "Events rejected by a subscriber."),
)


def _group_families(groups: Sequence[GroupStats]) -> list[Metric]:
    """One series per key (``SharedStreamManager.stats()`` merged the groups of a key), its
    label cut as the database column is; per-lane backlog for the busiest lanes only."""
    labels = ["key", "mode"]
    count = GaugeMetricFamily(
        "sluice_shared_stream_groups",
        "Keys with a live shared-stream group (one draining next to its replacement: one key).",
    )
    count.add_metric([], len(groups))
    gauges = {f: GaugeMetricFamily(n, d, labels=labels) for f, n, d in _GROUP_GAUGES}
    counters = {f: CounterMetricFamily(n, d, labels=labels) for f, n, d in _GROUP_COUNTERS}
    outstanding = GaugeMetricFamily(
        "sluice_shared_stream_outstanding",
        f"Ack mode: events of the lane not advanced yet ({REPORTED_LANES} busiest lanes).",
        labels=[*labels, "lane"],
    )
    lanes = GaugeMetricFamily(
        "sluice_shared_stream_outstanding_lanes",
        "Ack mode: lanes with events not advanced yet.",
        labels=labels,
    )
    oldest = GaugeMetricFamily(
        "sluice_shared_stream_oldest_unresolved_age_seconds",
        "Ack mode: age of the oldest event not yet resolved by every subscriber.",
        labels=labels,
    )
    latency = SummaryMetricFamily(
        "sluice_shared_stream_advance_latency_seconds",
        "Broker advance calls (count) and the time they took (sum).",
        labels=labels,
    )
    batch = SummaryMetricFamily(
        "sluice_shared_stream_advance_batch_size",
        "Broker advance calls (count) and the events they covered (sum).",
        labels=labels,
    )
    for g in groups:
        values = [stream_key_column(g.key), g.mode]
        for field_name, gauge in gauges.items():
            gauge.add_metric(values, getattr(g, field_name))
        for field_name, counter in counters.items():
            counter.add_metric(values, getattr(g, field_name))
        for lane, pending in busiest_lanes(g.outstanding_by_lane):
            outstanding.add_metric([*values, lane], pending)
        lanes.add_metric(values, len(g.outstanding_by_lane))
        if g.oldest_unresolved_age_s is not None:
            oldest.add_metric(values, g.oldest_unresolved_age_s)
        latency.add_metric(values, count_value=g.advances, sum_value=g.advance_latency_sum_s)
        batch.add_metric(values, count_value=g.advances, sum_value=g.advanced_events)
    per_key = [*gauges.values(), *counters.values(), outstanding, lanes, oldest, latency, batch]
    return [count, *per_key]


def _scheduler_families(s: SchedulerReading) -> list[Metric]:
    runs = CounterMetricFamily(
        "sluice_dag_runs_created", "DAG runs created by the scheduler.", labels=["run_type"]
    )
    runs.add_metric([ASSET_TRIGGERED], s.runs_created)
    return [
        runs,
        _counter(
            "sluice_dag_runs_finished", "DAG runs that reached an end state.", s.runs_finished
        ),
        _counter("sluice_tasks_scheduled", "Task instances made ready to run.", s.tasks_scheduled),
    ]


def _executor_families(e: ExecutorReading) -> list[Metric]:
    outcomes = CounterMetricFamily(
        "sluice_task_outcomes",
        "Task steps finished by the executor, by outcome.",
        labels=["outcome"],
    )
    for outcome, count in e.outcomes:
        outcomes.add_metric([outcome], count)
    return [
        _gauge("sluice_task_slots_used", "Executor slots running a task.", e.slots_used),
        _gauge("sluice_task_slots_total", "Executor slots ([core] parallelism).", e.slots_total),
        _counter("sluice_task_instances_claimed", "Task instances claimed to run.", e.claimed),
        outcomes,
    ]


# --- the HTTP server ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running endpoint; ``close()`` stops it."""

    server: WSGIServer
    thread: threading.Thread
    registry: CollectorRegistry

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        """Stop serving (blocks up to the server's poll interval, 0.5 s)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(SERVER_STOP_TIMEOUT_S)


def start_metrics_server(config: MetricsConfig, collector: EngineCollector) -> MetricsServer:
    """Serve ``collector`` on ``[metrics] host``:``port`` (port 0: an ephemeral port).

    Raises ``ConfigError`` naming the address when it cannot be bound (e.g. in use).
    """
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        server, thread = start_http_server(config.port, config.host, registry)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {config.host}:{config.port} ([metrics] host/port): "
            f"{exc.strerror or exc}; choose a free port ([metrics] port, "
            "SLUICE__METRICS__PORT; 0 picks one) or set [metrics] enabled = false"
        ) from exc
    running = MetricsServer(server, thread, registry)
    logger.info(
        "Serving Prometheus metrics on http://%s:%d/metrics",
        running.host,
        running.port,
        extra={"action": "metrics_listening", "host": running.host, "port": running.port},
    )
    return running
