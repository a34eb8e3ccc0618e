"""Migrated databases for tests, copied from a template migrated once per test session.

Running the 13 migrations (SQLite rebuilds tables to alter them) takes a second or so; a
copy takes milliseconds. Each session (each pytest-xdist worker, if used) migrates its own
template with the real ``migrate`` and checks it against the models, so a template can never
be stale: it is built fresh, in the session's temporary directory (SQLite) or as a database
of its own name (PostgreSQL), and dropped at the end. Its name carries the digest of the
migrations directory, so a template in a log says which migrations made it.

- SQLite: the template is migrated, then closed (the last connection to close checkpoints
  the write-ahead log into the main file and removes it); each test gets a file copy.
- PostgreSQL: ``CREATE DATABASE t_... TEMPLATE sluice_tpl_...``; the template has no open
  connection (its engine is disposed once migrated), as PostgreSQL requires.

Tests of migrating itself (``sluice db migrate``, upgrade paths, a first run) keep starting
from an empty database (``sqlite_url``, ``pg_url``, ``db_url``).
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import create_engine, text

from engine.db.database import Database
from engine.db.schema import MIGRATIONS_LOCATION, check_schema, migrate

if TYPE_CHECKING:
    from collections.abc import Iterator


def migrations_digest() -> str:
    """A digest of every migration file's path and content (what a template depends on)."""
    root = Path(MIGRATIONS_LOCATION)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".pyc"):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _migrate_and_check(url: str) -> None:
    db = Database(url)
    try:
        migrate(db.engine)
        check_schema(db.engine)
    finally:
        db.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed SQLite file migrated to head (no write-ahead log beside it)."""
    path = tmp_path_factory.mktemp("templates") / f"migrated-{migrations_digest()}.db"
    _migrate_and_check(f"sqlite:///{path}")
    leftovers = [p.name for p in path.parent.iterdir() if p != path]
    assert not leftovers, f"the SQLite template was not closed cleanly: {leftovers}"
    return path


def copy_sqlite_template(template: Path, target: Path) -> str:
    """Copy the migrated template to ``target`` (a new file); returns its URL."""
    target.parent.mkdir(parents=True, exist_ok=True)
    assert not target.exists(), f"{target} already exists"
    shutil.copyfile(template, target)
    return f"sqlite:///{target}"


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str) -> Iterator[str]:
    """The name of a PostgreSQL database migrated to head, with no open connection."""
    name = f"sluice_tpl_{migrations_digest()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        _migrate_and_check(f"{pg_admin_url.rsplit('/', 1)[0]}/{name}")
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def migrated_sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    """A SQLite database at head for one test (``tmp_path / 'sluice.db'``)."""
    return copy_sqlite_template(sqlite_template, tmp_path / "sluice.db")


@contextmanager
def pg_copy(admin_url: str, template: str) -> Iterator[str]:
    """A new PostgreSQL database made from ``template``; its URL, dropped at the end."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def migrated_copy(request: pytest.FixtureRequest, backend: str, folder: Path) -> Iterator[str]:
    """A database at head on ``backend`` ("sqlite": a file in ``folder``; "postgres"), for
    fixtures of any scope (a module's world) that choose their backend themselves."""
    if backend == "sqlite":
        yield copy_sqlite_template(request.getfixturevalue("sqlite_template"), folder / "sluice.db")
        return
    admin_url, template = (
        request.getfixturevalue("pg_admin_url"),
        request.getfixturevalue("pg_template"),
    )
    with pg_copy(admin_url, template) as url:
        yield url


@pytest.fixture
def migrated_pg_url(pg_admin_url: str, pg_template: str) -> Iterator[str]:
    """A PostgreSQL database at head for one test, dropped afterwards."""
    with pg_copy(pg_admin_url, pg_template) as url:
        yield url


@pytest.fixture
def migrated_db_url(request: pytest.FixtureRequest) -> str:
    """A database at head for one test: SQLite, or PostgreSQL too where the test is marked
    ``both_databases`` (``tests/conftest.py``)."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("migrated_sqlite_url"))
    return str(request.getfixturevalue("migrated_pg_url"))
