"""Connecting to the metadata database and running sessions off the event loop.

SQLite (the embedded default) is set up so that several processes can write safely:
autocommit DBAPI connections, WAL, ``busy_timeout``, foreign keys on, and ``BEGIN IMMEDIATE``
on every transaction (a deferred BEGIN loses updates or fails with "database is locked"
under two writers). PostgreSQL goes through psycopg 3.

``Database.run(fn)`` runs ``fn(session)`` in a worker thread inside one transaction, so the
event loop never blocks on the database; ``Database.run_statement(fn)`` runs a write that is
one statement, on PostgreSQL in a single round trip.

No SQLAlchemy error leaves ``engine.db``: ``translated_errors`` raises the engine's
``DatabaseUnavailable`` (the database cannot be reached for now: retry) or ``DatabaseError``
(anything else) instead, with SQLAlchemy's as ``__cause__``.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar, TypeVarTuple

import anyio.to_thread
from sqlalchemy import create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from engine.exceptions import DatabaseError, DatabaseUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from sqlalchemy import Select
    from sqlalchemy.engine import Connection, Engine, Result
    from sqlalchemy.sql.expression import Executable

logger = logging.getLogger(__name__)


T = TypeVar("T")
_Ts = TypeVarTuple("_Ts")


SQLITE_BUSY_TIMEOUT_MS: Final = 30_000


READ_ONLY_OPTION: Final = "sluice_read_only"


READERS: Final = 4  # concurrent read-only transactions per process
#: A pooled PostgreSQL connection back in the pool for longer than this is pinged before it
#: is used again (a server restart, a failover or an idle timeout may have dropped it); one
#: used again sooner is not. Pinging every checkout (``pool_pre_ping``) cost a round trip
#: per transaction, a quarter of an empty transaction's (ping, BEGIN, statement, COMMIT).
PING_AFTER_IDLE_S: Final = 5.0


def is_postgres(session: Session) -> bool:
    """Whether ``session`` talks to PostgreSQL (row locks, ``SKIP LOCKED``, advisory locks)."""
    return session.get_bind().dialect.name == "postgresql"


def upsert_insert(session: Session, table: Any) -> Any:
    """The dialect's ``INSERT`` into ``table`` (it has ``on_conflict_do_nothing``): the same
    statement on PostgreSQL and SQLite, where the plain ``insert`` has no conflict clause."""
    if is_postgres(session):
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert  # type: ignore[assignment]
    return dialect_insert(table)


def read_rows(
    session: Session, statement: Select[*_Ts], params: Mapping[str, Any] | None = None
) -> Result[*_Ts]:
    """A SELECT of columns, built once (at import, with ``bindparam``s for what varies),
    run as Core on the session's connection: a statement built per call is keyed for the
    compiled cache per call, and the ORM's execution (its compile state, its result
    processing) wraps even a select of plain columns; together they were a third of the
    engine's CPU per one-task run (3 reads of ``load_run_state``: ~600 -> ~130 us). What
    the session holds unflushed is flushed first, as the ORM's autoflush would."""
    if session.new or session.dirty or session.deleted:
        session.flush()
    return session.connection().execute(statement, params or {})


def write_rows(
    session: Session, statement: Executable, params: Mapping[str, Any] | None = None
) -> Result[Any]:
    """An INSERT, UPDATE or DELETE, run as Core on the session's connection when the session
    holds no ORM object, else through the session as before (which brings the objects it
    holds up to date, for criteria it can evaluate: give it statements with their values in
    them, not ``bindparam``s). The ORM's execution of an UPDATE synchronizes the session's
    objects (a ``RETURNING`` and an identity-map pass) even when it holds none: ~250 us of
    the engine's CPU a statement against ~90 us as Core, on the writes every task step
    makes, where the session holds none."""
    if session.new or session.dirty or session.deleted or len(session.identity_map):
        return session.execute(statement, dict(params or {}))
    return session.connection().execute(statement, params or {})


def rowcount(result: Any) -> int:
    """The number of rows an UPDATE or DELETE matched."""
    return int(result.rowcount)


def database_error(exc: SQLAlchemyError) -> DatabaseError:
    """SQLAlchemy's ``exc`` as the engine's error (raise it ``from exc``):
    ``DatabaseUnavailable`` when the database cannot be reached for now (an operational
    error: refused, reset, locked; or a connection found dead), else ``DatabaseError``."""
    message = f"metadata database error: {exc}"
    unavailable = isinstance(exc, OperationalError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )
    return DatabaseUnavailable(message) if unavailable else DatabaseError(message)


