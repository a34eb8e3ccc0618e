"""Hearing other processes' writes: a PostgreSQL ``LISTEN`` connection of its own, and the
file of a SQLite database (whose directory shows every commit).

The channels and the row triggers that notify them are the migrations' (0018, 0019) and the
queries' (``claims.LISTEN_NEW_TRIGGER_ROWS``, ``tasks.LISTEN_SCHEDULED_TASKS``); what a part
does when it hears one, and how it waits to listen again, is ``engine.jobs.wakeup``'s.
"""

from __future__ import annotations

import os
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
from sqlalchemy import text
from sqlalchemy.engine import make_url

from engine.exceptions import DatabaseUnavailable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    from engine.db.database import Database

__all__ = (
    "LISTEN_CONNECTION_PARAMS",
    "LISTEN_SCHEDULER_WORK",
    "SCHEDULER_WORK_CHANNEL",
    "can_listen",
    "listening",
    "notify_scheduler",
    "process_token",
    "sqlite_file",
)

#: The PostgreSQL channel a transaction notifies (``notify_scheduler``) when it wrote what a
#: scheduler acts on: a run created, a try ended, asset events queued for a DAG. A scheduler
#: in another process then loops at once rather than at its idle poll.
SCHEDULER_WORK_CHANNEL: Final = "sluice_scheduler_work"
LISTEN_SCHEDULER_WORK: Final = f"LISTEN {SCHEDULER_WORK_CHANNEL}"
#: Where this process's boot is told apart from a fork's (``process_token``).
_BOOT: Final = uuid.uuid4().hex[:12]

#: libpq parameters of the LISTEN connection unless its URL sets them: a bounded connect, and
#: a dead peer noticed within about a minute.
LISTEN_CONNECTION_PARAMS: Final = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


def can_listen(db: Database) -> bool:
    """Whether ``db`` can notify listeners: PostgreSQL through psycopg."""
    dialect = db.engine.dialect
    return dialect.name == "postgresql" and dialect.driver == "psycopg"


def notify_scheduler(session: Session | Connection, *, nudged_here: bool = False) -> None:
    """On PostgreSQL, notify ``SCHEDULER_WORK_CHANNEL`` at this transaction's commit (one
    notification per transaction, channel and payload, however often called); elsewhere
    nothing (SQLite's listeners see the commit itself).

    ``nudged_here``: a scheduler in this process, if any, is woken by the writer itself
    when the write concerns it (the executor's outcome: ``Recorded.scheduler_needed``); the
    notification carries ``process_token()``, which that scheduler's listener ignores
    (``RowsSignal(ignore_payload=...)``): it would loop for nothing, and on the step's path."""
    bind = session.get_bind() if hasattr(session, "get_bind") else session
    if bind.dialect.name != "postgresql":
        return
    if nudged_here:
        session.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": SCHEDULER_WORK_CHANNEL, "payload": process_token()},
        )
    else:
        session.execute(text(f"NOTIFY {SCHEDULER_WORK_CHANNEL}"))


def process_token() -> str:
    """This process among every process of every host (a forked child gets its own)."""
    return f"{_BOOT}:{os.getpid()}"


def sqlite_file(db: Database) -> Path | None:
    """The file of a SQLite database kept in a file; None for any other database (in-memory
    SQLite, a ``file:`` URI, PostgreSQL)."""
    if not db.is_sqlite:
        return None
    database = make_url(db.url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).expanduser().absolute()


@asynccontextmanager
async def listening(db: Database, statement: str) -> AsyncIterator[AsyncIterator[object]]:
    """A connection of its own, in autocommit mode, that ran ``statement`` (a ``LISTEN``):
    yields its notifications as they come. The connection is closed on the way out,
    cancellation included. ``DatabaseUnavailable`` when it cannot connect or is lost."""
    import psycopg  # the driver of every PostgreSQL URL this project accepts

    _args, kwargs = db.engine.dialect.create_connect_args(db.engine.url)
    # A connection that only listens sends nothing: without TCP keepalives one that died
    # silently (a failover, a NAT timeout) would never raise, and wake-ups would stop.
    for key, value in LISTEN_CONNECTION_PARAMS.items():
        kwargs.setdefault(key, value)
    try:
        conn = await psycopg.AsyncConnection.connect(**kwargs, autocommit=True)
    except psycopg.Error as exc:
        raise DatabaseUnavailable(str(exc)) from exc
    # Closed here rather than by the connection's own ``async with``: on a cancellation its
    # exit awaits a rollback first, which the cancellation interrupts before the close.
    notifies = conn.notifies()
    try:
        await conn.execute(statement)
        yield notifies
    except psycopg.Error as exc:
        raise DatabaseUnavailable(str(exc)) from exc
    finally:
        with anyio.CancelScope(shield=True):
            await notifies.aclose()
            await conn.close()
