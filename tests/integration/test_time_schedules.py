"""Time schedules through the real DAG processor and scheduler, on SQLite and PostgreSQL, with
a fake clock: cron / preset / timedelta / @once / @continuous runs, catchup on and off, DST
days, max_active_runs, pause and unpause, and two schedulers that never create one interval
twice."""

from __future__ import annotations

import itertools
import textwrap
import threading
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import func, select, update

from engine.crypto import KwargsCipher
from engine.dag_processing.processor import DagProcessor, DagProcessorSettings
from engine.db.database import Database
from engine.db.models import Dag, DagRun, TaskInstance
from engine.db.queries import dags as dags_sql
from engine.db.queries import runs as runs_sql
from engine.db.queries import time_schedules
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import DagRunState, TaskState

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DAGS = """
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from engine import (
    DAG,
    Asset,
    AssetOrTimeSchedule,
    CronDataIntervalTimetable,
    CronTriggerTimetable,
    task,
)

@task
def work():
    return 1

with DAG("daily", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False):
    work()

with DAG("daily_catchup", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=True):
    work()

with DAG(
    "one_at_a_time",
    schedule="0 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=True,
    max_active_runs=1,
):
    work()

with DAG(
    "hourly_new_york",
    schedule="0 * * * *",
    start_date=datetime(2026, 11, 1, tzinfo=ZoneInfo("America/New_York")),
    end_date=datetime(2026, 11, 1, 23, 59, tzinfo=ZoneInfo("America/New_York")),
    catchup=True,
    max_active_runs=30,
):
    work()

with DAG(
    "spring_new_york",
    schedule="30 2 * * *",
    start_date=datetime(2026, 3, 7, tzinfo=ZoneInfo("America/New_York")),
    end_date=datetime(2026, 3, 9, 12, tzinfo=ZoneInfo("America/New_York")),
    catchup=True,
):
    work()

with DAG(
    "every_6h",
    schedule=timedelta(hours=6),
    start_date=datetime(2026, 1, 1),
    catchup=True,
    end_date=datetime(2026, 1, 2),
):
    work()

with DAG(
    "intervals",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
):
    work()

with DAG("once", schedule="@once", start_date=datetime(2026, 1, 3)):
    work()

with DAG("continuous", schedule="@continuous", start_date=datetime(2026, 1, 1)):
    work()

with DAG(
    "hourly_held",
    schedule="0 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
):
    work()

with DAG(
    "assets_or_time",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 6 * * *", timezone="UTC"), assets=Asset("landing")
    ),
    start_date=datetime(2026, 1, 1),
):
    work()
"""

NOW = datetime(2026, 1, 5, 10, 30, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path) -> Iterator[tuple[Database, KwargsCipher]]:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "timed.py").write_text(textwrap.dedent(DAGS))
    db = Database(migrated_db_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    from engine.config import load_config

    config = load_config(
        environ={"SLUICE_HOME": str(tmp_path / "home"), "SLUICE__CORE__DAGS_FOLDER": str(dags)}
    )
    processor = DagProcessor(
        db=db, cipher=cipher, settings=DagProcessorSettings.from_config(config)
    )
    anyio.run(processor.parse_once)
    errors = db.call(dags_sql.list_parse_errors)
    assert errors == [], errors
    yield db, cipher
    db.dispose()


def _scheduler(db: Database, cipher: KwargsCipher, clock: Clock) -> Scheduler:
    return Scheduler(db=db, cipher=cipher, settings=SchedulerSettings(), clock=clock)


def _loop(scheduler: Scheduler, times: int = 1) -> None:
    for _ in range(times):
        anyio.run(scheduler.schedule_once)


def _logical_dates(db: Database, dag_id: str) -> list[datetime]:
    def read(session: Any) -> list[datetime]:
        rows = session.execute(
            select(DagRun.logical_date)
            .where(DagRun.dag_id == dag_id, DagRun.run_type == runs_sql.SCHEDULED)
            .order_by(DagRun.logical_date)
        )
        return list(rows.scalars())

    return db.call(read)


def _finish_runs(db: Database, dag_id: str) -> None:
    """Stand in for the executor: every task of the DAG's running runs succeeds."""

    def write(session: Any) -> None:
        running = select(DagRun.id).where(
            DagRun.dag_id == dag_id, DagRun.state == DagRunState.RUNNING
        )
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.dag_run_id.in_(running))
            .values(state=TaskState.SUCCESS)
        )

    db.call(write)


