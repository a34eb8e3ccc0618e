"""The kit's in-process engine: the real triggerer and persister on a SQLite copy, in the
test's event loop, watching one case's DAG file.

The DAG file is parsed as the DAG processor parses it (``tests.integration.harness``), so
the watchers' trigger rows are what ``sluice run`` would store; the triggerer claims them,
runs one consumer per shared-stream key, and stores the asset events. No scheduler nor
executor: the kit is about events reaching the database and the broker being advanced.
Every batch the persister commits is kept (``batches``: what was fired and what was new),
and every WARNING and above of the triggerer's runtime (``records``).
"""

from __future__ import annotations

import logging
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
from cryptography.fernet import Fernet

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.triggerer.runtime import DEFAULT_RESTART_BACKOFF_S
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from tests.conformance.world import Stored, dag_file
from tests.db_templates import copy_sqlite_template
from tests.integration.harness import parse_in_process

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping
    from pathlib import Path

    from engine.triggerer.persister import BatchResult
    from tests.conformance.broker import KitBroker

RUNTIME_LOGGER = "engine.triggerer.runtime"


class _Keep(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


@dataclass
class KitEngine:
    db: Database
    triggerer: Triggerer
    kit: KitBroker
    batches: list[BatchResult] = field(default_factory=list)
    records: list[logging.LogRecord] = field(default_factory=list)

    def stored(self) -> Stored:
        return Stored.read(self.db, self.kit)

    @property
    def absorbed(self) -> int:
        """Trigger events the persister found already stored (a redelivery's)."""
        return sum(b.fired - b.asset_events - b.refused for b in self.batches)

    def groups(self) -> int:
        return len(self.triggerer.shared_streams.stats())

    def failures(self, *, unavailable: bool) -> list[logging.LogRecord]:
        return [
            r
            for r in self.records
            if getattr(r, "action", None) == "trigger_failed"
            and bool(getattr(r, "unavailable", False)) == unavailable
            and r.levelno >= logging.WARNING
        ]


@asynccontextmanager
async def kit_engine(
    kit: KitBroker,
    tmp: Path,
    template: Path,
    imports: str,
    watchers: Mapping[str, str],
    *,
    ack_timeout_s: float = 30.0,
    restart_backoff_s: tuple[float, float] = DEFAULT_RESTART_BACKOFF_S,
) -> AsyncIterator[KitEngine]:
    """The triggerer running ``watchers`` (label -> source) until the block ends."""
    dags = tmp / "dags"
    dags.mkdir()
    (dags / "kit.py").write_text(dag_file(f"kit_{uuid.uuid4().hex[:8]}", imports, watchers))
    db = Database(copy_sqlite_template(template, tmp / "sluice.db"))
    cipher = KwargsCipher(Fernet.generate_key().decode())
    report = parse_in_process(db, cipher, dags)
    assert not report.errors, report.errors
    batches: list[BatchResult] = []
    triggerer = Triggerer(
        db=db,
        cipher=cipher,
        settings=_settings(ack_timeout_s, restart_backoff_s),
        on_committed=batches.append,
    )
    engine = KitEngine(db, triggerer, kit, batches)
    handler = _Keep(engine.records)
    logging.getLogger(RUNTIME_LOGGER).addHandler(handler)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(engine.triggerer.run)
            try:
                yield engine
            finally:
                engine.triggerer.shutdown()
    finally:
        logging.getLogger(RUNTIME_LOGGER).removeHandler(handler)
        db.dispose()


def _settings(ack_timeout_s: float, restart_backoff_s: tuple[float, float]) -> TriggererSettings:
    return TriggererSettings(
        capacity=100,
        heartbeat_s=0.5,
        # no takeover here: a lease long enough that lane_order's lock of the database
        # (which stops heartbeats too) does not fence the triggerer
        health_check_threshold_s=30.0,
        claim_idle_interval_s=0.1,
        new_trigger_poll_s=0.05,
        shutdown_grace_s=5,
        ack_timeout_s=ack_timeout_s,
        restart_backoff_s=restart_backoff_s,
    )
