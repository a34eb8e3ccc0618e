"""PostgreSQL pool checkouts: a connection idle in the pool past ``PING_AFTER_IDLE_S`` is
pinged (and replaced when dead); one used again sooner costs no ping round trip."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from sqlalchemy import create_engine, text

from engine.db import database
from engine.db.database import Database

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration


@pytest.fixture
def db(pg_url: str) -> Iterator[Database]:
    db = Database(pg_url)
    yield db
    db.dispose()


def _backend_pid(db: Database) -> int:
    return int(db.call(lambda s: s.execute(text("SELECT pg_backend_pid()")).scalar_one()))


def _count_pings(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    pings: list[object] = []
    ping = db.engine.dialect.do_ping

    def counted(dbapi_conn: object) -> bool:
        pings.append(dbapi_conn)
        return ping(dbapi_conn)

    monkeypatch.setattr(db.engine.dialect, "do_ping", counted)
    return pings


def test_a_connection_used_again_at_once_is_not_pinged(db, monkeypatch) -> None:
    pings = _count_pings(db, monkeypatch)
    first = _backend_pid(db)
    assert [_backend_pid(db) for _ in range(3)] == [first] * 3
    assert pings == []


def test_a_connection_idle_past_the_threshold_is_pinged(db, monkeypatch) -> None:
    pings = _count_pings(db, monkeypatch)
    first = _backend_pid(db)
    monkeypatch.setattr(database, "PING_AFTER_IDLE_S", 0.0)
    assert _backend_pid(db) == first
    assert len(pings) == 1


def test_a_dead_idle_connection_is_replaced_without_an_error(db, pg_url, monkeypatch) -> None:
    first = _backend_pid(db)
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
    admin.dispose()
    monkeypatch.setattr(database, "PING_AFTER_IDLE_S", 0.0)
    assert _backend_pid(db) != first
