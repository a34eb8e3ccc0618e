"""A callback request that cannot start its process, or fails unexpectedly, never takes the
executor down: it is logged, stays claimed and is tried again (``CallbackRunner``)."""

from __future__ import annotations

import errno
import logging
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.models import CallbackRequest
from engine.db.queries import callbacks as callbacks_sql
from engine.db.queries import jobs
from engine.db.queries.tasks import EXECUTOR_JOB
from engine.execution.protocol import CallbackSpec, TaskSpec
from engine.executor import callbacks as callbacks_module
from engine.executor.callbacks import CallbackRunner
from engine.executor.settings import ExecutorSettings
from tests.waiting import eventually

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def db(migrated_sqlite_url: str) -> Iterator[Database]:
    database = Database(migrated_sqlite_url)
    yield database
    database.dispose()


def _request_a_task_callback(db: Database, tmp_path: Path) -> None:
    task_spec = TaskSpec(
        ti_id=1,
        dag_id="d",
        run_id="r",
        task_id="t",
        fileloc=str(tmp_path / "d.py"),
        try_number=1,
        try_started_at=datetime.now(UTC).isoformat(),
        context="{}",
    )
    spec = CallbackSpec(
        kind="task", callback="on_failure_callback", spec=task_spec.to_json(), error="killed"
    )
    db.call(
        lambda s: callbacks_sql.request_task_callback(
            s, dag_id="d", run_id="r", data={"callback_spec": asdict(spec)}, now=models.utcnow()
        )
    )


async def test_a_spawn_failure_or_an_unexpected_error_is_logged_and_the_request_retried(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _request_a_task_callback(db, tmp_path)
    job_id = db.call(lambda s: jobs.start_job(s, job_type=EXECUTOR_JOB, capacity=1))
    attempts: list[int] = []

    async def open_process(command: list[str], **kwargs: Any) -> Any:
        attempts.append(int(command[command.index("--request-id") + 1]))
        if len(attempts) == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        raise RuntimeError("something unexpected")

    monkeypatch.setattr(callbacks_module.anyio, "open_process", open_process)
    settings = ExecutorSettings(
        parallelism=1,
        dags_folder=tmp_path,
        plugins_folder=None,
        task_log_folder=tmp_path / "logs",
        poll_interval_s=0.01,
    )
    runner = CallbackRunner(
        db=db,
        cipher=KwargsCipher(Fernet.generate_key().decode()),
        settings=settings,
        environment={},
        retry_delay_s=0.05,
    )
    caplog.set_level(logging.INFO, logger="engine.executor.callbacks")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run, job_id)  # an escaping error would fail the test here

            async def retried() -> bool:
                return len(attempts) >= 3

            await eventually(retried, within=20)
            tg.cancel_scope.cancel()
    assert len(set(attempts)) == 1 and runner.ran == 0
    held = db.call(lambda s: s.execute(select(CallbackRequest.executor_job_id)).scalars().all())
    assert held == [job_id]  # still there, claimed by this executor: tried again later
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert "callback_spawn_failed" in actions and "callback_failed" in actions
    spawn_failed = next(
        r for r in caplog.records if getattr(r, "action", "") == "callback_spawn_failed"
    )
    assert "Too many open files" in spawn_failed.getMessage()
