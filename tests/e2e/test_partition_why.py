"""Partitions seen by an operator under ``sluice run`` on SQLite and PostgreSQL: an hourly
``CronPartitionTimetable`` producer backfilled for 23 hours of a day leaves its daily
``RollupMapper`` consumer waiting, and ``sluice dags why`` names the missing hour while
``sluice assets partitions`` marks it missing; the 24th hour's event then runs the day."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import func, select

from engine.db.database import Database
from engine.db.models import Dag, DagRun, TaskInstance
from tests.cli import invoke
from tests.e2e.helpers import engine_env, start_engine, stop, wait_for

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

DAGS = """
from datetime import datetime

from engine import (
    DAG, Asset, CronPartitionTimetable, DayWindow, PartitionedAssetTimetable, RollupMapper,
    StartOfDayMapper, task,
)

hourly = Asset("hourly")


@task(outlets=[hourly])
def produce():
    return 1


@task
def consume(partition_key):
    return partition_key


with DAG(
    "producer",
    schedule=CronPartitionTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 3, 10),
    end_date=datetime(2026, 3, 11),  # over: only the backfill runs it
    max_active_runs=23,
):
    produce()

daily = RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow())
by_day = PartitionedAssetTimetable(assets=hourly, default_partition_mapper=daily)
with DAG("per_day", schedule=by_day):
    consume()
"""

HOURS = [f"2026-03-10T{hour:02d}:00:00" for hour in range(24)]
WAITING = "2026-03-10: waiting for 1 of 24 hourly keys of asset hourly: 2026-03-10T23:00:00"


def _count(db: Database, dag_id: str, state: str) -> int:
    query = (
        select(func.count())
        .select_from(DagRun)
        .where(DagRun.dag_id == dag_id, DagRun.state == state)
    )
    return int(db.call(lambda s: s.execute(query).scalar_one()))


@pytest.mark.parametrize("migrated_db_url", ["sqlite", "postgres"], indirect=True)
def test_why_names_the_missing_hour_until_it_arrives(migrated_db_url: str, tmp_path: Path) -> None:
    home, dags = tmp_path / "home", tmp_path / "dags"
    for folder in (home, dags):
        folder.mkdir()
    (dags / "partitions.py").write_text(textwrap.dedent(DAGS))
    env = engine_env(home, url=migrated_db_url, dags=dags, parallelism=4)
    db = Database(migrated_db_url)
    engine = start_engine(env, tmp_path / "engine.log")
    try:
        count_dags = select(func.count()).select_from(Dag)
        wait_for(
            lambda: db.call(lambda s: s.execute(count_dags).scalar_one()) == 2,
            timeout=60,
            what="the DAG file to be parsed",
        )
        done = invoke(
            "dags", "backfill", "producer", "--from", HOURS[0], "--to", HOURS[22], env=env
        )
        assert done.returncode == 0, done.stderr
        wait_for(
            lambda: _count(db, "producer", "success") == 23,
            timeout=120,
            what="23 hourly producer runs to succeed",
        )

        def waits() -> list[str]:
            why = invoke("dags", "why", "per_day", "--json", env=env)
            assert why.returncode == 0, why.stderr
            partitions = json.loads(why.stdout)["schedule"]["partitions"]
            return [w["message"] for w in partitions["waiting"]]

        wait_for(lambda: waits() == [WAITING], timeout=30, what="why to name 23:00")
        assert _count(db, "per_day", "success") + _count(db, "per_day", "running") == 0
        text = invoke("dags", "why", "per_day", env=env)
        assert WAITING in text.stdout, text.stdout
        shown = invoke(
            "assets", "partitions", "hourly", "--from", HOURS[0], "--to", HOURS[23], "--json",
            env=env,
        )  # fmt: skip
        listed = json.loads(shown.stdout)
        assert listed["range"] == {
            "start": "2026-03-10T00:00:00+00:00",
            "end": "2026-03-10T23:00:00+00:00",
            "expected": 24,
            "missing": 1,
        }
        assert [r["partition_key"] for r in listed["items"] if r["missing"]] == [HOURS[23]]

        emitted = invoke("assets", "emit", "hourly", "--partition-key", HOURS[23], env=env)
        assert emitted.returncode == 0, emitted.stderr
        wait_for(
            lambda: _count(db, "per_day", "success") == 1,
            timeout=60,
            what="the day's rollup run to succeed",
        )
    finally:
        code = stop(engine, timeout=60)
    assert code == 0
    keys = db.call(
        lambda s: s.execute(
            select(DagRun.partition_key, TaskInstance.state)
            .join(TaskInstance, TaskInstance.dag_run_id == DagRun.id)
            .where(DagRun.dag_id == "per_day")
        ).all()
    )
    assert keys == [("2026-03-10", "success")]
    db.dispose()
