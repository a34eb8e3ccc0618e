"""``engine.db.database.write_rows``: a write runs as Core when the session holds no ORM
object, and through the session (which brings the objects it holds up to date) when it
does, so that code reading an object after the write, in the session or after it, never
sees it stale."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import event, insert, select, update

from engine.db.database import Database, rowcount, write_rows
from engine.db.models import Dag

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.orm import Session


def _pause(dag_id: str) -> Any:
    return update(Dag).where(Dag.dag_id == dag_id).values(is_paused=True)


@pytest.fixture
def db(migrated_sqlite_url: str) -> Iterator[Database]:
    database = Database(migrated_sqlite_url)
    database.call(lambda s: s.execute(insert(Dag).values(dag_id="d", fileloc="/d.py")))
    yield database
    database.dispose()


def _orm_executions(session: Session) -> list[str]:
    """The statements the session's ORM execution runs from now on."""
    seen: list[str] = []
    event.listen(session, "do_orm_execute", lambda state: seen.append(str(state.statement)))
    return seen


def test_without_objects_in_the_session_the_write_skips_the_orm(db: Database) -> None:
    def pause(session: Session) -> tuple[int, list[str]]:
        seen = _orm_executions(session)
        return rowcount(write_rows(session, _pause("d"))), seen

    matched, orm_statements = db.call(pause)
    assert (matched, orm_statements) == (1, [])
    assert db.call(lambda s: s.execute(select(Dag.is_paused)).scalar_one()) is True


def test_an_object_the_session_holds_reads_the_write(db: Database) -> None:
    def pause(session: Session) -> tuple[bool, Dag]:
        dag = session.execute(select(Dag)).scalar_one()
        assert dag.is_paused is False
        write_rows(session, _pause("d"))
        return dag.is_paused, dag

    paused, dag = db.call(pause)
    assert paused is True  # as Core the held object would still say False
    assert dag.is_paused is True  # and still readable once the session closed


def test_pending_objects_are_written_first(db: Database) -> None:
    """An object added and not flushed yet is in the database before the write runs (the
    ORM's autoflush), so the write sees it."""

    def add_and_pause(session: Session) -> int:
        session.add(Dag(dag_id="e", fileloc="/e.py"))
        return rowcount(write_rows(session, _pause("e")))

    assert db.call(add_and_pause) == 1
