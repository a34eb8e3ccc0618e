"""A running triggerer claims rows written by another process without waiting for its poll.

The triggerer runs with a poll interval and a full-round interval of an hour: only the
new-rows signal (PostgreSQL LISTEN/NOTIFY, inotify on a SQLite database's directory) can
make it claim rows that another process (another ``Database``, another connection pool)
commits. Each test waits on the condition (every row running), bounded far below the poll
interval.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import insert, select, update

from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.models import Dag, DagRun, TaskInstance, Trigger
from engine.states import TaskState, TriggerKind
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from tests.waiting import eventually, wait_until
from triggers import TimeDeltaTrigger

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]

HOUR_S = 3600.0


@pytest.fixture
def key() -> str:
    return Fernet.generate_key().decode()


@pytest.fixture
def db(migrated_db_url: str) -> Iterator[Database]:
    database = Database(migrated_db_url)
    yield database
    database.dispose()


def _settings(**overrides: Any) -> TriggererSettings:
    values: dict[str, Any] = {
        "capacity": 1000,
        "heartbeat_s": 0.5,
        "health_check_threshold_s": 30,
        "claim_idle_interval_s": HOUR_S,
        "new_trigger_poll_s": HOUR_S,
        "cleanup_interval_s": HOUR_S,
        "shutdown_grace_s": 5,
    }
    return TriggererSettings(**{**values, **overrides})


def _defer(url: str, key: str, n: int, *, commits: int = 1) -> list[int]:
    """N deferred tasks on one-day TimeDeltaTriggers, committed in ``commits`` transactions
    through a Database (and connection pool) of their own: as another process would."""
    cipher = KwargsCipher(key)
    classpath, kwargs = TimeDeltaTrigger(timedelta(days=1)).serialize()
    token = cipher.encrypt_kwargs(kwargs, owner=classpath)
    other = Database(url)
    ids: list[int] = []
    try:
        run_id = other.call(_make_run)
        for c in range(commits):
            size = n // commits + (1 if c < n % commits else 0)
            ids += other.call(lambda s, size=size: _insert(s, run_id, token, classpath, size))
    finally:
        other.dispose()
    return ids


def _make_run(session: Any) -> int:
    if session.get(Dag, "wake") is None:
        session.execute(insert(Dag).values(dag_id="wake", fileloc="wake.py"))
    return int(
        session.execute(
            insert(DagRun)
            .values(dag_id="wake", run_id=f"r{models.utcnow().timestamp()}", run_type="manual")
            .returning(DagRun.id)
        ).scalar_one()
    )


def _insert(session: Any, run_id: int, token: str, classpath: str, n: int) -> list[int]:
    now = models.utcnow()
    rows = [
        {"classpath": classpath, "kwargs": token, "kind": TriggerKind.TASK, "created_date": now}
        for _ in range(n)
    ]
    ids = [int(i) for i in session.execute(insert(Trigger).returning(Trigger.id), rows).scalars()]
    session.execute(
        insert(TaskInstance),
        [
            {
                "dag_run_id": run_id,
                "dag_id": "wake",
                "task_id": f"t{tid}",
                "state": TaskState.DEFERRED,
                "trigger_id": tid,
                "next_method": "resume",
            }
            for tid in ids
        ],
    )
    return ids


@pytest.mark.parametrize("commits", [1, 3])
async def test_a_burst_of_rows_from_another_process_is_claimed_without_a_poll(
    db: Database, key: str, commits: int
) -> None:
    triggerer = Triggerer(db=db, cipher=KwargsCipher(key), settings=_settings())
    assert triggerer.new_rows.source in {"postgresql", "sqlite-wal"}
    with anyio.fail_after(60):  # a poll would take an hour
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)  # its first round found nothing: it waits
            assert len(triggerer.runner) == 0
            ids = await anyio.to_thread.run_sync(lambda: _defer(db.url, key, 600, commits=commits))
            await wait_until(lambda: triggerer.runner.running_ids() >= set(ids), within=30)
            triggerer.shutdown()


async def test_rows_released_by_another_triggerer_are_claimed_without_a_poll(
    db: Database, key: str
) -> None:
    triggerer = Triggerer(db=db, cipher=KwargsCipher(key), settings=_settings())
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            ids = await anyio.to_thread.run_sync(lambda: _defer(db.url, key, 50))
            await wait_until(lambda: triggerer.runner.running_ids() >= set(ids), within=30)
            # Another process unassigns some of them (as a triggerer handing rows back does):
            # they stop here at the next full round, an hour away; what matters is that
            # unassigned rows wake the claim loop, which takes them back at once.
            released = ids[:10]

            def release(session: Any) -> None:
                session.execute(
                    update(Trigger)
                    .where(Trigger.id.in_(released))
                    .values(triggerer_id=None, claimed_at=None)
                )

            other = Database(db.url)
            try:
                await anyio.to_thread.run_sync(lambda: other.call(release))
            finally:
                other.dispose()

            def reclaimed(session: Any) -> bool:
                owners = session.execute(
                    select(Trigger.triggerer_id).where(Trigger.id.in_(released))
                ).scalars()
                return all(owner == triggerer.job_id for owner in owners)

            await eventually(lambda: db.read(reclaimed), within=30)
            triggerer.shutdown()


def test_an_in_memory_database_has_no_signal_and_relies_on_the_poll(key: str) -> None:
    memory = Database("sqlite://")
    try:
        triggerer = Triggerer(db=memory, cipher=KwargsCipher(key), settings=_settings())
        assert triggerer.new_rows.source is None
    finally:
        memory.dispose()
