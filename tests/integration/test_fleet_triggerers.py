"""Two real triggerers on one database keep a shared-stream group on one of them.

The watchers here are ``DirectoryFileDeleteTrigger``s of one inbox (one shared listing):
no broker needed, and each event is a file the test creates, so loss is visible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import insert, select, update

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, AssetWatcher, Trigger
from engine.db.queries import triggers as trigger_rows
from engine.loader import trigger_stream_digest
from engine.states import TriggerKind
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from tests.waiting import wait_until
from triggers.file import DirectoryFileDeleteTrigger

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

N_WATCHERS = 4
POKE_S = 0.1


def _seed(db: Database, cipher: KwargsCipher, inbox: Path, *, with_digest: bool) -> list[int]:
    """Four watchers of one inbox; ``with_digest=False`` writes rows as an older version did."""

    def seed(session: Any) -> list[int]:
        ids = []
        for i in range(N_WATCHERS):
            trigger = DirectoryFileDeleteTrigger(
                directory=str(inbox), filename=f"flag-{i}", poke_interval=POKE_S
            )
            asset_id = session.execute(
                insert(Asset).values(name=f"a{i}", uri=f"test://a{i}", extra={}).returning(Asset.id)
            ).scalar_one()
            classpath, kwargs = trigger.serialize()
            digest = trigger_stream_digest(trigger) if with_digest else None
            tid = trigger_rows.add_trigger_row(
                session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER, stream_digest=digest
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )
            ids.append(tid)
        return ids

    return db.call(seed)


def _triggerer(db: Database, cipher: KwargsCipher) -> Triggerer:
    return Triggerer(
        db=db,
        cipher=cipher,
        settings=TriggererSettings(
            capacity=2,  # the old claim loop split four watchers 2 + 2
            heartbeat_s=0.5,
            health_check_threshold_s=5,
            claim_idle_interval_s=0.05,
            new_trigger_poll_s=0.02,
            cleanup_interval_s=60,
            shutdown_grace_s=5,
        ),
    )


def _owners(db: Database) -> list[int | None]:
    return db.call(lambda s: list(s.execute(select(Trigger.triggerer_id)).scalars()))


def _events(db: Database) -> list[str]:
    rows = db.call(lambda s: list(s.execute(select(AssetEvent.payload)).scalars()))
    return sorted(p["filename"] for p in rows)


@pytest.fixture
def setup(tmp_path: Path, migrated_sqlite_url: str):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    db = Database(migrated_sqlite_url)
    yield db, KwargsCipher(Fernet.generate_key().decode()), inbox
    db.dispose()


def _one_triggerer_runs_all(db: Database, a: Triggerer, b: Triggerer) -> bool:
    owners = _owners(db)
    running = sorted([len(a.runner), len(b.runner)])
    return len(set(owners)) == 1 and owners[0] is not None and running == [0, N_WATCHERS]


@pytest.mark.parametrize("with_digest", [True, False], ids=["digest", "older-rows"])
async def test_two_triggerers_of_capacity_two_keep_four_siblings_together(
    setup, with_digest: bool
) -> None:
    db, cipher, inbox = setup
    _seed(db, cipher, inbox, with_digest=with_digest)
    a, b = _triggerer(db, cipher), _triggerer(db, cipher)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(a.run)
            await tg.start(b.run)
            await wait_until(lambda: _one_triggerer_runs_all(db, a, b))
            for i in range(N_WATCHERS):
                (inbox / f"flag-{i}").touch()
            await wait_until(lambda: len(_events(db)) == N_WATCHERS)
            assert _one_triggerer_runs_all(db, a, b)
            a.shutdown()
            b.shutdown()
    assert _events(db) == [f"flag-{i}" for i in range(N_WATCHERS)]
    assert not any(inbox.iterdir())


async def test_a_split_in_the_database_converges_to_one_triggerer(setup) -> None:
    """A row of A's running group assigned to B by hand: B gives it up (A holds more of the
    group), A stops the trigger it lost and takes the row back into its group, and every
    watcher still gets its file. (B never starts the row: a triggerer starts only rows it
    claimed, so two of this version cannot both run a group.)"""
    db, cipher, inbox = setup
    ids = _seed(db, cipher, inbox, with_digest=True)
    a, b = _triggerer(db, cipher), _triggerer(db, cipher)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(a.run)
            await wait_until(lambda: len(a.runner) == N_WATCHERS)
            await tg.start(b.run)
            # A hand edit (or an older triggerer) gives one watcher of A's group to B.
            moved = ids[:1]
            db.call(
                lambda s: s.execute(
                    update(Trigger).where(Trigger.id.in_(moved)).values(triggerer_id=b.job_id)
                )
            )
            await wait_until(lambda: _one_triggerer_runs_all(db, a, b) and len(a.runner) == 4)
            for i in range(N_WATCHERS):
                (inbox / f"flag-{i}").touch()
            await wait_until(lambda: len(_events(db)) == N_WATCHERS)
            a.shutdown()
            b.shutdown()
    assert _events(db) == [f"flag-{i}" for i in range(N_WATCHERS)]
