"""``sluice dags backfill DAG --partitions K1,K2`` (and ``--from/--to`` on a
``CronPartitionTimetable``) on SQLite and PostgreSQL: one run per key, exactly once,
resumed after a killed command, refused for keys the DAG's schedule does not write."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select, update

from engine.authoring.partition_timetables import CronPartitionTimetable, PartitionedAtRuntime
from engine.db.models import Backfill, DagRun
from engine.db.queries import backfills
from engine.scheduler import backfills as backfill_rules
from tests.integration.test_backfill import add_dag, backfill_rows, config, db, run_cli

if TYPE_CHECKING:
    from engine.config import Config
    from engine.db.database import Database

pytestmark = pytest.mark.integration

__all__ = ("config", "db")  # the fixtures, used by name

HOURLY = CronPartitionTimetable("0 * * * *", timezone="UTC")
KEYS = [f"2025-01-01T{hour:02d}:00:00" for hour in range(24)]


def _runs(db: Database, dag_id: str) -> list[tuple[str | None, str, datetime | None]]:
    query = (
        select(DagRun.partition_key, DagRun.run_id, DagRun.logical_date)
        .where(DagRun.dag_id == dag_id)
        .order_by(DagRun.partition_key)
    )
    return [tuple(row) for row in db.call(lambda s: s.execute(query).all())]


def _json(config: Config, *args: str) -> dict[str, Any]:
    result = run_cli(config, "dags", "backfill", *args, "--json")
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


@pytest.mark.both_databases
def test_runtime_keys_get_one_run_each_exactly_once(db: Database, config: Config) -> None:
    add_dag(db, "runtime", timetable=PartitionedAtRuntime())
    first = _json(config, "runtime", "--partitions", "us, eu,us")
    assert (first["partition_keys"], first["created"], first["skipped"]) == (2, 2, 0)
    again = _json(config, "runtime", "--partitions", "us,eu")  # the same command: resumed
    assert (again["backfill_id"], again["resumed"]) == (first["backfill_id"], True)
    assert (again["created"], again["skipped"]) == (0, 2)
    assert _runs(db, "runtime") == [("eu", "backfill__eu", None), ("us", "backfill__us", None)]
    [backfill] = backfill_rows(db)
    assert (backfill.partition_keys, backfill.from_date, backfill.to_date) == (
        ["us", "eu"],
        None,
        None,
    )
    other = run_cli(config, "dags", "backfill", "runtime", "--partitions", "ap")
    assert other.exit_code == 1
    assert f"unfinished backfill (id {backfill.id}) of partition keys us, eu" in other.stderr


def test_a_killed_partition_backfill_resumes_without_duplicates(
    db: Database, config: Config
) -> None:
    add_dag(db, "hourly", timetable=HOURLY)
    now = datetime(2025, 1, 2, tzinfo=UTC)
    infos = [HOURLY.run_for_key(key) for key in KEYS]

    def first_batch_only(session: Any) -> int:  # the command, killed after its first batch
        backfill_id = backfills.create_or_resume_backfill(
            session,
            "hourly",
            from_date=None,
            to_date=None,
            reprocess="none",
            max_active_runs=16,
            created_by="cli:test@host",
            now=now,
            partition_keys=KEYS,
        )
        backfill_rules.add_backfill_runs(
            session, backfill_id, infos[:10], reprocess="none", now=now, timetable=HOURLY
        )
        return backfill_id

    killed = db.call(first_batch_only)
    resumed = _json(config, "hourly", "--partitions", ",".join(KEYS))
    assert (resumed["backfill_id"], resumed["created"], resumed["skipped"]) == (killed, 14, 10)
    runs = _runs(db, "hourly")
    assert [key for key, _, _ in runs] == KEYS
    # A key's run is its tick's time run, as the scheduler would have made it.
    assert [(run_id, date) for _, run_id, date in runs] == [
        (f"backfill__{info.logical_date.isoformat()}", info.logical_date) for info in infos
    ]


def test_from_to_on_a_cron_partition_timetable_runs_the_ticks_keys_once(
    db: Database, config: Config
) -> None:
    add_dag(db, "hourly", timetable=HOURLY)
    by_key = _json(config, "hourly", "--partitions", f"{KEYS[0]},{KEYS[1]}")
    assert by_key["created"] == 2
    db.call(lambda s: s.execute(DagRun.__table__.update().values(state="success")))
    db.call(lambda s: backfills.complete_finished_backfills(s, now=datetime.now(UTC)))
    plan = _json(config, "hourly", "--from", KEYS[0], "--to", KEYS[23], "--dry-run")
    assert (plan["create"], plan["skip"]) == (22, 2)  # the keys' runs count in a dry run too
    by_dates = _json(config, "hourly", "--from", KEYS[0], "--to", KEYS[23])
    assert (by_dates["logical_dates"], by_dates["created"], by_dates["skipped"]) == (24, 22, 2)
    runs = _runs(db, "hourly")
    assert [key for key, _, _ in runs] == KEYS
    assert [date.hour for _, _, date in runs] == list(range(24))
    # A key's run that was not made as its tick's (a manual run with the key) counts too.
    db.call(lambda s: s.execute(DagRun.__table__.delete()))
    db.call(lambda s: s.execute(update(Backfill).values(completed_at=datetime.now(UTC))))
    made = run_cli(config, "dags", "trigger", "hourly", "--partition-key", KEYS[5])
    assert made.exit_code == 0, made.output
    db.call(lambda s: s.execute(DagRun.__table__.update().values(state="success")))
    again = _json(config, "hourly", "--partitions", f"{KEYS[5]},{KEYS[6]}")
    assert (again["created"], again["skipped"]) == (1, 1)


@pytest.mark.parametrize(
    ("dag", "keys", "message"),
    [
        ("hourly", "2025-01-01", "DAG 'hourly': '2025-01-01' is not a partition key"),
        ("hourly", "2025-01-01T09:30:00", "(the nearest is '2025-01-01T10:00:00')"),
        ("daily", "2025-01-01", "DAG 'daily' is not partitioned by time or at run time"),
        ("runtime", ",", "names no key"),
        ("runtime", "k" * 251, "more than the 250 a partition key may have"),
    ],
)
def test_partition_keys_the_dag_cannot_run_are_refused(
    db: Database, config: Config, dag: str, keys: str, message: str
) -> None:
    add_dag(db, "hourly", timetable=HOURLY)
    add_dag(db, "daily")
    add_dag(db, "runtime", timetable=PartitionedAtRuntime())
    result = run_cli(config, "dags", "backfill", dag, "--partitions", keys)
    assert result.exit_code == 1
    assert message in result.stderr
    assert db.call(lambda s: s.execute(select(DagRun.id)).all()) == []


def test_dates_and_keys_are_one_or_the_other(db: Database, config: Config) -> None:
    add_dag(db, "runtime", timetable=PartitionedAtRuntime())
    both = run_cli(config, "dags", "backfill", "runtime", "--partitions", "us", "--from", "x")
    assert both.exit_code == 1 and "not both" in both.stderr
    neither = run_cli(config, "dags", "backfill", "runtime")
    assert neither.exit_code == 1 and "give --from and --to" in neither.stderr


def test_a_dry_run_lists_the_keys_and_writes_nothing(db: Database, config: Config) -> None:
    add_dag(db, "runtime", timetable=PartitionedAtRuntime())
    _json(config, "runtime", "--partitions", "us")
    plan = _json(config, "runtime", "--partitions", "us,eu", "--dry-run")
    assert [(p["partition_key"], p["action"]) for p in plan["runs"]] == [
        ("us", "skip"),
        ("eu", "create"),
    ]
    table = run_cli(config, "dags", "backfill", "runtime", "--partitions", "us,eu", "--dry-run")
    assert "PARTITION_KEY" in table.stdout and "would create 1 run(s)" in table.stdout
    assert [key for key, _, _ in _runs(db, "runtime")] == ["us"]


@pytest.mark.both_databases  # the DAG row lock: FOR UPDATE on PostgreSQL, SQLite's write lock
def test_two_commands_racing_for_the_same_keys_make_one_run_each(
    db: Database, config: Config
) -> None:
    add_dag(db, "runtime", timetable=PartitionedAtRuntime())
    keys = [f"k{i}" for i in range(30)]
    start = threading.Barrier(2)
    results: list[int] = []

    def command() -> None:
        start.wait()
        result = run_cli(config, "dags", "backfill", "runtime", "--partitions", ",".join(keys))
        results.append(result.exit_code)

    threads = [threading.Thread(target=command) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [0, 0]
    assert sorted(key for key, _, _ in _runs(db, "runtime")) == sorted(keys)
