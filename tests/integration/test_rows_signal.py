"""The PostgreSQL wake-up listener: it hears a notification (but the one its own process's
writer marked as nudged already), and a listener cancelled while it waits, or while its
``LISTEN`` runs, closes its connection (none is left open for the garbage collector to warn
about)."""

from __future__ import annotations

import gc
import warnings
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
import pytest
from sqlalchemy import text

from engine.db.database import Database
from engine.db.listen import (
    LISTEN_SCHEDULER_WORK,
    SCHEDULER_WORK_CHANNEL,
    listening,
    notify_scheduler,
    process_token,
)
from engine.db.queries.claims import LISTEN_NEW_TRIGGER_ROWS, NEW_TRIGGER_ROWS_CHANNEL
from engine.jobs.wakeup import RowsSignal
from tests.waiting import wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


@pytest.fixture
def db(migrated_pg_url: str) -> Iterator[Database]:
    database = Database(migrated_pg_url)
    yield database
    database.dispose()


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[psycopg.AsyncConnection[Any]]:
    """Every connection the listener opens."""
    connections: list[psycopg.AsyncConnection[Any]] = []
    connect = psycopg.AsyncConnection.connect

    async def recording(*args: Any, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
        connection = await connect(*args, **kwargs)
        connections.append(connection)
        return connection

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", recording)
    return connections


def _no_resource_warning(caught: list[warnings.WarningMessage]) -> bool:
    return not [w for w in caught if issubclass(w.category, ResourceWarning)]


async def test_a_listener_cancelled_while_it_waits_closes_its_connection(
    db: Database, opened: list[psycopg.AsyncConnection[Any]]
) -> None:
    heard = anyio.Event()

    def on_signal() -> None:
        heard.set()

    signal = RowsSignal(db, on_signal, listen=LISTEN_NEW_TRIGGER_ROWS, what="new trigger rows")
    assert signal.source == "postgresql"
    notify = text(f"NOTIFY {NEW_TRIGGER_ROWS_CHANNEL}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                await tg.start(signal.run)
                assert heard.is_set()  # once listening: rows written before it listened
                heard = anyio.Event()
                await anyio.to_thread.run_sync(db.call, lambda s: s.execute(notify))
                await heard.wait()
                (connection,) = opened
                assert not connection.closed
                tg.cancel_scope.cancel()
        assert connection.closed
        gc.collect()
    assert _no_resource_warning(caught)


async def test_a_listener_cancelled_while_its_statement_runs_closes_its_connection(
    db: Database, opened: list[psycopg.AsyncConnection[Any]]
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with anyio.move_on_after(0.5):
            async with listening(db, "SELECT pg_sleep(30)"):
                pytest.fail("the statement ended before the cancellation")
        (connection,) = opened
        assert connection.closed
        gc.collect()
    assert _no_resource_warning(caught)


async def test_a_scheduler_s_listener_ignores_what_a_try_ending_in_its_own_process_notified(
    db: Database,
) -> None:
    """The executor that recorded the try in this process wakes the scheduler beside it
    itself (when the outcome concerns it); its notification is for the other processes."""
    heard: list[str] = []
    signal = RowsSignal(
        db,
        lambda: heard.append("signal"),
        listen=LISTEN_SCHEDULER_WORK,
        what="scheduler work",
        ignore_payload=process_token(),
    )
    elsewhere = text("SELECT pg_notify(:channel, 'another process:1')")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(signal.run)
            assert heard == ["signal"]  # once listening: rows written before it listened
            for notify in (
                lambda s: notify_scheduler(s, nudged_here=True),  # a try ended here
                lambda s: s.execute(elsewhere, {"channel": SCHEDULER_WORK_CHANNEL}),
                notify_scheduler,  # a run created (through this process's API, say)
            ):
                await anyio.to_thread.run_sync(db.call, notify)
            # delivered in commit order: once the last two are heard, the first was read
            await wait_until(lambda: len(heard) >= 3)
            tg.cancel_scope.cancel()
    assert heard == ["signal"] * 3