@contextmanager
def translated_errors() -> Iterator[None]:
    """Raise SQLAlchemy's errors inside as ``database_error``'s, the original as cause."""
    try:
        yield
    except SQLAlchemyError as exc:
        raise database_error(exc) from exc


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A read-only transaction (``Database.read``) begins deferred: in WAL mode it reads a
        # snapshot without the write lock, so it neither waits for nor delays a writer.
        read_only = conn.get_execution_options().get(READ_ONLY_OPTION, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite ``url``; None for another database or an in-memory one.

    Connecting to a SQLite file that does not exist creates it (and ``create_db_engine``
    its directory): a caller that must not create a database checks this path first."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database
    if not database or database == ":memory:" or parsed.query.get("mode") == "memory":
        return None
    return Path(database).expanduser()


def create_db_engine(url: str) -> Engine:
    """An engine for ``url`` with the settings this project relies on; a SQLite file's
    directory is created if missing (the file itself on first connect)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if (path := sqlite_file(url)) is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            parsed, connect_args={"check_same_thread": False, "timeout": 30}, future=True
        )
        _sqlite_setup(engine)
        return engine
    engine = create_engine(parsed, pool_size=8, max_overflow=8, future=True)
    _ping_after_idle(engine)
    return engine


def _ping_after_idle(engine: Engine) -> None:
    """Ping a pooled connection at checkout when it sat in the pool ``PING_AFTER_IDLE_S`` or
    longer; a dead one is replaced by a fresh connection (the pool's answer to
    ``DisconnectionError`` raised at checkout)."""

    @event.listens_for(engine.pool, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["checked_in_at"] = time.monotonic()

    @event.listens_for(engine.pool, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        checked_in_at = record.info.get("checked_in_at")
        if checked_in_at is None or time.monotonic() - checked_in_at < PING_AFTER_IDLE_S:
            return  # a new connection, or one in use moments ago
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as exc:
            raise DisconnectionError(str(exc)) from exc


class Database:
    """The metadata DB: sync sessions, and ``run`` to use them from async code in a thread."""

    def __init__(self, url: str, *, engine: Engine | None = None) -> None:
        self.url = url
        self.engine = engine or create_db_engine(url)
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # run_statement's connections (PostgreSQL): autocommit, not pinged when taken. Made
        # by create_engine, which connects only when first used.
        self._statement_engine = (
            None
            if self.is_sqlite
            else create_engine(
                self.engine.url,
                isolation_level="AUTOCOMMIT",
                pool_pre_ping=False,
                pool_size=1,
                max_overflow=1,
            )
        )
        read_only = self.engine.execution_options(**{READ_ONLY_OPTION: True})
        self._read_sessions = sessionmaker(read_only, expire_on_commit=False)
        # SQLite has one writer at a time and every transaction takes the write lock.
        self._limiter = anyio.CapacityLimiter(1 if self.is_sqlite else 8)
        self._read_limiter = anyio.CapacityLimiter(READERS)

    def __repr__(self) -> str:
        return f"Database({make_url(self.url).render_as_string(hide_password=True)!r})"

    @contextmanager
    def session(self, *, read_only: bool = False) -> Iterator[Session]:
        """One transaction: commit on success, roll back on error.

        ``read_only``: a transaction that only reads; on SQLite it does not take the write
        lock (it must then not write: a write in it can fail with "database is locked").
        """
        sessions = self._read_sessions if read_only else self._sessions
        with translated_errors(), sessions.begin() as session:
            yield session

    def call(self, fn: Callable[[Session], T], *, read_only: bool = False) -> T:
        with self.session(read_only=read_only) as session:
            return fn(session)

    async def run(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn(session)`` in one transaction on a worker thread."""
        return await anyio.to_thread.run_sync(self.call, fn, limiter=self._limiter)

    def call_statement(self, fn: Callable[[Connection], T]) -> T:
        """``fn(connection)``, whose writes are one statement, committed by itself.

        PostgreSQL: on a connection of a small pool of its own, in autocommit mode and not
        pinged when taken, so the statement is the only round trip (a transaction adds a
        BEGIN, a COMMIT and the pool's ping, and under load each costs a thread that waits
        for the GIL milliseconds). The catch: a connection that died since its last use
        fails the call (the pool then drops it), so the caller must retry a failed call, as
        the persister does with every batch. SQLite: one ordinary transaction, which costs
        no round trip.
        """
        if self._statement_engine is None:
            with self.session() as session:
                return fn(session.connection())
        with translated_errors(), self._statement_engine.connect() as connection:
            return fn(connection)

    async def run_statement(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(connection)`` (see ``call_statement``) on a worker thread."""
        return await anyio.to_thread.run_sync(self.call_statement, fn, limiter=self._limiter)

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn(session)``, which only reads, on a worker thread: not queued behind this
        process's writes, and on SQLite without the write lock (see ``session``)."""
        return await anyio.to_thread.run_sync(
            partial(self.call, fn, read_only=True), limiter=self._read_limiter
        )

    def dispose(self) -> None:
        self.engine.dispose()
        if self._statement_engine is not None:
            self._statement_engine.dispose()
