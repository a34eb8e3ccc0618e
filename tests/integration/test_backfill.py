"""``sluice dags backfill`` and its SQL on SQLite and PostgreSQL: runs per logical date,
dry run, ``--reprocess``, resuming a killed command, completion, concurrent commands."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func, insert, select, update

from engine.authoring.interval_timetables import CronDataIntervalTimetable
from engine.authoring.timetables import TimeRestriction, Timetable
from engine.authoring.trigger_timetables import CronTriggerTimetable
from engine.cli import cli
from engine.cli.backfill import write_backfill
from engine.config import Config, load_config
from engine.db.database import Database
from engine.db.models import Asset, Backfill, DagRun, DagScheduleAsset, DagTask, TaskInstance
from engine.db.queries import backfills
from engine.db.queries import dags as dags_sql
from engine.db.queries import runs as runs_sql
from engine.scheduler import backfills as backfill_rules
from engine.states import DagRunState, TaskState

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.integration

DAILY = CronTriggerTimetable("0 0 * * *", timezone="UTC")
START = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
def db(migrated_db_url: str) -> Iterator[Database]:
    database = Database(migrated_db_url)
    yield database
    database.dispose()


@pytest.fixture
def config(db: Database, tmp_path: Path) -> Config:
    home = tmp_path / "home"
    env = {"SLUICE_HOME": str(home), "SLUICE__CORE__SQL_ALCHEMY_CONN": db.url}
    return load_config(environ=env)


def run_cli(config: Config, *args: str) -> Result:
    """``sluice ARGS`` in this process, on ``config`` (which also keeps logging untouched)."""
    return CliRunner().invoke(cli, list(args), obj={"config": config}, catch_exceptions=False)


def add_dag(
    db: Database,
    dag_id: str,
    *,
    timetable: Timetable | None = DAILY,
    assets: tuple[str, ...] = (),
    **columns: Any,
) -> None:
    """A DAG row as the DAG processor stores it, with one task (and its schedule assets)."""
    values: dict[str, Any] = {
        "dag_id": dag_id,
        "fileloc": f"/dags/{dag_id}.py",
        "timetable": None if timetable is None else timetable.serialize(),
        "timetable_summary": None if timetable is None else timetable.summary,
        "timezone": "UTC",
        "start_date": START,
        "max_active_runs": 16,
        "tags": [],
        **columns,
    }
    if assets:
        objects = [{"__type": "asset", "name": a, "uri": a} for a in assets]
        values["schedule"] = (
            objects[0]
            if len(objects) == 1
            else {
                "__type": "asset_all",
                "objects": objects,
            }
        )

    def write(session: Any) -> None:
        dags_sql.insert_dag(session, values)
        task = {"task_id": "t", "operator": "PythonOperator", "downstream_task_ids": []}
        dags_sql.replace_dag_tasks(session, dag_id, [task])
        for name in assets:
            asset_id = (
                session.execute(select(Asset.id).where(Asset.name == name)).scalar()
                or session.execute(
                    insert(Asset).values(name=name, uri=name, extra={}).returning(Asset.id)
                ).scalar_one()
            )
            session.execute(insert(DagScheduleAsset).values(dag_id=dag_id, asset_id=asset_id))

    db.call(write)


def day(n: int) -> datetime:
    """Midnight UTC of January ``n``, 2025 (n may run past 31: the days continue)."""
    return START + timedelta(days=n - 1)


def dag_runs(db: Database, dag_id: str) -> list[DagRun]:
    query = select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.logical_date)
    return list(db.call(lambda s: s.execute(query).scalars().all()))


def backfill_rows(db: Database) -> list[Backfill]:
    return list(
        db.call(lambda s: s.execute(select(Backfill).order_by(Backfill.id)).scalars().all())
    )


def _scheduled_run(db: Database, dag_id: str, at: datetime, state: DagRunState) -> int:
    def write(session: Any) -> int:
        pk = runs_sql.create_run(
            session,
            dag_id,
            run_type=runs_sql.SCHEDULED,
            now=at,
            logical_date=at,
            data_interval=(at, at),
            run_after=at,
        )
        assert pk is not None
        session.execute(update(DagRun).where(DagRun.id == pk).values(state=state))
        ti_state = {DagRunState.SUCCESS: TaskState.SUCCESS, DagRunState.FAILED: TaskState.FAILED}
        if state in ti_state:
            session.execute(
                update(TaskInstance)
                .where(TaskInstance.dag_run_id == pk)
                .values(state=ti_state[state])
            )
        return pk

    return int(db.call(write))


def _task_states(db: Database, run_pk: int) -> set[str]:
    query = select(TaskInstance.state).where(TaskInstance.dag_run_id == run_pk)
    return set(db.call(lambda s: s.execute(query).scalars().all()))


# --- creating ------------------------------------------------------------------------------


@pytest.mark.both_databases
def test_backfill_creates_a_queued_run_per_logical_date(db: Database, config: Config) -> None:
    add_dag(db, "daily", max_active_runs=3)
    result = run_cli(
        config, "dags", "backfill", "daily", "--from", "2025-01-01", "--to", "2025-01-10"
    )
    assert result.exit_code == 0, result.output
    assert "created backfill" in result.stdout and "created 10 run(s)" in result.stdout

    runs = dag_runs(db, "daily")
    [backfill] = backfill_rows(db)
    assert [r.logical_date for r in runs] == [day(n) for n in range(1, 11)]
    assert {(r.run_type, r.state, r.backfill_id) for r in runs} == {
        (runs_sql.BACKFILL, DagRunState.QUEUED, backfill.id)
    }
    assert all(
        r.run_after == r.logical_date == r.data_interval_start == r.data_interval_end for r in runs
    )
    assert (backfill.from_date, backfill.to_date) == (day(1), day(10))
    assert (backfill.max_active_runs, backfill.reprocess) == (3, "none")  # the DAG's limit
    assert backfill.created_by is not None and backfill.created_by.startswith("cli:")
    assert backfill.completed_at is None
    tis = db.call(lambda s: s.execute(select(func.count()).select_from(TaskInstance)).scalar())
    assert tis == 10


def test_backfill_dates_are_in_the_dags_timezone_and_intervals_follow_the_timetable(
    db: Database, config: Config
) -> None:
    berlin = CronDataIntervalTimetable("0 0 * * *", timezone="Europe/Berlin")
    add_dag(db, "berlin", timetable=berlin, timezone="Europe/Berlin", start_date=None)
    result = run_cli(
        config,
        "dags", "backfill", "berlin", "--from", "2025-01-01", "--to", "2025-01-03",
        "--max-active-runs", "2", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert (shown["created"], shown["max_active_runs"], shown["resumed"]) == (3, 2, False)
    runs = dag_runs(db, "berlin")
    midnights = [datetime(2024, 12, 31, 23, tzinfo=UTC) + timedelta(days=n) for n in range(4)]
    assert [r.logical_date for r in runs] == midnights[:3]
    assert [(r.data_interval_start, r.data_interval_end) for r in runs] == list(pairwise(midnights))
    assert [r.run_after for r in runs] == midnights[1:]
    assert backfill_rows(db)[0].max_active_runs == 2


def test_backfill_respects_the_dags_start_and_end_date(db: Database, config: Config) -> None:
    add_dag(db, "bounded", start_date=day(3), end_date=day(5))
    result = run_cli(
        config, "dags", "backfill", "bounded", "--from", "2025-01-01", "--to", "2025-01-31"
    )
    assert result.exit_code == 0, result.output
    assert [r.logical_date for r in dag_runs(db, "bounded")] == [day(3), day(4), day(5)]


@pytest.mark.parametrize(
    ("args", "dag", "message"),
    [
        (("missing", "--from", "2025-01-01", "--to", "2025-01-02"), None, "no DAG 'missing'"),
        (
            ("on_assets", "--from", "2025-01-01", "--to", "2025-01-02"),
            "on_assets",
            "no time schedule",
        ),
        (("daily", "--from", "2025-01-05", "--to", "2025-01-02"), "daily", "is after --to"),
        (("daily", "--from", "yesterday", "--to", "2025-01-02"), "daily", "not an ISO date"),
        (("daily", "--from", "2024-01-01", "--to", "2024-01-02"), "daily", "no logical date"),
    ],
)
def test_backfill_refuses_bad_requests(
    db: Database, config: Config, args: tuple[str, ...], dag: str | None, message: str
) -> None:
    if dag == "on_assets":
        add_dag(db, dag, timetable=None, assets=("a",))
    elif dag is not None:
        add_dag(db, dag)
    result = run_cli(config, "dags", "backfill", *args)
    assert result.exit_code == 1
    assert message in result.stderr
    assert backfill_rows(db) == []
    assert dag is None or dag_runs(db, dag) == []


# --- existing runs -------------------------------------------------------------------------


@pytest.fixture
def history(db: Database) -> dict[str, int]:
    """Scheduled runs of days 1-4: success, failed, running, queued (day 5 has none)."""
    add_dag(db, "daily")
    states = [DagRunState.SUCCESS, DagRunState.FAILED, DagRunState.RUNNING, DagRunState.QUEUED]
    return {
        str(state): _scheduled_run(db, "daily", day(n), state)
        for n, state in enumerate(states, start=1)
    }


def test_dry_run_shows_the_plan_and_writes_nothing(
    db: Database, config: Config, history: dict[str, int]
) -> None:
    before = [(r.id, r.state) for r in dag_runs(db, "daily")]
    args = ["dags", "backfill", "daily", "--from", "2025-01-01", "--to", "2025-01-05"]
    result = run_cli(config, *args, "--reprocess", "failed", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert [(p["action"], p["existing_state"]) for p in plan["runs"]] == [
        ("skip", "success"),
        ("reprocess", "failed"),
        ("skip", "running"),
        ("skip", "queued"),
        ("create", None),
    ]
    assert (plan["create"], plan["reprocess"], plan["skip"], plan["dry_run"]) == (1, 1, 3, True)
    text = run_cli(config, *args, "--dry-run")
    assert text.exit_code == 0, text.output
    assert "dry run" in text.stdout and "would create 1 run(s), re-run 0, skip 4" in text.stdout
    assert [(r.id, r.state) for r in dag_runs(db, "daily")] == before
    assert backfill_rows(db) == []


@pytest.mark.parametrize(
    ("reprocess", "rerun"),
    [("none", set()), ("failed", {"failed"}), ("completed", {"failed", "success"})],
)
def test_reprocess_decides_about_finished_runs(
    db: Database, config: Config, history: dict[str, int], reprocess: str, rerun: set[str]
) -> None:
    args = ["dags", "backfill", "daily", "--from", "2025-01-01", "--to", "2025-01-05"]
    result = run_cli(config, *args, "--reprocess", reprocess, "--json")
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)
    assert (counts["created"], counts["reprocessed"], counts["skipped"]) == (
        1,
        len(rerun),
        4 - len(rerun),
    )
    [backfill] = backfill_rows(db)
    by_pk = {r.id: r for r in dag_runs(db, "daily")}
    for state, pk in history.items():
        run = by_pk[pk]
        if state in rerun:  # queued again, in the backfill, every task from the start
            assert (run.state, run.backfill_id, run.end_date) == ("queued", backfill.id, None)
            assert _task_states(db, pk) == {TaskState.NONE}
        else:
            assert (run.state, run.backfill_id) == (state, None)
    [new] = [r for r in by_pk.values() if r.logical_date == day(5)]
    assert (new.run_type, new.backfill_id) == (runs_sql.BACKFILL, backfill.id)


def test_every_date_skipped_completes_the_backfill_at_once(
    db: Database, config: Config, history: dict[str, int]
) -> None:
    result = run_cli(
        config, "dags", "backfill", "daily", "--from", "2025-01-01", "--to", "2025-01-04"
    )
    assert result.exit_code == 0, result.output
    assert "skipped 4" in result.stdout and "nothing to run" in result.stdout
    [backfill] = backfill_rows(db)
    assert backfill.completed_at is not None


# --- resuming, conflicts, completion ---------------------------------------------------------


@pytest.mark.both_databases
def test_a_killed_backfill_resumes_without_duplicates(db: Database, config: Config) -> None:
    add_dag(db, "daily")
    first, last = day(1), day(250)
    infos = DAILY.runs_between(first, last, restriction=TimeRestriction(START, None, False))
    assert len(infos) == 250

    def first_batch_only(session: Any) -> int:  # the command, killed after its first batch
        backfill_id = backfills.create_or_resume_backfill(
            session,
            "daily",
            from_date=first,
            to_date=last,
            reprocess="none",
            max_active_runs=16,
            created_by="cli:test@host",
            now=datetime.now(UTC),
        )
        backfill_rules.add_backfill_runs(
            session,
            backfill_id,
            infos[: backfill_rules.BACKFILL_BATCH_SIZE],
            reprocess="none",
            now=first,
        )
        return backfill_id

    killed = db.call(first_batch_only)
    assert len(dag_runs(db, "daily")) == 100

    args = ["dags", "backfill", "daily", "--from", first.isoformat(), "--to", last.isoformat()]
    result = run_cli(config, *args, "--json")
    assert result.exit_code == 0, result.output
    resumed = json.loads(result.stdout)
    assert (resumed["backfill_id"], resumed["resumed"]) == (killed, True)
    assert (resumed["created"], resumed["skipped"]) == (150, 100)

    again = json.loads(run_cli(config, *args, "--json").stdout)
    assert (again["backfill_id"], again["created"], again["skipped"]) == (killed, 0, 250)

    runs = dag_runs(db, "daily")
    assert [r.logical_date for r in runs] == [i.logical_date for i in infos]
    assert {r.backfill_id for r in runs} == {killed}
    assert len(backfill_rows(db)) == 1


def test_an_unfinished_backfill_of_another_range_is_named(db: Database, config: Config) -> None:
    add_dag(db, "daily")
    ok = run_cli(config, "dags", "backfill", "daily", "--from", "2025-01-01", "--to", "2025-01-03")
    assert ok.exit_code == 0, ok.output
    other = run_cli(
        config, "dags", "backfill", "daily", "--from", "2025-01-02", "--to", "2025-01-09"
    )
    assert other.exit_code == 1
    [backfill] = backfill_rows(db)
    assert f"unfinished backfill (id {backfill.id})" in other.stderr
    assert "2025-01-01T00:00:00+00:00" in other.stderr
    assert len(dag_runs(db, "daily")) == 3


def test_backfills_complete_when_all_their_runs_have_ended(db: Database, config: Config) -> None:
    add_dag(db, "daily")
    assert (
        run_cli(
            config, "dags", "backfill", "daily", "--from", "2025-01-01", "--to", "2025-01-03"
        ).exit_code
        == 0
    )
    [backfill] = backfill_rows(db)
    # A backfill whose command is still writing its first batch has no runs: not complete.
    add_dag(db, "other")
    empty_id = db.call(
        lambda s: backfills.create_or_resume_backfill(
            s,
            "other",
            from_date=day(1),
            to_date=day(2),
            reprocess="none",
            max_active_runs=1,
            created_by=None,
            now=day(1),
        )
    )
    now = datetime(2026, 1, 1, tzinfo=UTC)
    runs = dag_runs(db, "daily")
    db.call(
        lambda s: s.execute(update(DagRun).where(DagRun.id == runs[0].id).values(state="success"))
    )
    db.call(
        lambda s: s.execute(update(DagRun).where(DagRun.id == runs[1].id).values(state="failed"))
    )
    assert db.call(lambda s: backfills.complete_finished_backfills(s, now=now)) == []
    db.call(
        lambda s: s.execute(update(DagRun).where(DagRun.id == runs[2].id).values(state="running"))
    )
    assert db.call(lambda s: backfills.complete_finished_backfills(s, now=now)) == []
    db.call(
        lambda s: s.execute(update(DagRun).where(DagRun.id == runs[2].id).values(state="success"))
    )
    assert db.call(lambda s: backfills.complete_finished_backfills(s, now=now)) == [backfill.id]
    assert db.call(lambda s: backfills.complete_finished_backfills(s, now=now)) == []
    completed = {b.id: b.completed_at for b in backfill_rows(db)}
    assert completed == {backfill.id: now, empty_id: None}

    # Completed: a new command over another range starts a new backfill.
    again = run_cli(
        config, "dags", "backfill", "daily", "--from", "2025-01-02", "--to", "2025-01-04", "--json"
    )
    assert again.exit_code == 0, again.output
    shown = json.loads(again.stdout)
    assert shown["backfill_id"] != backfill.id and (shown["created"], shown["skipped"]) == (1, 2)


@pytest.mark.parametrize("migrated_db_url", ["postgres"], indirect=True)
def test_two_concurrent_backfills_create_each_run_once(db: Database) -> None:
    add_dag(db, "daily")
    infos = DAILY.runs_between(day(1), day(300), restriction=TimeRestriction(START, None, False))
    barrier = threading.Barrier(2, timeout=30)
    results: list[Any] = []
    errors: list[BaseException] = []

    def command() -> None:
        own = Database(db.url)
        try:
            own.call(lambda s: s.execute(select(1)))  # connected: both start together
            barrier.wait()
            results.append(
                write_backfill(
                    own,
                    "daily",
                    infos,
                    from_date=day(1),
                    to_date=day(300),
                    reprocess="none",
                    max_active_runs=4,
                    created_by="cli:test@host",
                    batch_size=25,
                )
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.dispose()

    threads = [threading.Thread(target=command) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(results) == 2
    assert sum(r.created for r in results) == 300
    assert sum(r.skipped for r in results) == 300
    [backfill] = backfill_rows(db)
    assert {r.backfill_id for r in results} == {backfill.id}
    runs = dag_runs(db, "daily")
    assert [r.logical_date for r in runs] == [i.logical_date for i in infos]
    tis = db.call(lambda s: s.execute(select(func.count()).select_from(TaskInstance)).scalar())
    assert tis == 300


@pytest.mark.parametrize("migrated_db_url", ["postgres"], indirect=True)
def test_two_transactions_adding_the_same_dates_create_each_run_once(db: Database) -> None:
    add_dag(db, "daily")
    infos = DAILY.runs_between(day(1), day(50), restriction=TimeRestriction(START, None, False))
    backfill_id = db.call(
        lambda s: backfills.create_or_resume_backfill(
            s,
            "daily",
            from_date=day(1),
            to_date=day(50),
            reprocess="none",
            max_active_runs=4,
            created_by=None,
            now=day(1),
        )
    )
    barrier = threading.Barrier(2, timeout=30)
    counts: list[dict[str, int]] = []
    errors: list[BaseException] = []

    def add(session: Any) -> dict[str, int]:
        session.execute(select(1))  # both transactions are open before either writes
        barrier.wait()
        return backfill_rules.add_backfill_runs(
            session, backfill_id, infos, reprocess="completed", now=day(1)
        )

    def command() -> None:
        own = Database(db.url)
        try:
            counts.append(own.call(add))
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.dispose()

    threads = [threading.Thread(target=command) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert sorted((c["created"], c["skipped"], c["reprocessed"]) for c in counts) == [
        (0, 50, 0),
        (50, 0, 0),
    ]
    assert [r.logical_date for r in dag_runs(db, "daily")] == [i.logical_date for i in infos]


def test_reprocessed_tasks_get_their_retries_again_and_a_resume_skips_its_own_runs(
    db: Database, config: Config, history: dict[str, int]
) -> None:
    failed = history[str(DagRunState.FAILED)]

    def retries(session: Any) -> None:
        session.execute(update(DagTask).where(DagTask.dag_id == "daily").values(retries=2))
        session.execute(
            update(TaskInstance)
            .where(TaskInstance.dag_run_id == failed)
            .values(try_number=3, max_tries=2)
        )

    db.call(retries)
    args = ["dags", "backfill", "daily", "--from", "2025-01-01", "--to", "2025-01-05"]
    first = run_cli(config, *args, "--reprocess", "completed", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["reprocessed"] == 2
    tis = db.call(
        lambda s: (
            s.execute(select(TaskInstance).where(TaskInstance.dag_run_id == failed)).scalars().all()
        )
    )
    # Tries keep counting; the task may fail twice more before it is failed for good.
    assert [(ti.try_number, ti.max_tries) for ti in tis] == [(3, 5)]
    for pk in (failed, history[str(DagRunState.SUCCESS)]):  # the re-runs finish
        db.call(
            lambda s, pk=pk: s.execute(
                update(DagRun).where(DagRun.id == pk).values(state=DagRunState.SUCCESS)
            )
        )
    # The same command again (a resume): the backfill's own runs are its work, not old runs.
    again = run_cli(config, *args, "--reprocess", "completed", "--json")
    assert again.exit_code == 0, again.output
    counts = json.loads(again.stdout)
    assert (counts["created"], counts["reprocessed"], counts["resumed"]) == (0, 0, True)
