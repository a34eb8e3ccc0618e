"""The schema's version: migrating with Alembic (``migrations/``), checking that a database
is at the head revision and matches the models, and resetting it.

SQLite migrations run with foreign keys off (SQLite alters a column by rebuilding its
table, and the DROP would cascade) and end with ``PRAGMA foreign_key_check``. A database
that cannot be reached or refuses raises ``DatabaseUnavailable`` / ``DatabaseError``
(``engine.db.database.translated_errors``).
"""

from __future__ import annotations

import functools
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from engine.db.database import translated_errors
from engine.db.models import Base
from engine.exceptions import DatabaseError, SchemaNotCurrentError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.engine import Connection, Engine

logger = logging.getLogger(__name__)


MIGRATIONS_LOCATION: Final = str(Path(__file__).parent / "migrations")


def _alembic_config(connection: Connection) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", MIGRATIONS_LOCATION)
    cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def head_revision() -> str:
    """The newest migration revision (the scripts are read once per process)."""
    script = ScriptDirectory(MIGRATIONS_LOCATION)
    head = script.get_current_head()
    if head is None:  # pragma: no cover - the project always ships migrations
        raise DatabaseError("no migration revisions found in engine/db/migrations")
    return head


def current_revision(engine: Engine) -> str | None:
    with translated_errors(), engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def migrate(engine: Engine, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade the schema to ``revision`` (a ``-N`` or older revision downgrades); returns
    (revision before, head)."""
    before = current_revision(engine)
    with translated_errors(), engine.connect() as conn, _foreign_keys_off(conn):
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

    with translated_errors(), engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": False})
        return list(compare_metadata(ctx, Base.metadata))


#: What migrations create besides tables (PostgreSQL): dropped by ``reset`` with them.
POSTGRES_FUNCTIONS = (
    "sluice_notify_trigger_rows()",  # 0018: new trigger rows -> NOTIFY
    "sluice_notify_scheduled_tasks()",  # 0019: task instances made scheduled -> NOTIFY
)


def reset(engine: Engine) -> None:
    """Drop every table (ours and Alembic's) and function, then migrate from empty."""
    with translated_errors(), engine.begin() as conn:
        Base.metadata.drop_all(conn)
        if inspect(conn).has_table("alembic_version"):
            conn.exec_driver_sql("DROP TABLE alembic_version")
        if conn.dialect.name == "postgresql":
            for function in POSTGRES_FUNCTIONS:
                conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {function}")
    migrate(engine)
