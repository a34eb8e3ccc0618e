"""The workflow commands around schedules on SQLite and PostgreSQL: ``assets emit``, ``dags
show`` / ``dags list`` with schedules and next runs, ``dags trigger`` with logical dates,
``runs list`` and ``assets events``."""

from __future__ import annotations

import getpass
import json
import socket
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import select

from engine.authoring.assets import Asset
from engine.authoring.interval_timetables import CronDataIntervalTimetable
from engine.authoring.timetables import AssetOrTimeSchedule
from engine.authoring.trigger_timetables import CronTriggerTimetable
from engine.db.models import AssetEvent, AssetEventQueue, utcnow
from tests.integration.test_backfill import DAILY, add_dag, config, dag_runs, db, run_cli

if TYPE_CHECKING:
    from click.testing import Result

    from engine.config import Config
    from engine.db.database import Database

pytestmark = pytest.mark.integration

__all__ = ("config", "db")  # the fixtures, used by name

BERLIN_HOURLY = CronTriggerTimetable("0 * * * *", timezone="Europe/Berlin")
NEXT = datetime(2026, 3, 1, 12, tzinfo=UTC)


def _ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def _failed(result: Result, message: str) -> None:
    assert result.exit_code == 1, result.output
    assert message in result.stderr


# --- assets emit / events ------------------------------------------------------------------


@pytest.mark.both_databases
def test_assets_emit_records_a_cli_event_and_queues_it_for_the_dag(
    db: Database, config: Config
) -> None:
    add_dag(db, "on_a", timetable=None, assets=("a",))
    out = _ok(run_cli(config, "assets", "emit", "a", "--extra", '{"rows": 3}'))
    event_id = int(out.split()[2])
    assert out.strip() == f"emitted event {event_id} of asset a"

    event = db.call(lambda s: s.get(AssetEvent, event_id))
    assert event is not None
    actor = f"cli:{getpass.getuser()}@{socket.gethostname()}"
    assert (event.source, event.created_by, event.extra) == ("cli", actor, {"rows": 3})
    queued = db.call(
        lambda s: s.execute(select(AssetEventQueue.dag_id, AssetEventQueue.asset_event_id)).all()
    )
    assert [tuple(q) for q in queued] == [("on_a", event_id)]

    as_json = json.loads(_ok(run_cli(config, "assets", "emit", "a", "--json")))
    assert as_json["asset"] == "a" and as_json["event_id"] > event_id

    events = json.loads(_ok(run_cli(config, "assets", "events", "a", "--json")))
    assert [(e["id"], e["source"], e["created_by"], e["extra"]) for e in events] == [
        (event_id, "cli", actor, {"rows": 3}),
        (as_json["event_id"], "cli", actor, {}),
    ]
    table = _ok(run_cli(config, "assets", "events", "a"))
    for header in ("SOURCE", "SOURCE_TASK", "CREATED_BY", "EXTRA"):
        assert header in table
    assert actor in table and '{"rows": 3}' in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope",), "unknown asset 'nope'"),
        (("a", "--extra", "[1, 2]"), "--extra must be a JSON object"),
        (("a", "--extra", "7"), "--extra must be a JSON object"),
        (("a", "--extra", "{bad"), "--extra is not JSON"),
    ],
)
def test_assets_emit_refuses_unknown_assets_and_bad_extra(
    db: Database, config: Config, args: tuple[str, ...], message: str
) -> None:
    add_dag(db, "on_a", timetable=None, assets=("a",))
    _failed(run_cli(config, "assets", "emit", *args), message)
    assert db.call(lambda s: s.execute(select(AssetEvent.id)).all()) == []


# --- dags show / list ----------------------------------------------------------------------


def _scheduled_dags(db: Database) -> None:
    add_dag(
        db,
        "hourly",
        timetable=BERLIN_HOURLY,
        timezone="Europe/Berlin",
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        end_date=datetime(2026, 12, 31, tzinfo=UTC),
        catchup=True,
        max_active_runs=5,
        tags=["sales", "hourly"],
        next_dagrun_computed=True,
        next_dagrun=NEXT,
        next_dagrun_data_interval_start=NEXT,
        next_dagrun_data_interval_end=NEXT,
        next_dagrun_create_after=NEXT,
    )
    add_dag(db, "fresh")  # the scheduler has not computed its next run yet
    add_dag(db, "paused", is_paused=True, next_dagrun_computed=True, next_dagrun=NEXT)
    add_dag(db, "ended", next_dagrun_computed=True)  # past its end_date: no next run
    add_dag(db, "on_a", timetable=None, assets=("a", "b"))


