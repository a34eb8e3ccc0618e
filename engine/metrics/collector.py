"""The Prometheus endpoint: the collector that reads the parts at scrape time, its server.

At each scrape ``EngineCollector`` takes an ``EngineReading`` (the parts' answers to
``metrics_reading()``, with ``SharedStreamManager.stats()``) on the event loop thread, where
the parts mutate their state, and turns it into metric families in the HTTP server's thread
(``engine.metrics.families``, pure). It lives in a per-process ``CollectorRegistry`` (not
the global default, so tests can build several engines in one process).

When the loop does not answer within ``READ_TIMEOUT_S`` (a trigger blocks it: exactly when
an operator looks at the metrics), the reading is taken from the scrape thread instead, and
``sluice_event_loop_responsive`` says 0. Everything read there is a plain attribute read,
except the shared-stream snapshots, which are left out if the loop changed them under us.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector

from engine.exceptions import ConfigError
from engine.metrics.families import families
from engine.metrics.readings import EngineReading

if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.core import (
        Metric,
    )

    from engine.config import MetricsConfig
    from engine.metrics.readings import ReportsExecutor, ReportsScheduler, ReportsTriggerer


logger = logging.getLogger(__name__)


READ_TIMEOUT_S: Final = 2.0


SERVER_STOP_TIMEOUT_S: Final = 5.0


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
        self.triggerer: ReportsTriggerer | None = None
        self.scheduler: ReportsScheduler | None = None
        self.executor: ReportsExecutor | None = None

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
        t, s, e = self.triggerer, self.scheduler, self.executor
        return EngineReading(
            triggerer=t.metrics_reading(with_groups=with_groups) if t else None,
            scheduler=s.metrics_reading() if s else None,
            executor=e.metrics_reading() if e else None,
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
