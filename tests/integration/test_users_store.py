"""Users, tokens and sessions in the metadata database (``engine.db.queries.users``), on
SQLite and PostgreSQL, and migration 0014 both ways."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import func, inspect, select

from engine.db.database import Database
from engine.db.models import ApiToken, UiSession, utcnow
from engine.db.queries import users as q
from engine.db.schema import check_schema, migrate

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]

TABLES = {"users", "api_token", "ui_session"}


@pytest.fixture
def db(migrated_db_url: str) -> Iterator[Database]:
    database = Database(migrated_db_url)
    yield database
    database.dispose()


def _count(db: Database, model: type) -> int:
    return int(db.call(lambda s: s.execute(select(func.count()).select_from(model)).scalar_one()))


def test_migration_0014_goes_down_and_up(db: Database) -> None:
    migrate(db.engine, "0013")
    assert not TABLES & set(inspect(db.engine).get_table_names())
    migrate(db.engine)
    assert TABLES <= set(inspect(db.engine).get_table_names())
    check_schema(db.engine)


def test_deleting_a_user_deletes_its_tokens_and_sessions(db: Database) -> None:
    now = utcnow()
    user_id = db.call(
        lambda s: q.add_user(s, username="ann", role="op", password_hash="h", now=now)
    )
    db.call(
        lambda s: q.add_token(
            s, username="ann", token_hash="a" * 64, prefix="p", name=None, expires_at=None, now=now
        )
    )
    db.call(
        lambda s: q.add_session(
            s,
            user_id=user_id,
            session_hash="b" * 64,
            csrf_token="c",
            now=now,
            expires_at=now + timedelta(hours=1),
        )
    )
    with pytest.raises(q.UserError, match="exists already"):
        db.call(lambda s: q.add_user(s, username="ann", role="op", password_hash="h", now=now))
    db.call(lambda s: q.delete_user(s, "ann"))
    assert (_count(db, ApiToken), _count(db, UiSession)) == (0, 0)
    with pytest.raises(q.UserError, match="no user named 'ann'"):
        db.call(lambda s: q.delete_user(s, "ann"))


def test_token_states_and_expired_sessions(db: Database) -> None:
    now = utcnow()
    user_id = db.call(
        lambda s: q.add_user(s, username="ann", role="op", password_hash="h", now=now)
    )

    def token(digest: str, expires: timedelta | None) -> int:
        expires_at = None if expires is None else now + expires
        return int(
            db.call(
                lambda s: q.add_token(
                    s,
                    username="ann",
                    token_hash=digest,
                    prefix="p",
                    name=None,
                    expires_at=expires_at,
                    now=now,
                )
            )
        )

    live, old, gone = token("1" * 64, None), token("2" * 64, -timedelta(1)), token("3" * 64, None)
    assert db.call(lambda s: q.revoke_token(s, gone, now=now))
    assert not db.call(lambda s: q.revoke_token(s, 999, now=now))
    states = {t["id"]: t["state"] for t in db.call(lambda s: q.list_tokens(s, now=now))}
    assert states == {live: "active", old: "expired", gone: "revoked"}
    assert db.call(lambda s: q.check_token(s, "9" * 64, now=now)).state == "unknown"
    for hours in (-1, 1):
        db.call(
            lambda s, h=hours: q.add_session(
                s,
                user_id=user_id,
                session_hash=("old" if h < 0 else "new").ljust(64, "0"),
                csrf_token="c",
                now=now,
                expires_at=now + timedelta(hours=h),
            )
        )
    assert db.call(lambda s: q.check_session(s, "old".ljust(64, "0"), now=now)) is None
    assert db.call(lambda s: q.delete_expired_sessions(s, now=now)) == 1
    assert (
        db.call(lambda s: q.check_session(s, "new".ljust(64, "0"), now=now)).identity.username
        == "ann"
    )
