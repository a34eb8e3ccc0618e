"""A reading as Prometheus metric families (pure): every name prefixed ``sluice_``."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import TYPE_CHECKING, Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from shared_stream.stats import REPORTED_LANES, busiest_lanes, key_label

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.metrics.readings import (
        EngineReading,
        ExecutorReading,
        HistogramReading,
        SchedulerReading,
        TriggererReading,
    )
    from shared_stream.stats import GroupStats


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
    (
        "dead_lettered",
        "sluice_shared_stream_dead_lettered",
        "Events advanced with a rejected outcome: sent the producer's dead-letter way.",
    ),
)


def _group_families(groups: Sequence[GroupStats]) -> list[Metric]:
    """One series per key (``SharedStreamManager.stats()`` merged the groups of a key), its
    label cut as the database column is, with the broker it reads (``broker``: "kafka",
    "sqs", ... or the trigger class's name, so a dashboard sums per broker kind); per-lane
    backlog for the busiest lanes only."""
    labels = ["key", "mode", "broker"]
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
        values = [key_label(g.key), g.mode, g.broker]
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
    for run_type, count in s.runs_created:
        runs.add_metric([run_type], count)
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
        *_queue_families(e),
        _gauge("sluice_task_slots_used", "Executor slots running a task.", e.slots_used),
        _gauge("sluice_task_slots_total", "Executor slots ([core] parallelism).", e.slots_total),
        _counter("sluice_task_instances_claimed", "Task instances claimed to run.", e.claimed),
        outcomes,
    ]


def _queue_families(e: ExecutorReading) -> list[Metric]:
    """Per Celery queue: tries queued and running, messages sent (a rate with ``rate()``)."""
    if not e.queues:
        return []
    tries = GaugeMetricFamily(
        "sluice_celery_queue_tries",
        "Task tries of a Celery queue, by state (queued: sent, no worker started it yet).",
        labels=["queue", "state"],
    )
    sent = CounterMetricFamily(
        "sluice_celery_sent", "Messages published to a Celery queue.", labels=["queue"]
    )
    for q in e.queues:
        tries.add_metric([q.queue, "queued"], q.queued)
        tries.add_metric([q.queue, "running"], q.running)
        sent.add_metric([q.queue], q.sent)
    return [tries, sent]
