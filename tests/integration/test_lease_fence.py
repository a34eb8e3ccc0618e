"""Fencing a triggerer whose rows were taken over: its job id is the epoch of what it owned.

- The claim that takes a dead triggerer's rows ends its job row (``failed``) in the same
  transaction.
- The persister's store is guarded by the owner's job row, in the same statement (PostgreSQL)
  or transaction (SQLite): a taken-over owner stores nothing and is told (``LeaseLost``),
  its events stay unconfirmed (the broker redelivers them to the new owner).
- A triggerer whose heartbeat finds its job row ended fences its shared streams (no advance
  after that) and starts again under a new job row, taking nothing the new owner holds.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import insert, select, update

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, AssetWatcher, Job, Trigger, utcnow
from engine.db.queries import jobs
from engine.db.queries import triggers as trigger_rows
from engine.exceptions import DatabaseUnavailable, LeaseLost
from engine.loader import trigger_stream_digest
from engine.states import JobState, TriggerKind
from engine.triggerer import claiming
from engine.triggerer.outbox import FiredEvent, Outbox
from engine.triggerer.persister import Persister
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from tests.waiting import wait_until
from triggers.base import TriggerEvent
from triggers.file import DirectoryFileDeleteTrigger

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]


@pytest.fixture
def db(migrated_db_url: str) -> Iterator[Database]:
    database = Database(migrated_db_url)
    yield database
    database.dispose()


def _job(db: Database) -> int:
    return int(db.call(lambda s: jobs.start_job(s, job_type=jobs.TRIGGERER_JOB, capacity=10)))


def _state(db: Database, job_id: int) -> str:
    return str(db.call(lambda s: s.execute(select(Job.state).where(Job.id == job_id)).scalar_one()))


def _asset(db: Database) -> int:
    return int(
        db.call(
            lambda s: s.execute(
                insert(Asset).values(name="a", uri="test://a", extra={}).returning(Asset.id)
            ).scalar_one()
        )
    )


def _event_count(db: Database) -> int:
    return len(db.call(lambda s: list(s.execute(select(AssetEvent.id)).scalars())))


def _fired(asset_id: int, n: int) -> FiredEvent:
    return FiredEvent(
        trigger_id=1,
        event=TriggerEvent({"n": n}, dedup_key=f"test:{n}"),
        seq=n,
        fired_at=time.monotonic(),
        watcher=(asset_id, "w"),
    )


async def _drain(persister: Persister, outbox: Outbox) -> None:
    outbox.close()
    with anyio.fail_after(10):
        await persister.run()


async def test_a_revoked_owner_stores_nothing_and_confirms_nothing(db: Database) -> None:
    asset_id = _asset(db)
    owner = _job(db)
    confirmed: list[int] = []
    lost: list[str] = []

    def persister(outbox: Outbox) -> Persister:
        return Persister(
            db=db, outbox=outbox, confirm=confirmed.extend, owner=owner, on_lease_lost=lost.append
        )

    outbox = Outbox()
    outbox.put_nowait(_fired(asset_id, 1))
    await _drain(persister(outbox), outbox)
    assert (_event_count(db), confirmed, lost) == (1, [1], [])

    db.call(lambda s: jobs.revoke_jobs(s, [owner]))
    assert _state(db, owner) == JobState.FAILED
    outbox = Outbox()
    for n in (2, 3):  # one statement of watcher events (PostgreSQL: the guard inside it)
        outbox.put_nowait(_fired(asset_id, n))
    with pytest.raises(ExceptionGroup) as raised:  # out of the persister's task group
        await _drain(persister(outbox), outbox)
    assert raised.group_contains(LeaseLost, match=f"job {owner} is no longer running")
    assert (_event_count(db), confirmed) == (1, [1])
    assert len(lost) == 1

    # Any other batch (a transaction: task triggers, failures) is guarded the same way.
    with pytest.raises(LeaseLost):
        db.call(lambda s: persister(Outbox()).write_prepared(s, [(_fired(asset_id, 4), "{}")]))
    assert _event_count(db) == 1


def test_the_claim_that_takes_a_dead_owner_s_rows_ends_its_job(db: Database) -> None:
    cipher = KwargsCipher(Fernet.generate_key().decode())
    dead, alive = _job(db), _job(db)

    def seed(session: Any) -> int:
        classpath, kwargs = DirectoryFileDeleteTrigger(directory="/tmp", filename="f").serialize()
        tid = trigger_rows.add_trigger_row(
            session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
        )
        session.execute(update(Trigger).where(Trigger.id == tid).values(triggerer_id=dead))
        return tid

    tid = db.call(seed)
    stale = utcnow() - timedelta(seconds=60)
    db.call(lambda s: s.execute(update(Job).where(Job.id == dead).values(latest_heartbeat=stale)))
    result = db.call(
        lambda s: claiming.claim_round(s, triggerer_id=alive, capacity_left=10, threshold_s=10)
    )
    assert [row.id for row in result.rows] == [tid]
    assert (_state(db, dead), _state(db, alive)) == (JobState.FAILED, JobState.RUNNING)
    # The dead job's heartbeat, were it to come back, finds its row over.
    assert db.call(lambda s: jobs.heartbeat(s, dead)) is False


def _settings() -> TriggererSettings:
    return TriggererSettings(
        capacity=10,
        heartbeat_s=0.1,
        health_check_threshold_s=5,
        claim_idle_interval_s=0.05,
        new_trigger_poll_s=0.02,
        cleanup_interval_s=60,
        shutdown_grace_s=5,
    )


async def test_a_taken_over_triggerer_fences_and_starts_again_as_a_new_job(
    db: Database, tmp_path: Path
) -> None:
    """A's job row is ended as a claim that finds A dead ends it. A's next heartbeat finds
    its job over: A fences its stream (it never advances it again) and starts again as a new
    job; the group is then claimed whole by one live job, and every file is served once."""
    cipher = KwargsCipher(Fernet.generate_key().decode())
    inbox = tmp_path / "inbox"
    inbox.mkdir()

    def seed(session: Any) -> None:
        for i in range(2):
            trigger = DirectoryFileDeleteTrigger(
                directory=str(inbox), filename=f"flag-{i}", poke_interval=0.05
            )
            asset_id = session.execute(
                insert(Asset).values(name=f"a{i}", uri=f"test://a{i}", extra={}).returning(Asset.id)
            ).scalar_one()
            classpath, kwargs = trigger.serialize()
            tid = trigger_rows.add_trigger_row(
                session,
                cipher,
                classpath,
                kwargs,
                kind=TriggerKind.WATCHER,
                stream_digest=trigger_stream_digest(trigger),
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )

    db.call(seed)
    a = Triggerer(db=db, cipher=cipher, settings=_settings())
    b = Triggerer(db=db, cipher=cipher, settings=_settings())

    def owners() -> set[int | None]:
        return set(db.call(lambda s: list(s.execute(select(Trigger.triggerer_id)).scalars())))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(a.run)
            await wait_until(lambda: len(a.runner) == 2)
            first_job, first_streams = a.job_id, a.shared_streams
            assert first_job is not None
            await tg.start(b.run)

            # What a claim that finds A dead does to A's job row; its rows are then free for
            # whichever live triggerer claims first (B, or A again under its new job).
            db.call(lambda s: jobs.revoke_jobs(s, [first_job]))
            await wait_until(lambda: a.leases_lost == 1 and a.job_id != first_job)
            assert first_streams.fenced is not None
            assert not first_streams._may_advance()
            await wait_until(lambda: sorted([len(a.runner), len(b.runner)]) == [0, 2])
            for i in range(2):
                (inbox / f"flag-{i}").touch()
            await wait_until(lambda: _event_count(db) == 2)
            assert len(owners()) == 1
            assert owners() <= {a.job_id, b.job_id}
            assert _state(db, first_job) == JobState.FAILED
            a.shutdown()
            b.shutdown()


async def test_the_lease_starts_with_the_job_row_not_with_the_object(db: Database) -> None:
    """Built long before it runs (``sluice run`` starts the other parts first), a triggerer
    holds its lease from its job row's insert and keeps it heartbeat after heartbeat.

    The lease's clock is the test's: it stands still but for the wait between the object
    and its run (longer than the lease's bound), so a heartbeat that a loaded machine makes
    late cannot lose the lease here, and the wait costs no time."""
    cipher = KwargsCipher(Fernet.generate_key().decode())
    settings = TriggererSettings(
        capacity=10,
        heartbeat_s=0.2,
        health_check_threshold_s=2.5,
        claim_idle_interval_s=0.05,
        new_trigger_poll_s=0.02,
        cleanup_interval_s=60,
        shutdown_grace_s=5,
    )
    now = [1000.0]
    triggerer = Triggerer(db=db, cipher=cipher, settings=settings, monotonic=lambda: now[0])
    now[0] += 2 * settings.health_check_threshold_s  # longer than the lease's bound

    def heartbeat() -> Any:
        return db.call(
            lambda s: s.execute(
                select(Job.latest_heartbeat).where(Job.id == triggerer.job_id)
            ).scalar_one()
        )

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            for _ in range(3):  # three heartbeats went through
                seen = heartbeat()
                await wait_until(lambda seen=seen: heartbeat() != seen)
            assert triggerer.leases_lost == 0
            assert triggerer.lease.holds()
            triggerer.shutdown()


async def test_a_new_life_waits_for_the_database_to_register_its_job(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease lost because the database was away: the next life's job row cannot be
    inserted yet either. The triggerer retries with a backoff instead of crashing the part
    (which would stop ``sluice run``), and serves again once the row is in."""
    cipher = KwargsCipher(Fernet.generate_key().decode())
    triggerer = Triggerer(db=db, cipher=cipher, settings=_settings())
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            first_job = triggerer.job_id
            assert first_job is not None
            start = triggerer._job.start
            refusals = 2

            async def database_away(*args: Any, **kwargs: Any) -> int:
                nonlocal refusals
                if refusals:
                    refusals -= 1
                    raise DatabaseUnavailable("connection refused (the test's outage)")
                return await start(*args, **kwargs)

            triggerer._job.start = database_away  # type: ignore[method-assign]
            db.call(lambda s: jobs.revoke_jobs(s, [first_job]))
            await wait_until(lambda: triggerer.job_id not in (None, first_job), within=15)
            assert (triggerer.leases_lost, refusals) == (1, 0)
            assert triggerer.lease.holds()
            triggerer.shutdown()
    retries = [r for r in caplog.records if "cannot register its new job yet" in r.message]
    assert len(retries) == 2
