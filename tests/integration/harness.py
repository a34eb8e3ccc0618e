"""What the integration tests that run real parts in-process share: a migrated database
(copied from the session's template, ``tests/db_templates.py``) with a dags folder parsed as
the real DAG processor parses it, and executor settings fast enough for tests."""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
from cryptography.fernet import Fernet
from sqlalchemy import insert

from engine.config import Config, load_config
from engine.crypto import KwargsCipher
from engine.dag_processing.parsing import FileParseResult, parse_file
from engine.dag_processing.processor import DagProcessor, DagProcessorSettings, list_dag_files
from engine.dag_processing.sync import SyncReport, sync_parse_results
from engine.db import models
from engine.db.database import Database
from engine.executor.local import LocalExecutor
from engine.executor.settings import ExecutorSettings

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from sqlalchemy.orm import Session


class Parsed(NamedTuple):
    db: Database
    config: Config
    cipher: KwargsCipher
    processor: DagProcessor


def parsed_database(db_url: str, tmp_path: Path, dags: Path) -> Parsed:
    """The database at ``db_url`` (at head: the ``migrated_db_url`` fixture) holding what one
    pass of the DAG processor stores for ``dags`` (which must parse without errors), with
    the config, cipher and a processor for later passes (``processor.parse_once()`` parses
    in child processes, as the engine does)."""
    db = Database(db_url)
    config = load_config(
        environ={
            "SLUICE_HOME": str(tmp_path / "home"),
            "SLUICE__CORE__DAGS_FOLDER": str(dags),
            "SLUICE__CORE__SQL_ALCHEMY_CONN": db_url,  # the CLI, run with it, reads this one
        }
    )
    cipher = KwargsCipher(Fernet.generate_key().decode())
    processor = DagProcessor(
        db=db, cipher=cipher, settings=DagProcessorSettings.from_config(config)
    )
    report = parse_in_process(db, cipher, dags)
    assert not report.errors, report
    return Parsed(db, config, cipher, processor)


def parse_in_process(db: Database, cipher: KwargsCipher, dags: Path) -> SyncReport:
    """One DAG processor pass over ``dags`` with each file imported in this process by the
    child's own ``parse_file`` (its result through the same JSON the child prints), synced
    by the processor's own ``sync_parse_results``: what a pass stores, without a process
    per file. The DAG processor's children are tested as such in ``test_dag_processor.py``
    and the e2e tests. Modules the files imported from ``dags`` are forgotten afterwards, so
    that another test's file of the same name is imported afresh."""
    files = list_dag_files(dags) or []
    path, modules = sys.path[:], set(sys.modules)
    sys.path.append(str(dags))
    try:
        results = {str(f): FileParseResult.from_json(parse_file(f).to_json()) for f in files}
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(dags)):
                del sys.modules[name]
    present = {str(f) for f in files}
    now = datetime.now(UTC)
    return db.call(lambda s: sync_parse_results(s, cipher, results, present, now=now))


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
    db: Database, cipher: KwargsCipher, settings: ExecutorSettings, *, watch_commits: bool = True
) -> AsyncIterator[LocalExecutor]:
    """A real ``LocalExecutor`` running in this event loop until the block ends (then it
    shuts down as ``sluice run`` stops it). ``watch_commits=False``: on SQLite, as under
    ``sluice run``, other connections' commits do not wake it (its poll does)."""
    executor = LocalExecutor(db=db, cipher=cipher, settings=settings, watch_commits=watch_commits)
    async with anyio.create_task_group() as tg:
        await tg.start(executor.run)
        try:
            yield executor
        finally:
            executor.shutdown()


def silent_executor_job(session: Session, *, silent_for_s: float = 60.0) -> int:
    """A running executor job row whose last heartbeat was ``silent_for_s`` ago: the job of
    an executor that died (or lost the database) holding what the test gives it."""
    silent_since = models.utcnow() - timedelta(seconds=silent_for_s)
    return int(
        session.execute(
            insert(models.Job)
            .values(
                job_type="executor",
                state="running",
                latest_heartbeat=silent_since,
                start_date=silent_since,
            )
            .returning(models.Job.id)
        ).scalar_one()
    )
