"""Metrics: the parts count, the Prometheus endpoint reads them at scrape time.

A leaf of the house: the parts import ``engine.metrics.readings`` to report (their counters,
``Buckets``, their ``metrics_reading()``); this package imports no part of the engine, only
the configuration and ``shared_stream``'s statistics types. A fan-out path that delivers
more than 100,000 events a second must not pay for a Prometheus call per event, hence plain
counters read at scrape time rather than Prometheus metrics updated as work happens.
"""

from __future__ import annotations

from engine.metrics.collector import (
    READ_TIMEOUT_S,
    EngineCollector,
    MetricsServer,
    start_metrics_server,
)
from engine.metrics.families import families
from engine.metrics.readings import (
    Buckets,
    EngineReading,
    ExecutorReading,
    HistogramReading,
    SchedulerReading,
    TriggererReading,
)

__all__ = (
    "READ_TIMEOUT_S",
    "Buckets",
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
