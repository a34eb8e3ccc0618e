"""Partitioned DAG runs on the real scheduler and executor (SQLite; the SQL is the same on
both databases and ``test_partition_events`` covers the writes on both): a task of a
partitioned run sees its key (``partition_key``, ``dag_run.partition_key``) and writes its
outlet events with it; ``outlet_events[asset].add_partitions(...)`` writes one per key."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from engine.authoring.partition_timetables import CronPartitionTimetable, PartitionedAtRuntime
from engine.crypto import KwargsCipher
from engine.db.models import Asset, AssetEvent, AssetEventQueue, DagRun, DagRunAssetEvent, utcnow
from engine.db.queries import assets as assets_sql
from engine.db.queries import runs as runs_sql
from engine.executor.task_logs import read_task_log
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import TaskState
from tests.integration.harness import fast_executor_settings, parsed_database
from tests.integration.test_backfill import add_dag, config, db, run_cli
from tests.integration.test_time_schedules import Clock
from tests.integration.test_xcom import Env as RunEnv
from triggers.base import TaskSuccessEvent

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from engine.config import Config
    from engine.db.database import Database

pytestmark = pytest.mark.integration

__all__ = ("config", "db")  # the fixtures, used by name

HOUR_9 = "2026-03-10T09:00:00"
CIPHER = KwargsCipher(Fernet.generate_key().decode())


class Env(RunEnv):
    def log(self, run_pk: int, task_id: str) -> str:
        run = self.db.call(lambda s: s.get(DagRun, run_pk))
        return read_task_log(self.log_folder, run.dag_id, run.run_id, task_id, 1)


RUN_DAGS = """
from datetime import timedelta

from engine import DAG, Asset, BaseOperator, task
from triggers.temporal import TimeDeltaTrigger

hourly, regions, other = Asset("hourly"), Asset("regions"), Asset("other")


@task(outlets=[hourly])
def produce(partition_key, dag_run):
    return {"context": partition_key, "dag_run": dag_run.partition_key}


@task(outlets=[regions, other])
def fan_out(outlet_events):
    outlet_events[regions].add_partitions(["us", "eu"])
    outlet_events[regions].add_partitions("us")  # once each
    outlet_events[regions].extra = {"rows": 2}


@task(outlets=[hourly])
def bad_key(outlet_events):
    outlet_events[hourly].add_partitions("x" * 251)


@task(outlets=[hourly])
def not_an_outlet(outlet_events):
    outlet_events[Asset("elsewhere")].add_partitions("us")


class Waits(BaseOperator):
    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(timedelta(days=1)), method_name="done")

    def done(self, context, event):
        return None


with DAG("producer"):
    produce()

with DAG("ends_from_trigger"):
    Waits(task_id="waits", outlets=[hourly])

with DAG("runtime"):
    fan_out()

with DAG("refused"):
    bad_key()
    not_an_outlet()
