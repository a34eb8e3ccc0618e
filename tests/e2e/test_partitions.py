"""Partitions under ``sluice run`` on SQLite and PostgreSQL: an hourly
``CronPartitionTimetable`` producer backfilled for one day writes 24 keyed asset events; a
consumer on the ``IdentityMapper`` runs once per hour with that hour's key in its context,
and a daily ``RollupMapper`` consumer runs once, for the day, with the 24 events. Before the
last hour is backfilled, the day waits: ``sluice dags why`` names the missing hour and
``sluice assets partitions`` marks it missing, as an operator sees them."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import func, select

from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, Dag, DagRun, DagRunAssetEvent, TaskInstance
from tests.cli import invoke
from tests.e2e.helpers import engine_env, start_engine, stop, wait_for
from triggers.serde import deserialize_value

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
def produce(partition_key):
    return partition_key


@task
def consume(partition_key, triggering_asset_events):
    return [partition_key, sorted(e.partition_key for e in triggering_asset_events[hourly])]


with DAG(
    "producer",
    schedule=CronPartitionTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 3, 10),
    end_date=datetime(2026, 3, 11),  # over: only the backfill runs it
    max_active_runs=24,
):
    produce()

with DAG("per_hour", schedule=PartitionedAssetTimetable(assets=hourly), max_active_runs=24):
    consume()

daily = RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow())
by_day = PartitionedAssetTimetable(assets=hourly, default_partition_mapper=daily)
with DAG("per_day", schedule=by_day):
    consume()
"""

HOURS = [f"2026-03-10T{hour:02d}:00:00" for hour in range(24)]
WAITING = "2026-03-10: waiting for 1 of 24 hourly keys of asset hourly: 2026-03-10T23:00:00"


def _results(db: Database, dag_id: str) -> dict[str | None, Any]:
    """partition key -> what the run's task returned, for the DAG's successful runs."""
    rows = db.call(
        lambda s: s.execute(
            select(DagRun.partition_key, TaskInstance.xcoms)
            .join(TaskInstance, TaskInstance.dag_run_id == DagRun.id)
            .where(DagRun.dag_id == dag_id, DagRun.state == "success")
        ).all()
    )
    return {key: deserialize_value(xcoms["return_value"]) for key, xcoms in rows}


def _runs(db: Database, dag_id: str) -> int:
    query = select(func.count()).select_from(DagRun).where(DagRun.dag_id == dag_id)
    return int(db.call(lambda s: s.execute(query).scalar_one()))


@pytest.mark.parametrize("migrated_db_url", ["sqlite", "postgres"], indirect=True)
def test_a_backfilled_hourly_producer_drives_hourly_and_daily_consumers(
    migrated_db_url: str, tmp_path: Path
) -> None:
    home, dags = tmp_path / "home", tmp_path / "dags"
    for folder in (home, dags):
        folder.mkdir()
    (dags / "partitions.py").write_text(textwrap.dedent(DAGS))
    env = engine_env(home, url=migrated_db_url, dags=dags, parallelism=4)
    db = Database(migrated_db_url)
    engine = start_engine(env, tmp_path / "engine.log")
    try:
        wait_for(
            lambda: (
                db.call(lambda s: s.execute(select(func.count()).select_from(Dag))).scalar_one()
                == 3
            ),
            timeout=60,
            what="the DAG file to be parsed",
        )
        done = invoke(
            "dags", "backfill", "producer", "--from", HOURS[0], "--to", HOURS[22], env=env
        )
        assert done.returncode == 0, done.stderr
        assert "created 23 run(s)" in done.stdout, done.stdout
        wait_for(
            lambda: len(_results(db, "per_hour")) == 23,
            timeout=120,
            what="23 hourly consumer runs to succeed",
        )
        _check_the_day_waits_for_its_last_hour(env)
        assert _runs(db, "per_day") == 0
        last = HOURS[23]
        last_hour = invoke("dags", "backfill", "producer", "--from", last, "--to", last, env=env)
        assert last_hour.returncode == 0, last_hour.stderr
        assert "created 1 run(s)" in last_hour.stdout, last_hour.stdout
        wait_for(
            lambda: len(_results(db, "per_hour")) == 24 and len(_results(db, "per_day")) == 1,
            timeout=120,
            what="24 hourly consumer runs and 1 daily one to succeed",
        )
    finally:
        code = stop(engine, timeout=60)
    assert code == 0
    keys = db.call(
        lambda s: (
            s.execute(
                select(AssetEvent.partition_key)
                .join(Asset, Asset.id == AssetEvent.asset_id)
                .where(Asset.name == "hourly")
            )
            .scalars()
            .all()
        )
    )
    assert sorted(keys) == HOURS  # one keyed event per backfilled hour
    assert _results(db, "producer") == {hour: hour for hour in HOURS}
    assert _results(db, "per_hour") == {hour: [hour, [hour]] for hour in HOURS}
    assert _results(db, "per_day") == {"2026-03-10": ["2026-03-10", HOURS]}
    assert (_runs(db, "per_hour"), _runs(db, "per_day")) == (24, 1)
    consumed = db.call(
        lambda s: s.execute(
            select(func.count())
            .select_from(DagRunAssetEvent)
            .join(DagRun, DagRun.id == DagRunAssetEvent.dag_run_id)
            .where(DagRun.dag_id == "per_day")
        ).scalar_one()
    )
    assert consumed == 24
    db.dispose()


def _check_the_day_waits_for_its_last_hour(env: dict[str, str]) -> None:
    """What an operator sees while 23 of the day's hours are in: why names the missing hour,
    in JSON and text, and the partitions listing over the day marks it missing."""

    def waits() -> list[str]:
        why = invoke("dags", "why", "per_day", "--json", env=env)
        assert why.returncode == 0, why.stderr
        partitions = json.loads(why.stdout)["schedule"]["partitions"]
        return [w["message"] for w in partitions["waiting"]]

    wait_for(lambda: waits() == [WAITING], timeout=30, what="why to name 23:00")
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