def _only(db: Database, *keep: str) -> None:
    """Pause every DAG but ``keep`` (so a test reads only the DAGs it is about)."""
    db.call(lambda s: s.execute(update(Dag).where(Dag.dag_id.not_in(keep)).values(is_paused=True)))


def test_catchup_off_runs_the_latest_tick_then_each_new_one(env) -> None:
    db, cipher = env
    _only(db, "daily")
    clock = Clock(NOW)
    scheduler = _scheduler(db, cipher, clock)
    _loop(scheduler, 3)
    # Started on Jan 1 but deployed on Jan 5 at 10:30: only the latest tick runs (Airflow 3).
    assert _logical_dates(db, "daily") == [datetime(2026, 1, 5, tzinfo=UTC)]
    run = db.call(lambda s: s.execute(select(DagRun).where(DagRun.dag_id == "daily")).scalar_one())
    assert run.run_id == "scheduled__2026-01-05T00:00:00+00:00"
    assert run.run_after == run.logical_date == run.data_interval_start == run.data_interval_end
    clock.now = datetime(2026, 1, 5, 23, 59, tzinfo=UTC)
    _loop(scheduler)
    assert len(_logical_dates(db, "daily")) == 1
    clock.now = datetime(2026, 1, 6, 0, 0, 1, tzinfo=UTC)
    _loop(scheduler, 2)
    assert _logical_dates(db, "daily") == [
        datetime(2026, 1, 5, tzinfo=UTC),
        datetime(2026, 1, 6, tzinfo=UTC),
    ]


@pytest.mark.both_databases
def test_catchup_on_creates_every_missed_interval_once(env) -> None:
    db, cipher = env
    _only(db, "daily_catchup")
    scheduler = _scheduler(db, cipher, Clock(NOW))
    _loop(scheduler, 8)
    assert _logical_dates(db, "daily_catchup") == [
        datetime(2026, 1, day, tzinfo=UTC) for day in range(1, 6)
    ]


def test_max_active_runs_holds_the_next_interval_until_a_run_ends(env) -> None:
    db, cipher = env
    _only(db, "one_at_a_time")
    scheduler = _scheduler(db, cipher, Clock(datetime(2026, 1, 1, 3, 30, tzinfo=UTC)))
    _loop(scheduler, 4)
    assert _logical_dates(db, "one_at_a_time") == [datetime(2026, 1, 1, tzinfo=UTC)]
    for hour in range(1, 4):
        _finish_runs(db, "one_at_a_time")
        _loop(scheduler, 2)
        assert _logical_dates(db, "one_at_a_time")[-1] == datetime(2026, 1, 1, hour, tzinfo=UTC)
    assert len(_logical_dates(db, "one_at_a_time")) == 4


def test_hourly_on_the_fall_back_day_runs_every_real_hour(env) -> None:
    db, cipher = env
    _only(db, "hourly_new_york")
    scheduler = _scheduler(db, cipher, Clock(datetime(2026, 11, 3, tzinfo=UTC)))
    _loop(scheduler, 30)
    dates = _logical_dates(db, "hourly_new_york")
    assert len(dates) == 25  # 2026-11-01 has 25 hours in New York
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(dates))
    assert dates[0] == datetime(2026, 11, 1, 4, tzinfo=UTC)  # midnight EDT