def test_dags_show_prints_the_schedule_and_the_next_run(db: Database, config: Config) -> None:
    _scheduled_dags(db)
    out = _ok(run_cli(config, "dags", "show", "hourly"))
    top = [line.split(":", 1) for line in out.splitlines() if ":" in line and line[0] != " "]
    lines = {key.strip(): value.strip() for key, value in top}
    assert lines["schedule"] == f"0 * * * * ({BERLIN_HOURLY.description})"
    assert lines["timezone"] == "Europe/Berlin"
    assert lines["start_date"] == "2026-01-01T00:00:00+00:00"
    assert lines["end_date"] == "2026-12-31T00:00:00+00:00"
    assert (lines["catchup"], lines["max_active_runs"]) == ("True", "5")
    assert lines["tags"] == "sales, hourly"
    assert lines["next run"] == NEXT.isoformat()
    assert f"  created after: {NEXT.isoformat()}\n" in out
    assert f"  data interval: {NEXT.isoformat()} .. {NEXT.isoformat()}\n" in out
    for kept in ("dag_id:", "fileloc:", "/dags/hourly.py", "paused:", "tasks:", "last runs:"):
        assert kept in out

    shown = json.loads(_ok(run_cli(config, "dags", "show", "hourly", "--json")))
    assert shown["timetable"]["summary"] == "0 * * * *"
    assert shown["timetable"]["serialized"] == BERLIN_HOURLY.serialize()
    assert (shown["timezone"], shown["catchup"], shown["max_active_runs"]) == (
        "Europe/Berlin",
        True,
        5,
    )
    assert shown["tags"] == ["sales", "hourly"]
    assert shown["next_dagrun"] == NEXT.isoformat()
    assert shown["next_dagrun_create_after"] == NEXT.isoformat()
    assert shown["paused"] is False and shown["tasks"][0]["task_id"] == "t"


@pytest.mark.parametrize(
    ("dag_id", "schedule", "next_run"),
    [
        ("fresh", "0 0 * * *", "not computed yet"),
        ("paused", "0 0 * * *", "paused"),
        ("ended", "0 0 * * *", "none"),
        ("on_a", "assets a & b", "none"),
    ],
)
def test_dags_show_says_why_there_is_no_next_run(
    db: Database, config: Config, dag_id: str, schedule: str, next_run: str
) -> None:
    _scheduled_dags(db)
    out = _ok(run_cli(config, "dags", "show", dag_id))
    assert f"schedule:        {schedule}" in out
    assert f"next run:        {next_run}\n" in out
    assert "created after" not in out


def test_dags_show_an_asset_or_time_schedule(db: Database, config: Config) -> None:
    either = AssetOrTimeSchedule(timetable=DAILY, assets=Asset("a"))
    add_dag(db, "either", timetable=either, assets=("a",))
    out = _ok(run_cli(config, "dags", "show", "either"))
    [line] = [line for line in out.splitlines() if line.startswith("schedule:")]
    assert line.startswith(f"schedule:        0 0 * * * ({either.description}")
    assert line.endswith(" or assets a")
    shown = json.loads(_ok(run_cli(config, "dags", "show", "either", "--json")))
    assert shown["timetable"]["serialized"] == either.serialize()
    assert shown["schedule"] == {"__type": "asset", "name": "a", "uri": "a"}


def test_dags_list_has_schedule_next_run_and_tags(db: Database, config: Config) -> None:
    _scheduled_dags(db)
    table = _ok(run_cli(config, "dags", "list"))
    header, *rows = table.splitlines()
    assert header.split() == [
        "DAG_ID", "PAUSED", "ACTIVE", "SCHEDULE", "NEXT_RUN", "TAGS", "FILELOC",
    ]  # fmt: skip
    by_dag = {row.split()[0]: row for row in rows}
    assert "0 * * * *" in by_dag["hourly"] and NEXT.isoformat() in by_dag["hourly"]
    assert "sales, hourly" in by_dag["hourly"]
    assert "not computed yet" in by_dag["fresh"]
    assert by_dag["paused"].split()[1:2] == ["True"] and " paused " in by_dag["paused"]
    assert by_dag["ended"].split()[3:9] == ["0", "0", "*", "*", "*", "none"]
    assert "assets a & b" in by_dag["on_a"]

    listed = {d["dag_id"]: d for d in json.loads(_ok(run_cli(config, "dags", "list", "--json")))}
    assert listed["hourly"]["timetable"] == "0 * * * *"
    assert listed["hourly"]["next_run"] == NEXT.isoformat()
    assert listed["hourly"]["tags"] == ["sales", "hourly"]
    assert listed["on_a"]["timetable"] is None
    assert listed["on_a"]["schedule"]["__type"] == "asset_all"  # the asset condition, as before


# --- dags trigger / runs list --------------------------------------------------------------