"""


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path) -> Iterator[Env]:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "partitioned.py").write_text(RUN_DAGS)
    db, config, _, _ = parsed_database(migrated_db_url, tmp_path, dags)
    yield Env(db, fast_executor_settings(config), config.logging.task_log_folder)
    db.dispose()


def _keyed_events(db: Database) -> list[tuple[str, str | None, dict[str, Any]]]:
    rows = db.call(
        lambda s: s.execute(
            select(Asset.name, AssetEvent.partition_key, AssetEvent.extra)
            .join(Asset, Asset.id == AssetEvent.asset_id)
            .order_by(AssetEvent.id)
        ).all()
    )
    return [(name, key, dict(extra or {})) for name, key, extra in rows]


def _start(env: Env, dag_id: str, partition_key: str | None) -> int:
    pk = env.db.call(
        lambda s: runs_sql.create_run(
            s, dag_id, run_type=runs_sql.MANUAL, now=utcnow(), partition_key=partition_key
        )
    )
    assert pk is not None
    return pk


async def test_a_partitioned_runs_task_sees_its_key_and_emits_its_events_with_it(env) -> None:
    keyed, plain = _start(env, "producer", HOUR_9), _start(env, "producer", None)
    with anyio.fail_after(60):
        async with env.executor():
            assert await env.run_to_end(keyed) == "success"
            assert await env.run_to_end(plain) == "success"
    assert env.results(keyed, "produce")["return_value"] == {"context": HOUR_9, "dag_run": HOUR_9}
    assert env.results(plain, "produce")["return_value"] == {"context": None, "dag_run": None}
    events = _keyed_events(env.db)  # the two runs ran side by side: in either order
    assert sorted(events, key=str) == [("hourly", HOUR_9, {}), ("hourly", None, {})]


async def test_a_task_ending_from_its_trigger_emits_with_the_runs_key(env) -> None:
    run_pk = _start(env, "ends_from_trigger", HOUR_9)
    with anyio.fail_after(60):
        async with env.executor():
            tis = await env.until(run_pk, lambda t: t["waits"].state == TaskState.DEFERRED and t)
            env.fire(tis["waits"].trigger_id, TaskSuccessEvent())
            assert await env.run_to_end(run_pk) == "success"
    assert _keyed_events(env.db) == [("hourly", HOUR_9, {})]


async def test_add_partitions_writes_one_event_per_key_and_refuses_bad_ones(env) -> None:
    runtime, refused = _start(env, "runtime", None), _start(env, "refused", None)
    with anyio.fail_after(60):
        async with env.executor():
            assert await env.run_to_end(runtime) == "success"
            assert await env.run_to_end(refused) == "failed"
    assert _keyed_events(env.db) == [
        ("regions", "us", {"rows": 2}),
        ("regions", "eu", {"rows": 2}),
        ("other", None, {}),  # an outlet without add_partitions: the run's key (none)
    ]
    logs = {t: env.log(refused, t) for t in ("bad_key", "not_an_outlet")}
    assert "outlet_events['hourly'].add_partitions(): partition key 'xxx" in logs["bad_key"]
    assert "Asset 'elsewhere' is not in its outlets" in logs["not_an_outlet"]


# --- consumers on a PartitionedAssetTimetable ---------------------------------------------------

CONSUMER_DAGS = """
from engine import (
    DAG, AllowedKeyMapper, Asset, DayWindow, FanOutMapper, PartitionedAssetTimetable,
    RollupMapper, StartOfDayMapper, task,
)

hourly, regions = Asset("hourly"), Asset("regions")
days, checks = Asset("days"), Asset("checks")


@task
def consume(partition_key, dag_run, triggering_asset_events):
    return {
        "key": partition_key,
        "dag_run": dag_run.partition_key,
        "events": [e.partition_key for e in triggering_asset_events[hourly]],
    }


with DAG("per_hour", schedule=PartitionedAssetTimetable(assets=hourly)):
    consume()

daily = RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow())
by_day = PartitionedAssetTimetable(assets=hourly, default_partition_mapper=daily)
with DAG("per_day", schedule=by_day):
    consume()

# A day's event fans out to its 24 hours; each hour also needs its own event of "checks".
hours_of_day = FanOutMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow())
with DAG(
    "day_and_hour",
    schedule=PartitionedAssetTimetable(
        assets=days & checks, partition_mapper_config={days: hours_of_day}
    ),
):
    consume.override(task_id="both")()

with DAG(
    "us_only",
    schedule=PartitionedAssetTimetable(
        assets=regions, default_partition_mapper=AllowedKeyMapper(["us"])
    ),
):
    consume.override(task_id="region")()