def test_daily_at_a_time_the_spring_forward_skips_runs_after_the_gap(env) -> None:
    db, cipher = env
    _only(db, "spring_new_york")
    scheduler = _scheduler(db, cipher, Clock(datetime(2026, 3, 10, tzinfo=UTC)))
    _loop(scheduler, 5)
    assert _logical_dates(db, "spring_new_york") == [
        datetime(2026, 3, 7, 7, 30, tzinfo=UTC),  # 02:30 EST
        datetime(2026, 3, 8, 7, 30, tzinfo=UTC),  # 02:30 does not exist: 03:30 EDT
        datetime(2026, 3, 9, 6, 30, tzinfo=UTC),  # 02:30 EDT
    ]


def test_timedelta_schedule_and_end_date(env) -> None:
    db, cipher = env
    _only(db, "every_6h")
    scheduler = _scheduler(db, cipher, Clock(NOW))
    _loop(scheduler, 8)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert _logical_dates(db, "every_6h") == [start + timedelta(hours=6 * i) for i in range(5)]


def test_data_interval_timetable_runs_the_interval_that_just_ended(env) -> None:
    db, cipher = env
    _only(db, "intervals")
    scheduler = _scheduler(db, cipher, Clock(NOW))
    _loop(scheduler, 2)
    run = db.call(
        lambda s: s.execute(select(DagRun).where(DagRun.dag_id == "intervals")).scalar_one()
    )
    assert run.logical_date == run.data_interval_start == datetime(2026, 1, 4, tzinfo=UTC)
    assert run.data_interval_end == run.run_after == datetime(2026, 1, 5, tzinfo=UTC)


def test_once_runs_once_and_continuous_runs_one_after_another(env) -> None:
    db, cipher = env
    _only(db, "once", "continuous")
    clock = Clock(NOW)
    scheduler = _scheduler(db, cipher, clock)
    _loop(scheduler, 3)
    assert _logical_dates(db, "once") == [datetime(2026, 1, 3, tzinfo=UTC)]
    assert len(_logical_dates(db, "continuous")) == 1
    for expected in (2, 3):
        _finish_runs(db, "continuous")
        clock.now += timedelta(seconds=1)
        _loop(scheduler, 2)
        assert len(_logical_dates(db, "continuous")) == expected
    assert _logical_dates(db, "once") == [datetime(2026, 1, 3, tzinfo=UTC)]


def test_paused_dag_creates_no_runs_and_unpause_runs_only_the_latest(env) -> None:
    db, cipher = env
    _only(db, "daily")
    clock = Clock(NOW)
    scheduler = _scheduler(db, cipher, clock)
    _loop(scheduler)
    assert db.call(lambda s: dags_sql.set_paused(s, "daily", paused=True))
    clock.now = NOW + timedelta(days=5)
    _loop(scheduler, 2)
    assert _logical_dates(db, "daily") == [datetime(2026, 1, 5, tzinfo=UTC)]
    assert db.call(lambda s: dags_sql.set_paused(s, "daily", paused=False))
    _loop(scheduler, 3)
    assert _logical_dates(db, "daily") == [
        datetime(2026, 1, 5, tzinfo=UTC),
        datetime(2026, 1, 10, tzinfo=UTC),
    ]


def test_manual_runs_wait_for_max_active_runs(env) -> None:
    db, cipher = env
    _only(db, "one_at_a_time")
    db.call(
        lambda s: s.execute(update(Dag).where(Dag.dag_id == "one_at_a_time").values(timetable=None))
    )
    scheduler = _scheduler(db, cipher, Clock(NOW))
    for i in range(3):
        db.call(
            lambda s, i=i: runs_sql.create_run(
                s, "one_at_a_time", run_type=runs_sql.MANUAL, now=NOW - timedelta(seconds=3 - i)
            )
        )
    _loop(scheduler, 2)

    def states(session: Any) -> list[str]:
        rows = session.execute(
            select(DagRun.state).where(DagRun.dag_id == "one_at_a_time").order_by(DagRun.id)
        )
        return list(rows.scalars())

    assert db.call(states) == [DagRunState.RUNNING, DagRunState.QUEUED, DagRunState.QUEUED]
    _finish_runs(db, "one_at_a_time")
    _loop(scheduler, 2)  # the first run ends, then the next one is admitted
    assert db.call(states)[0] == DagRunState.SUCCESS
    assert db.call(states).count(DagRunState.RUNNING) == 1