def test_trigger_sets_the_logical_date_and_the_timetables_data_interval(
    db: Database, config: Config
) -> None:
    add_dag(db, "interval", timetable=CronDataIntervalTimetable("0 0 * * *", "Europe/Berlin"))
    before = utcnow()
    out = _ok(run_cli(config, "dags", "trigger", "interval", "--conf", '{"x": 1}', "--json"))
    [run] = dag_runs(db, "interval")
    assert json.loads(out)["run_id"] == run.run_id
    assert run.logical_date is not None and before <= run.logical_date <= utcnow()
    assert run.run_after == run.logical_date
    assert run.conf == {"x": 1} and run.run_type == "manual"
    # The last complete Berlin day before the logical date.
    assert run.data_interval_end is not None and run.data_interval_start is not None
    assert run.data_interval_end <= run.logical_date < run.data_interval_end + timedelta(days=1)
    assert run.data_interval_end - run.data_interval_start == timedelta(days=1)
    assert run.data_interval_end.astimezone(BERLIN_HOURLY.zone).hour == 0


def test_trigger_with_a_logical_date_in_the_dags_timezone(db: Database, config: Config) -> None:
    add_dag(db, "berlin", timetable=BERLIN_HOURLY, timezone="Europe/Berlin")
    add_dag(db, "manual", timetable=None)
    _ok(run_cli(config, "dags", "trigger", "berlin", "--logical-date", "2026-01-05T06:00"))
    [run] = dag_runs(db, "berlin")
    at = datetime(2026, 1, 5, 5, tzinfo=UTC)  # 06:00 CET
    assert (run.logical_date, run.data_interval_start, run.data_interval_end) == (at, at, at)
    assert run.run_after is not None and run.run_after >= run.queued_at  # past date: now

    _failed(
        run_cli(config, "dags", "trigger", "berlin", "--logical-date", "2026-01-05T05:00:00Z"),
        "already has a run with logical date 2026-01-05T05:00:00+00:00",
    )
    assert len(dag_runs(db, "berlin")) == 1

    _ok(run_cli(config, "dags", "trigger", "manual", "--logical-date", "2026-01-05"))
    [plain] = dag_runs(db, "manual")
    midnight = datetime(2026, 1, 5, tzinfo=UTC)
    assert (plain.logical_date, plain.data_interval_start, plain.data_interval_end) == (
        midnight,
        midnight,
        midnight,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("berlin", "--conf", "[1]"), "--conf must be a JSON object ({...}), got an array"),
        (("berlin", "--conf", "3"), "--conf must be a JSON object ({...}), got a number"),
        (("berlin", "--conf", '"x"'), "--conf must be a JSON object ({...}), got a string"),
        (("berlin", "--conf", "null"), "--conf must be a JSON object ({...}), got null"),
        (("berlin", "--conf", "true"), "--conf must be a JSON object ({...}), got a boolean"),
        (("berlin", "--conf", "{oops"), "--conf is not JSON"),
        (("berlin", "--logical-date", "soon"), "not an ISO date"),
        (("missing",), "no DAG 'missing'"),
    ],
)
def test_trigger_refuses_bad_input(
    db: Database, config: Config, args: tuple[str, ...], message: str
) -> None:
    add_dag(db, "berlin", timetable=BERLIN_HOURLY, timezone="Europe/Berlin")
    _failed(run_cli(config, "dags", "trigger", *args), message)
    assert dag_runs(db, "berlin") == []


def test_an_unknown_dag_is_an_error_not_an_empty_answer(db: Database, config: Config) -> None:
    add_dag(db, "quiet")
    assert _ok(run_cli(config, "runs", "list", "quiet")).strip() == "(none)"  # known, no runs
    assert json.loads(_ok(run_cli(config, "runs", "list", "quiet", "--json"))) == []
    for args in (
        ("runs", "list", "nope"),
        ("runs", "list", "nope", "--json"),
        ("tasks", "logs", "nope", "run", "task"),
        ("tasks", "result", "nope", "run", "task"),
        ("dags", "show", "nope"),
    ):
        _failed(run_cli(config, *args), "no DAG 'nope'; see `sluice dags list`")


@pytest.mark.both_databases
def test_runs_list_shows_logical_date_and_run_after(db: Database, config: Config) -> None:
    add_dag(db, "daily")
    _ok(run_cli(config, "dags", "backfill", "daily", "--from", "2025-01-01", "--to", "2025-01-02"))
    future = (utcnow() + timedelta(days=1)).replace(microsecond=0)
    _ok(run_cli(config, "dags", "trigger", "daily", "--logical-date", future.isoformat()))
    table = _ok(run_cli(config, "runs", "list", "daily"))
    assert "LOGICAL_DATE" in table.splitlines()[0] and "RUN_AFTER" in table.splitlines()[0]
    assert "2025-01-01T00:00:00+00:00" in table
    rows = json.loads(_ok(run_cli(config, "runs", "list", "daily", "--json")))
    [manual] = [r for r in rows if r["run_type"] == "manual"]
    assert manual["logical_date"] == manual["run_after"] == future.isoformat()  # waits for it
