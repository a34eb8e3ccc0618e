"""What the integration tests that run real parts in-process share: a migrated database
(copied from the session's template, ``tests/db_templates.py``) with a dags folder parsed by
the real DAG processor, and executor settings fast enough for tests."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
from cryptography.fernet import Fernet

from engine.config import Config, load_config
from engine.crypto import KwargsCipher
from engine.dag_processing.processor import DagProcessor, DagProcessorSettings
from engine.db.database import Database
from engine.db.schema import migrate
from engine.executor.local import ExecutorSettings, LocalExecutor

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path


class Parsed(NamedTuple):
    db: Database
    config: Config
    cipher: KwargsCipher
    processor: DagProcessor


def parsed_database(db_url: str, tmp_path: Path, dags: Path) -> Parsed:
    """The database at ``db_url`` (best a copy of the session's migrated template, the
    ``migrated_db_url`` fixture; an empty one is migrated here, a migrated one is left as it
    is), holding what the real DAG processor parsed from ``dags`` (which must parse without
    errors), with the config, cipher and processor used."""
    db = Database(db_url)
    migrate(db.engine)
    config = load_config(
        environ={"SLUICE_HOME": str(tmp_path / "home"), "SLUICE__CORE__DAGS_FOLDER": str(dags)}
    )
    cipher = KwargsCipher(Fernet.generate_key().decode())
    processor = DagProcessor(
        db=db, cipher=cipher, settings=DagProcessorSettings.from_config(config)
    )
    report = anyio.run(processor.parse_once)
    assert report is not None and not report.errors, report
    return Parsed(db, config, cipher, processor)


def fast_executor_settings(config: Config, **overrides: Any) -> ExecutorSettings:
    """The executor's settings with short heartbeats, polls and grace periods."""
    return replace(
        ExecutorSettings.from_config(config),
        **{
            "parallelism": 4,
            "heartbeat_s": 0.2,
            "poll_interval_s": 0.02,
            "shutdown_grace_s": 5,
            "kill_grace_s": 0.5,
            **overrides,
        },
    )


@asynccontextmanager
async def running_executor(
    db: Database, cipher: KwargsCipher, settings: ExecutorSettings
) -> AsyncIterator[LocalExecutor]:
    """A real ``LocalExecutor`` running in this event loop until the block ends (then it
    shuts down as ``sluice run`` stops it)."""
    executor = LocalExecutor(db=db, cipher=cipher, settings=settings)
    async with anyio.create_task_group() as tg:
        await tg.start(executor.run)
        try:
            yield executor
        finally:
            executor.shutdown()
