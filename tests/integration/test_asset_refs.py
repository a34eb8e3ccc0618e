"""``Asset.ref(name=...)`` through the real DAG processor (in-process parse), scheduler and
executor: file A declares the asset and updates it, file B is scheduled on a reference to it
and runs on its event; the reference declares nothing (no uri clash with A's declaration); a
reference to an asset no file declares parses, the DAG waits and ``why`` says so, and the
DAG gets its schedule edge once a file declares the asset."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import select

from engine.db import models
from engine.db.models import Asset, DagRun
from engine.db.queries import dags as dags_sql
from engine.db.queries import runs
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.views.why import explain_dag
from tests.integration.harness import (
    fast_executor_settings,
    parse_in_process,
    parsed_database,
    running_executor,
)
from tests.waiting import eventually

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

PRODUCER = """
from engine import DAG, Asset, EmptyOperator

stats = Asset("team_b_player_stats", uri="s3://stats/team_b")
with DAG("producer"):
    EmptyOperator(task_id="write", outlets=[stats])
"""

CONSUMER = """
from engine import DAG, Asset, EmptyOperator

with DAG("consumer", schedule=Asset.ref(name="team_b_player_stats")):
    EmptyOperator(task_id="read")

with DAG("waiting", schedule=Asset.ref(name="not_declared_yet") | Asset.ref(name="nor_this")):
    EmptyOperator(task_id="read")
"""

LATE = """
from engine import Asset

late = Asset("not_declared_yet", uri="s3://late")
"""


def _runs(session: Any, dag_id: str) -> list[tuple[str, str]]:
    rows = session.execute(
        select(DagRun.run_type, DagRun.state).where(DagRun.dag_id == dag_id).order_by(DagRun.id)
    ).all()
    return [(str(kind), str(state)) for kind, state in rows]


def _edges(session: Any) -> set[tuple[str, str]]:
    names = {int(pk): str(name) for pk, name in session.execute(select(Asset.id, Asset.name))}
    return {(dag_id, names[pk]) for dag_id, pk in dags_sql.load_schedule_edges(session)}


@pytest.mark.both_databases
async def test_a_dag_scheduled_on_a_ref_runs_on_the_asset_declared_elsewhere(
    migrated_db_url: str, tmp_path: Path
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "a_producer.py").write_text(textwrap.dedent(PRODUCER))
    (dags / "b_consumer.py").write_text(textwrap.dedent(CONSUMER))
    db, config, cipher, _ = parsed_database(migrated_db_url, tmp_path, dags)  # no parse errors
    try:
        assets = db.call(lambda s: dict(s.execute(select(Asset.name, Asset.uri)).all()))
        assert assets == {"team_b_player_stats": "s3://stats/team_b"}  # refs declare nothing
        assert db.call(_edges) == {("consumer", "team_b_player_stats")}
        scheduler = Scheduler(db=db, cipher=cipher, settings=SchedulerSettings())
        producer = db.call(
            lambda s: runs.create_run(s, "producer", run_type=runs.MANUAL, now=models.utcnow())
        )
        assert producer is not None

        async def consumer_ended() -> list[tuple[str, str]] | None:
            await scheduler.schedule_once()
            found = await db.run(lambda s: _runs(s, "consumer"))
            return found if found and found[0][1] in ("success", "failed") else None

        with anyio.fail_after(120):
            async with running_executor(db, cipher, fast_executor_settings(config)):
                consumer = await eventually(consumer_ended, within=90, step=0.05)
        assert consumer == [("asset_triggered", "success")]
        assert db.call(lambda s: _runs(s, "waiting")) == []

        view = db.call(lambda s: explain_dag(s, "waiting", now=models.utcnow()), read_only=True)
        assert view["schedule"]["text"] == "assets not_declared_yet | nor_this"
        assert view["schedule"]["assets"]["missing"] == "not_declared_yet or nor_this"
        entries = {entry["name"]: entry for entry in view["assets"]}
        assert set(entries) == {"not_declared_yet", "nor_this"}
        for entry in entries.values():
            assert (entry["known"], entry["satisfied"]) == (False, False)
            assert entry["cause"] == "it is not in the database: no DAG file declares it"

        (dags / "c_late.py").write_text(textwrap.dedent(LATE))
        report = parse_in_process(db, cipher, dags)
        assert not report.errors, report
        assert db.call(_edges) == {
            ("consumer", "team_b_player_stats"),
            ("waiting", "not_declared_yet"),
        }
    finally:
        db.dispose()
