"""Connecting to the metadata database, migrating it, and running sessions off the loop.

SQLite (the embedded default) is set up so that several processes can write safely:
autocommit DBAPI connections, WAL, ``busy_timeout``, foreign keys on, and ``BEGIN IMMEDIATE``
on every transaction (a deferred BEGIN loses updates or fails with "database is locked"
under two writers). PostgreSQL goes through psycopg 3.

``Database.run(fn)`` runs ``fn(session)`` in a worker thread inside one transaction, so the
event loop never blocks on the database.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio.to_thread
from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from engine.exceptions import DatabaseError, SchemaNotCurrentError
from engine.models import Base

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sqlalchemy.engine import Connection, Engine

logger = logging.getLogger(__name__)

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS: Final = 30_000
READ_ONLY_OPTION: Final = "sluice_read_only"
READERS: Final = 4  # concurrent read-only transactions per process
MIGRATIONS_LOCATION: Final = str(Path(__file__).parent / "migrations")


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


def create_db_engine(url: str) -> Engine:
    """An engine for ``url`` with the settings this project relies on."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:":
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            parsed, connect_args={"check_same_thread": False, "timeout": 30}, future=True
        )
        _sqlite_setup(engine)
        return engine
    return create_engine(parsed, pool_pre_ping=True, pool_size=8, max_overflow=8, future=True)


def _alembic_config(connection: Connection) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", MIGRATIONS_LOCATION)
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    script = ScriptDirectory(MIGRATIONS_LOCATION)
    head = script.get_current_head()
    if head is None:  # pragma: no cover - the project always ships migrations
        raise DatabaseError("no migration revisions found in engine/migrations")
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def migrate(engine: Engine, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade the schema to ``revision`` (a ``-N`` or older revision downgrades); returns
    (revision before, head)."""
    before = current_revision(engine)
    with engine.connect() as conn, _foreign_keys_off(conn):
        with conn.begin():
            if revision.startswith("-") or _is_older(revision, before):
                command.downgrade(_alembic_config(conn), revision)
            else:
                command.upgrade(_alembic_config(conn), revision)
            _check_foreign_keys(conn)
    return before, head_revision()


def _is_older(revision: str, current: str | None) -> bool:
    if current is None or revision == "head":
        return False
    script = ScriptDirectory(MIGRATIONS_LOCATION)
    return any(r.revision == revision for r in script.iterate_revisions(current, "base"))


@contextmanager
def _foreign_keys_off(conn: Connection) -> Iterator[None]:
    """On SQLite, foreign keys off while migrating (outside any transaction: the pragma is a
    no-op inside one). A migration that rebuilds a table (copy, DROP, rename: how SQLite
    alters a column) would otherwise cascade the DROP to every row that references it."""
    if conn.dialect.name != "sqlite":
        yield
        return
    raw = conn.connection.dbapi_connection
    assert raw is not None
    raw.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        raw.execute("PRAGMA foreign_keys=ON")


def _check_foreign_keys(conn: Connection) -> None:
    if conn.dialect.name == "sqlite":
        broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise DatabaseError(f"the migration left rows that break foreign keys: {broken[:5]}")


def check_schema(engine: Engine) -> None:
    """Raise ``SchemaNotCurrentError`` unless the schema is at head and matches the models."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaNotCurrentError(
            f"schema revision is {current or 'empty'}, the code expects {head}; "
            "run `sluice db migrate`"
        )
    drift = schema_drift(engine)
    if drift:
        raise SchemaNotCurrentError(f"schema differs from the models: {drift}")


def schema_drift(engine: Engine) -> list[Any]:
    """Differences between the live schema and the models (empty when they agree)."""
    from alembic.autogenerate import compare_metadata

    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": False})
        return list(compare_metadata(ctx, Base.metadata))


def reset(engine: Engine) -> None:
    """Drop every table (ours and Alembic's), then migrate from empty."""
    with engine.begin() as conn:
        Base.metadata.drop_all(conn)
        if inspect(conn).has_table("alembic_version"):
            conn.exec_driver_sql("DROP TABLE alembic_version")
    migrate(engine)


class Database:
    """The metadata DB: sync sessions, and ``run`` to use them from async code in a thread."""

    def __init__(self, url: str, *, engine: Engine | None = None) -> None:
        self.url = url
        self.engine = engine or create_db_engine(url)
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
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
        try:
            with sessions.begin() as session:
                yield session
        except SQLAlchemyError as exc:
            raise DatabaseError(f"metadata database error: {exc}") from exc

    def call(self, fn: Callable[[Session], T], *, read_only: bool = False) -> T:
        with self.session(read_only=read_only) as session:
            return fn(session)

    async def run(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn(session)`` in one transaction on a worker thread."""
        return await anyio.to_thread.run_sync(self.call, fn, limiter=self._limiter)

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn(session)``, which only reads, on a worker thread: not queued behind this
        process's writes, and on SQLite without the write lock (see ``session``)."""
        return await anyio.to_thread.run_sync(
            partial(self.call, fn, read_only=True), limiter=self._read_limiter
        )

    def dispose(self) -> None:
        self.engine.dispose()


async def heartbeat_forever(db: Database, job_id: int, *, interval_s: float, part: str) -> None:
    """Refresh ``job_id``'s heartbeat every ``interval_s`` until cancelled.

    A failed write is logged and retried at the next beat; a job row that is no longer
    ``running`` (ended by an operator, or considered dead) is reported: others may take
    over this part's work.
    """
    from engine import store

    while True:
        await anyio.sleep(interval_s)
        try:
            alive = await db.run(lambda s: store.heartbeat(s, job_id))
        except DatabaseError as exc:
            logger.warning(
                "%s heartbeat failed: %s",
                part,
                exc,
                extra={"action": "heartbeat_failed", "part": part},
            )
            continue
        if not alive:
            logger.error(
                "%s job %s is no longer marked running; another process may take over its work",
                part,
                job_id,
                extra={"action": "heartbeat_lost", "job_id": job_id},
            )
