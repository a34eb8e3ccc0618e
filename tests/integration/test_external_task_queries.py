"""``engine.db.queries.external_tasks`` on SQLite and PostgreSQL: what the triggerer reads for
ExternalTaskSensor (run states, task states of ids and of a task group, existence), matched
by logical date; and the triggerer's reader over it."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import insert, select, update

from engine.authoring.external_task_trigger import ExternalQuery
from engine.db import models
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import runs
from engine.db.queries.external_tasks import read_external_states
from engine.triggerer.metadata import DatabaseMetadataReader
from tests.integration.harness import parsed_database

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

D1 = datetime(2026, 3, 1, tzinfo=UTC)
D2 = datetime(2026, 3, 2, tzinfo=UTC)
D3 = datetime(2026, 3, 3, tzinfo=UTC)

UPSTREAM = """
from engine import DAG, EmptyOperator, TaskGroup

with DAG("up"):
    EmptyOperator(task_id="load")
    with TaskGroup("g_1"):
        EmptyOperator(task_id="a")
        EmptyOperator(task_id="b")
    EmptyOperator(task_id="gx1.c")  # looks like the group g_1 to a careless LIKE
"""


@pytest.fixture
def db(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "up.py").write_text(textwrap.dedent(UPSTREAM))
    parsed = parsed_database(migrated_db_url, tmp_path, dags)
    yield parsed.db
    parsed.db.dispose()


def make_run(db: Any, logical_date: datetime, run_state: str, **states: str) -> None:
    def create(session: Any) -> None:
        pk = runs.create_run(
            session, "up", run_type=runs.MANUAL, now=models.utcnow(), logical_date=logical_date
        )
        session.execute(update(DagRun).where(DagRun.id == pk).values(state=run_state))
        for task_id, state in states.items():
            session.execute(
                update(TaskInstance)
                .where(TaskInstance.dag_run_id == pk, TaskInstance.task_id == task_id)
                .values(state=state)
            )

    db.call(create)


def read(db: Any, query: ExternalQuery) -> Any:
    return db.call(lambda s: read_external_states(s, query), read_only=True)


@pytest.mark.both_databases
def test_task_ids_are_matched_by_logical_date(db: Any) -> None:
    make_run(db, D1, "success", load="success")
    make_run(db, D2, "running", load="failed")
    found = read(db, ExternalQuery("up", (D1, D2, D3), task_ids=("load", "nope")))
    assert found.dag_exists and found.known_task_ids == {"load"}
    assert found.run_states == {D1: "success", D2: "running"}  # no run at D3
    assert found.task_states == {D1: {"load": "success"}, D2: {"load": "failed"}}


def test_a_task_group_is_its_prefixed_tasks(db: Any) -> None:
    make_run(db, D1, "running", **{"g_1.a": "success", "gx1.c": "failed"})
    found = read(db, ExternalQuery("up", (D1,), task_group_id="g_1"))
    assert found.known_task_ids == {"g_1.a", "g_1.b"}
    assert found.task_states == {D1: {"g_1.a": "success", "g_1.b": "none"}}


def test_a_whole_run_and_an_unknown_dag(db: Any) -> None:
    make_run(db, D1, "failed")
    assert read(db, ExternalQuery("up", (D1,))).run_states == {D1: "failed"}
    missing = read(db, ExternalQuery("nowhere", (D1,), task_ids=("x",)))
    assert not missing.dag_exists and missing.known_task_ids == frozenset()


async def test_the_triggerers_reader_runs_the_query(db: Any) -> None:
    make_run(db, D2, "success", load="success")
    reader = DatabaseMetadataReader(db)
    found = await reader.external_states(ExternalQuery("up", (D2,), task_ids=("load",)))
    assert found.task_states == {D2: {"load": "success"}}


def _add_copies(db: Any, logical_date: datetime, task_id: str, *states: str) -> None:
    """Make ``task_id`` of the run at ``logical_date`` a mapped task's copies in ``states``."""

    def write(session: Any) -> None:
        pk = session.execute(
            select(DagRun.id).where(DagRun.dag_id == "up", DagRun.logical_date == logical_date)
        ).scalar_one()
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.dag_run_id == pk, TaskInstance.task_id == task_id)
            .values(map_index=0, state=states[0])
        )
        session.execute(
            insert(TaskInstance),
            [
                {"dag_run_id": pk, "dag_id": "up", "task_id": task_id, "map_index": i, "state": s}
                for i, s in enumerate(states[1:], start=1)
            ],
        )

    db.call(write)


@pytest.mark.parametrize(
    ("copies", "seen"),
    [
        (("success", "running", "success"), "running"),  # not done while one copy runs
        (("running", "success", "failed"), "failed"),  # a failed copy is seen at once
        (("skipped", "skipped"), "skipped"),
        (("success", "skipped", "success"), "success"),
    ],
)
@pytest.mark.both_databases
def test_a_mapped_task_is_seen_through_all_its_copies(
    db: Any, copies: tuple[str, ...], seen: str
) -> None:
    make_run(db, D1, "running")
    _add_copies(db, D1, "load", *copies)
    found = read(db, ExternalQuery("up", (D1,), task_ids=("load",)))
    assert found.task_states == {D1: {"load": seen}}