"""

HOURS = [f"2026-03-10T{hour:02d}:00:00" for hour in range(24)]


@pytest.fixture
def consumers(migrated_db_url: str, tmp_path: Path) -> Iterator[Env]:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "consumers.py").write_text(CONSUMER_DAGS)
    db, config, _, _ = parsed_database(migrated_db_url, tmp_path, dags)
    yield Env(db, fast_executor_settings(config), config.logging.task_log_folder)
    db.dispose()


def _emit(db: Database, asset: str, key: str | None) -> int:
    return db.call(
        lambda s: assets_sql.emit_asset_event(
            s, asset, extra=None, source="cli", created_by="test", partition_key=key
        )
    )


def _runs_by_key(db: Database, dag_id: str) -> dict[str | None, list[int]]:
    def read(session: Any) -> dict[str | None, list[int]]:
        out: dict[str | None, list[int]] = {}
        query = select(DagRun.id, DagRun.partition_key).where(DagRun.dag_id == dag_id)
        for run_pk, key in session.execute(query.order_by(DagRun.id)).all():
            events = session.execute(
                select(DagRunAssetEvent.asset_event_id).where(DagRunAssetEvent.dag_run_id == run_pk)
            ).scalars()
            out.setdefault(key, []).extend(sorted(events))
        return out

    return db.call(read)


def _queued(db: Database, dag_id: str) -> list[int]:
    query = select(AssetEventQueue.asset_event_id).where(AssetEventQueue.dag_id == dag_id)
    return sorted(db.call(lambda s: s.execute(query).scalars().all()))


def test_an_identity_consumer_runs_once_per_key_and_a_daily_rollup_after_the_24th_hour(
    consumers: Env,
) -> None:
    db, scheduler = consumers.db, consumers.scheduler
    events = {key: _emit(db, "hourly", key) for key in HOURS[:23]}
    anyio.run(scheduler.schedule_once)
    per_hour = _runs_by_key(db, "per_hour")
    assert per_hour == {key: [event] for key, event in events.items()}
    assert _runs_by_key(db, "per_day") == {}  # waiting for 23:00
    assert _queued(db, "per_day") == sorted(events.values())  # kept while it waits
    anyio.run(scheduler.schedule_once)
    assert _runs_by_key(db, "per_hour") == per_hour  # consumed events make no second run

    events[HOURS[23]] = _emit(db, "hourly", HOURS[23])
    anyio.run(scheduler.schedule_once)
    assert _runs_by_key(db, "per_day") == {"2026-03-10": sorted(events.values())}
    assert len(_runs_by_key(db, "per_hour")) == 24
    assert _queued(db, "per_day") == _queued(db, "per_hour") == []


def test_a_fanned_out_event_serves_each_of_its_keys_once(consumers: Env) -> None:
    db, scheduler = consumers.db, consumers.scheduler  # the fan-out's keys: "%Y-%m-%dT%H"
    day = _emit(db, "days", HOURS[0])  # a day, named by its first hour
    nine = _emit(db, "checks", "2026-03-10T09")
    anyio.run(scheduler.schedule_once)
    assert _runs_by_key(db, "day_and_hour") == {"2026-03-10T09": sorted([day, nine])}
    assert _queued(db, "day_and_hour") == [day]  # the other 23 hours still wait on it
    anyio.run(scheduler.schedule_once)
    assert len(_runs_by_key(db, "day_and_hour")) == 1  # 09:00 never runs on it twice
    ten = _emit(db, "checks", "2026-03-10T10")
    anyio.run(scheduler.schedule_once)
    assert _runs_by_key(db, "day_and_hour")["2026-03-10T10"] == sorted([day, ten])
    again = _emit(db, "checks", "2026-03-10T09")  # 09:00's day event is spent: it waits
    anyio.run(scheduler.schedule_once)
    assert set(_runs_by_key(db, "day_and_hour")) == {"2026-03-10T09", "2026-03-10T10"}
    assert _queued(db, "day_and_hour") == sorted([day, again])


def test_events_a_partitioned_dag_cannot_use_are_logged_once_and_dropped(
    consumers: Env, caplog: pytest.LogCaptureFixture
) -> None:
    db, scheduler = consumers.db, consumers.scheduler
    unkeyed, europe = _emit(db, "regions", None), _emit(db, "regions", "eu")
    us = _emit(db, "regions", "us")
    with caplog.at_level(logging.WARNING, logger="engine.scheduler.partition_runs"):
        anyio.run(scheduler.schedule_once)
        anyio.run(scheduler.schedule_once)
    assert _runs_by_key(db, "us_only") == {"us": [us]}
    refused = [r for r in caplog.records if getattr(r, "action", "") == "partition_event_refused"]
    assert sorted(r.asset_event_id for r in refused) == [unkeyed, europe]  # once each
    reasons = {r.asset_event_id: r.getMessage() for r in refused}
    assert "us_only" in reasons[europe] and "'eu'" in reasons[europe]
    assert "partition key" in reasons[unkeyed]
    assert _queued(db, "us_only") == []


async def test_each_consumer_run_sees_its_key_and_its_events(consumers: Env) -> None:
    for key in HOURS[:2]:
        _emit(consumers.db, "hourly", key)
    await consumers.scheduler.schedule_once()
    runs = _runs_by_key(consumers.db, "per_hour")
    pks = consumers.db.call(
        lambda s: dict(
            s.execute(
                select(DagRun.partition_key, DagRun.id).where(DagRun.dag_id == "per_hour")
            ).all()
        )
    )
    with anyio.fail_after(60):
        async with consumers.executor():
            for key in runs:
                assert await consumers.run_to_end(pks[key]) == "success"
    for key in HOURS[:2]:
        assert consumers.results(pks[key], "consume")["return_value"] == {
            "key": key,
            "dag_run": key,
            "events": [key],
        }


# --- time runs, manual runs -------------------------------------------------------------------


def test_time_runs_of_a_cron_partition_timetable_carry_their_keys(db: Database) -> None:
    hourly = CronPartitionTimetable("0 * * * *", timezone="UTC", run_offset=-1)
    start = datetime(2026, 3, 10, tzinfo=UTC)
    add_dag(db, "hourly", timetable=hourly, start_date=start, catchup=True)
    add_dag(db, "daily")  # an ordinary time schedule: runs without a key
    clock = Clock(datetime(2026, 3, 10, 2, 30, tzinfo=UTC))
    scheduler = Scheduler(db=db, cipher=CIPHER, settings=SchedulerSettings(), clock=clock)
    for _ in range(4):
        anyio.run(scheduler.schedule_once)
    rows = db.call(
        lambda s: s.execute(
            select(DagRun.dag_id, DagRun.logical_date, DagRun.partition_key).order_by(DagRun.id)
        ).all()
    )
    keyed = [(date.hour, key) for dag, date, key in rows if dag == "hourly"]
    # Each run processes the hour before its tick (run_offset=-1).
    assert keyed == [
        (0, "2026-03-09T23:00:00"),
        (1, "2026-03-10T00:00:00"),
        (2, "2026-03-10T01:00:00"),
    ]
    assert {key for dag, _, key in rows if dag == "daily"} == {None}


def test_a_manual_run_of_any_dag_takes_a_valid_partition_key(db: Database, config: Config) -> None:
    """As in Airflow: Airflow's own example triggers a DAG with ``schedule=None`` with a
    region code as its key."""
    add_dag(db, "runtime", timetable=PartitionedAtRuntime())
    add_dag(db, "daily")
    result = run_cli(config, "dags", "trigger", "runtime", "--partition-key", "us", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["partition_key"] == "us"
    unpartitioned = run_cli(config, "dags", "trigger", "daily", "--partition-key", "eu")
    assert unpartitioned.exit_code == 0, unpartitioned.output
    keys = db.call(lambda s: s.execute(select(DagRun.partition_key)).scalars().all())
    assert sorted(keys) == ["eu", "us"]
    too_long = run_cli(config, "dags", "trigger", "runtime", "--partition-key", "k" * 251)
    assert too_long.exit_code == 1 and "more than the 250" in too_long.stderr
    assert len(db.call(lambda s: s.execute(select(DagRun.id)).all())) == 2