@pytest.mark.parametrize("migrated_db_url", ["postgres"], indirect=True)
def test_two_schedulers_never_create_one_interval_twice(env) -> None:
    db, cipher = env
    _only(db, "daily_catchup", "every_6h")
    clock = Clock(NOW)
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            scheduler = _scheduler(db, cipher, clock)
            _loop(scheduler, 12)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=loop) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not errors, errors

    def counts(session: Any) -> list[tuple[str, int, int]]:
        rows = session.execute(
            select(
                DagRun.dag_id,
                func.count(),
                func.count(func.distinct(DagRun.logical_date)),
            ).group_by(DagRun.dag_id)
        )
        return sorted((str(d), int(n), int(u)) for d, n, u in rows)

    assert db.call(counts) == [("daily_catchup", 5, 5), ("every_6h", 5, 5)]


def test_asset_or_time_schedule_runs_on_whichever_comes(env) -> None:
    db, cipher = env
    _only(db, "assets_or_time")
    clock = Clock(NOW)  # Jan 5, 10:30: the 06:00 tick of the day has passed
    scheduler = _scheduler(db, cipher, clock)
    _loop(scheduler, 2)
    assert _logical_dates(db, "assets_or_time") == [datetime(2026, 1, 5, 6, tzinfo=UTC)]

    def emit(session: Any) -> None:
        from engine.db.queries import assets

        assets.emit_asset_event(session, "landing", extra={}, source="cli", created_by="test")

    db.call(emit)
    _loop(scheduler, 2)

    def run_types(session: Any) -> list[str]:
        rows = session.execute(
            select(DagRun.run_type).where(DagRun.dag_id == "assets_or_time").order_by(DagRun.id)
        )
        return list(rows.scalars())

    assert db.call(run_types) == [runs_sql.SCHEDULED, runs_sql.ASSET_TRIGGERED]
    clock.now = datetime(2026, 1, 6, 6, 0, 1, tzinfo=UTC)
    _loop(scheduler, 2)
    assert db.call(run_types) == [runs_sql.SCHEDULED, runs_sql.ASSET_TRIGGERED, runs_sql.SCHEDULED]
    assert _logical_dates(db, "assets_or_time")[-1] == datetime(2026, 1, 6, 6, tzinfo=UTC)


def test_a_run_held_by_max_active_runs_is_not_polled_and_catchup_off_runs_the_latest(
    env,
) -> None:
    db, cipher = env
    _only(db, "hourly_held")
    clock = Clock(datetime(2026, 1, 5, 10, 30, tzinfo=UTC))
    scheduler = _scheduler(db, cipher, clock)
    _loop(scheduler, 2)
    assert _logical_dates(db, "hourly_held") == [datetime(2026, 1, 5, 10, tzinfo=UTC)]
    clock.now = datetime(2026, 1, 5, 17, 5, tzinfo=UTC)  # the 10:00 run still runs
    _loop(scheduler, 2)
    assert len(_logical_dates(db, "hourly_held")) == 1
    # Held: the DAG is not due (no transaction per loop while it waits) ...
    assert db.call(lambda s: time_schedules.dags_due_for_time_runs(s, now=clock.now)) == []
    _finish_runs(db, "hourly_held")
    _loop(scheduler, 3)
    # ... and once its run ended, catchup off runs the latest tick, not the 11:00 it held.
    assert _logical_dates(db, "hourly_held") == [
        datetime(2026, 1, 5, 10, tzinfo=UTC),
        datetime(2026, 1, 5, 17, tzinfo=UTC),
    ]
