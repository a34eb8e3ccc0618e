"""``JobService``: a part's job row is registered, kept alive while the part runs, and ended
on the way out whether the part returned or was cancelled; a failed last write is logged."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from engine.db.database import Database
from engine.db.models import Job
from engine.exceptions import DatabaseUnavailable
from engine.jobs.service import JobService
from engine.states import JobState
from tests.waiting import eventually

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def db(migrated_sqlite_url: str) -> Iterator[Database]:
    database = Database(migrated_sqlite_url)
    yield database
    database.dispose()


def _job(db: Database, job_id: int) -> Job:
    job = db.call(lambda session: session.get(Job, job_id))
    assert job is not None
    return job


def _service(db: Database) -> JobService:
    return JobService(db, job_type="scheduler", part="Scheduler", heartbeat_s=0.02, capacity=3)


@pytest.mark.parametrize("ending", ["returns", "cancelled"])
async def test_the_job_runs_and_beats_while_the_body_runs_and_ends_after(
    db: Database, ending: str
) -> None:
    service = _service(db)
    with anyio.fail_after(10), anyio.CancelScope() as scope:
        async with service.running() as job_id:
            started = _job(db, job_id)
            assert (started.job_type, started.capacity) == ("scheduler", 3)
            assert started.state == JobState.RUNNING

            async def beaten() -> bool:
                return _job(db, job_id).latest_heartbeat > started.latest_heartbeat

            await eventually(beaten)
            if ending == "cancelled":
                scope.cancel()
                await anyio.sleep_forever()
    ended = _job(db, job_id)
    assert ended.state == JobState.SUCCESS and ended.end_date is not None


async def test_ending_writes_what_the_job_releases_in_the_same_transaction(db: Database) -> None:
    service = _service(db)
    job_id = await service.start()

    def release(session: Any, released_by: int) -> str:
        assert session.get(Job, released_by).state == JobState.RUNNING
        return f"released by {released_by}"

    assert await service.end(release) == f"released by {job_id}"
    assert _job(db, job_id).state == JobState.SUCCESS


async def test_a_failed_last_write_is_logged_not_raised(
    db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    service = _service(db)
    job_id = await service.start()

    async def unavailable(fn: Any) -> Any:
        raise DatabaseUnavailable("the database is gone")

    monkeypatch.setattr(db, "run", unavailable)
    with caplog.at_level(logging.WARNING, logger="engine.jobs.service"):
        assert await service.end() is None
    (record,) = [r for r in caplog.records if getattr(r, "action", None) == "job_end_failed"]
    assert record.job_id == job_id
    assert "could not mark its job" in record.getMessage()


async def test_a_job_never_started_has_nothing_to_end(db: Database) -> None:
    assert await _service(db).end() is None
