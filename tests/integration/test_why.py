"""``explain_dag`` ("why did my DAG not run?") on SQLite and PostgreSQL, on DAG files parsed by
the real DAG processor: asset conditions (AND, OR, alias) with what is missing, paused,
max_active_runs, the next cron tick at a fixed ``now``, the watchers behind the assets
(unclaimed, a dead owner, a recorded error, a shared stream's group and its lag, with a real
triggerer publishing it), the tasks that update an asset, and an unknown DAG."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import select, update

from engine.db import models
from engine.db.models import AssetWatcher, Job, Trigger
from engine.db.queries import assets as assets_sql
from engine.db.queries import dags as dags_sql
from engine.db.queries import jobs as jobs_sql
from engine.db.queries import runs as runs_sql
from engine.db.queries import streams as streams_sql
from engine.db.queries import time_schedules
from engine.db.queries import triggers as trigger_rows
from engine.states import TaskState
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from engine.views.why import UnknownDagError, explain_dag
from shared_stream import GroupStats
from tests.integration.harness import Parsed, parsed_database
from tests.waiting import eventually

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.integration

THRESHOLD_S = 2.0
DAGS = """
from datetime import UTC, datetime

from engine import DAG, Asset, AssetAlias, AssetWatcher, task
from triggers import DirectoryFileDeleteTrigger


def watched(name):
    trigger = DirectoryFileDeleteTrigger(
        directory=INBOX, filename=f"{name}.flag", poke_interval=0.1
    )
    return Asset(name, watchers=[AssetWatcher(f"{name}-w", trigger)])


a, b = watched("a"), watched("b")
made, lonely = Asset("made"), Asset("lonely")


@task
def noop():
    return None


with DAG("both", schedule=a & b):
    noop()

with DAG("either", schedule=a | b):
    noop()

with DAG("on_made", schedule=made):
    noop()

with DAG("on_lonely", schedule=lonely):
    noop()

with DAG("on_alias", schedule=AssetAlias("partitions")):
    noop()

with DAG("maker", schedule=None, max_active_runs=1):

    @task(outlets=[made])
    def make():
        return None

    make()

with DAG("hourly", schedule="0 * * * *", start_date=datetime(2026, 1, 1, tzinfo=UTC)):
    noop()
"""


@pytest.fixture
def parsed(migrated_db_url: str, tmp_path: Path) -> Iterator[Parsed]:
    inbox, dags = tmp_path / "inbox", tmp_path / "dags"
    inbox.mkdir()
    dags.mkdir()
    (dags / "why_dags.py").write_text(DAGS.replace("INBOX", repr(str(inbox))))
    found = parsed_database(migrated_db_url, tmp_path, dags)
    yield found
    found.db.dispose()


def explain(parsed: Parsed, dag_id: str, now: datetime | None = None) -> dict[str, Any]:
    at = now or models.utcnow()
    view = parsed.db.call(
        lambda s: explain_dag(
            s, dag_id, now=at, triggerer_threshold_s=THRESHOLD_S, scheduler_threshold_s=THRESHOLD_S
        ),
        read_only=True,
    )
    json.dumps(view)  # JSON-able as it is
    return view


def emit(parsed: Parsed, asset: str) -> int:
    return int(
        parsed.db.call(
            lambda s: assets_sql.emit_asset_event(
                s, asset, extra=None, source=assets_sql.SOURCE_CLI, created_by="test"
            )
        )
    )


def start_job(parsed: Parsed, job_type: str, *, capacity: int | None = None) -> int:
    return int(
        parsed.db.call(lambda s: jobs_sql.start_job(s, job_type=job_type, capacity=capacity))
    )


def codes(view: dict[str, Any]) -> list[str]:
    return [f["code"] for f in view["findings"]]


def finding(view: dict[str, Any], code: str) -> dict[str, str]:
    return next(f for f in view["findings"] if f["code"] == code)


def watcher(view: dict[str, Any], asset: str) -> dict[str, Any]:
    (entry,) = (a for a in view["assets"] if a["name"] == asset)
    (found,) = entry["watchers"]
    return dict(found)


def trigger_id_of(parsed: Parsed, watcher_name: str) -> int:
    query = select(AssetWatcher.trigger_id).where(AssetWatcher.name == watcher_name)
    return int(parsed.db.call(lambda s: s.execute(query).scalar_one()))


def own(parsed: Parsed, watcher_name: str, job_id: int) -> int:
    tid = trigger_id_of(parsed, watcher_name)
    stmt = update(Trigger).where(Trigger.id == tid).values(triggerer_id=job_id)
    parsed.db.call(lambda s: s.execute(stmt))
    return tid


# --- the asset condition --------------------------------------------------------------


@pytest.mark.both_databases
def test_an_and_condition_names_the_asset_still_missing(parsed: Parsed) -> None:
    emit(parsed, "a")
    view = explain(parsed, "both")
    section = view["schedule"]["assets"]
    assert view["schedule"]["kind"] == "assets" and view["schedule"]["text"] == "assets a & b"
    assert section["met"] is False and section["missing"] == "b"
    assert section["condition"] == {
        "type": "all",
        "satisfied": False,
        "objects": [
            {"type": "asset", "name": "a", "satisfied": True, "queued_events": 1},
            {"type": "asset", "name": "b", "satisfied": False, "queued_events": 0},
        ],
    }
    a, b = view["assets"]
    assert a["queued"]["count"] == 1 and a["queued"]["sources"] == {"cli": 1}
    assert a["satisfied"] and not b["satisfied"] and b["queued"]["count"] == 0
    missing = finding(view, "assets_missing")
    assert missing["severity"] == "blocker"  # b's watcher has no triggerer to run it
    assert view["verdict"] == missing["message"]
    assert view["verdict"].startswith("waiting for asset b (no event queued for this DAG yet)")
    assert "its watcher b-w is not claimed: no live triggerer" in view["verdict"]

    emit(parsed, "b")
    view = explain(parsed, "both")
    assert view["schedule"]["assets"]["met"] is True
    assert view["schedule"]["assets"]["missing"] is None
    met = finding(view, "condition_met")
    assert met["severity"] == "blocker" and "no live scheduler" in met["message"]
    start_job(parsed, jobs_sql.SCHEDULER_JOB)
    view = explain(parsed, "both")
    assert finding(view, "condition_met")["severity"] == "note"
    assert "no_scheduler" not in codes(view)


def test_an_or_condition_waits_for_any_and_is_met_by_one(parsed: Parsed) -> None:
    view = explain(parsed, "either")
    assert view["schedule"]["text"] == "assets a | b"
    assert view["schedule"]["assets"]["missing"] == "a or b"
    assert view["verdict"].startswith("waiting for a or b; asset a: no event queued")

    emit(parsed, "b")
    view = explain(parsed, "either")
    section = view["schedule"]["assets"]
    assert section["met"] is True and section["condition"]["satisfied"] is True
    assert [o["satisfied"] for o in section["condition"]["objects"]] == [False, True]


def test_an_alias_nothing_attaches_events_to_is_a_blocker(parsed: Parsed) -> None:
    view = explain(parsed, "on_alias")
    assert view["schedule"]["assets"]["missing"] == "alias partitions"
    (alias,) = view["aliases"]
    assert alias["name"] == "partitions" and alias["assets"] == [] and alias["cause_is_problem"]
    assert view["verdict"].startswith("waiting for alias partitions")
    assert "no task attaches events through it" in view["verdict"]


def test_the_tasks_that_update_an_asset_and_their_last_state(parsed: Parsed) -> None:
    view = explain(parsed, "on_made")
    (made,) = view["assets"]
    (producer,) = made["producers"]
    assert (producer["dag_id"], producer["task_id"], producer["last_state"]) == (
        "maker",
        "make",
        None,
    )
    assert finding(view, "assets_missing")["severity"] == "waiting"
    assert "maker.make, which has not run yet" in made["cause"]

    now = models.utcnow()

    def failed_run(session: Any) -> str:
        pk = runs_sql.create_run(session, "maker", run_type=runs_sql.MANUAL, now=now)
        assert pk is not None
        runs_sql.set_task_states(session, pk, {"make": TaskState.FAILED}, now=now)
        return runs_sql.run_id_of(session, pk)

    run_id = parsed.db.call(failed_run)
    view = explain(parsed, "on_made")
    assert view["assets"][0]["producers"][0]["last_state"] == "failed"
    missing = finding(view, "assets_missing")
    assert missing["severity"] == "blocker" and f"failed in run {run_id}" in missing["message"]

    parsed.db.call(lambda s: dags_sql.set_paused(s, "maker", paused=True))
    assert "maker.make, whose DAG is paused" in explain(parsed, "on_made")["verdict"]


def test_an_asset_nothing_updates_says_so(parsed: Parsed) -> None:
    view = explain(parsed, "on_lonely")
    (lonely,) = view["assets"]
    assert lonely["watchers"] == [] and lonely["producers"] == []
    assert "nothing updates it" in view["verdict"]
    assert "sluice assets emit lonely" in view["verdict"]


# --- the DAG's state and runs ---------------------------------------------------------


def test_a_paused_dag_says_so_first(parsed: Parsed) -> None:
    emit(parsed, "a")
    parsed.db.call(lambda s: dags_sql.set_paused(s, "either", paused=True))
    view = explain(parsed, "either")
    assert view["dag"]["paused"] is True and codes(view)[0] == "dag_paused"
    assert view["verdict"] == "paused: no run starts until `sluice dags unpause either`"
    met = finding(view, "condition_met")  # the event is kept: it runs once unpaused
    assert met["severity"] == "note" and "once unpaused" in met["message"]


def test_max_active_runs_reached_lists_the_active_runs(parsed: Parsed) -> None:
    start_job(parsed, jobs_sql.SCHEDULER_JOB)
    view = explain(parsed, "maker")
    assert view["verdict"].startswith("schedule=None: only manual/API triggers")
    now = models.utcnow()

    def two_runs(session: Any) -> list[str]:
        pks = [
            runs_sql.create_run(session, "maker", run_type=runs_sql.MANUAL, now=now)
            for _ in range(2)
        ]
        runs_sql.start_queued_runs(session, "maker", now=now)  # max_active_runs=1: one starts
        return [runs_sql.run_id_of(session, pk) for pk in pks if pk is not None]

    first, second = parsed.db.call(two_runs)
    view = explain(parsed, "maker")
    runs = view["runs"]
    assert (runs["max_active_runs"], runs["running"], runs["queued"]) == (1, 1, 1)
    assert runs["limit_reached"] is True
    assert [(r["run_id"], r["state"]) for r in runs["active"]] == [
        (first, "running"),
        (second, "queued"),
    ]
    assert view["verdict"] == f"1 run(s) queued: max_active_runs (1) reached by {first}"
    assert "running" in codes(view)


def test_the_next_cron_tick_at_a_fixed_now(parsed: Parsed) -> None:
    now = datetime(2026, 3, 1, 10, 20, tzinfo=UTC)
    view = explain(parsed, "hourly", now)
    time = view["schedule"]["time"]
    assert view["schedule"]["kind"] == "time" and time["summary"] == "0 * * * *"
    assert time["source"] == "computed"  # no scheduler stored one yet
    assert time["next_run"]["logical_date"] == "2026-03-01T10:00:00+00:00"
    assert time["next_run"]["due"] is True
    due = finding(view, "time_due")
    assert due["severity"] == "blocker" and "no live scheduler" in due["message"]

    tick = datetime(2026, 3, 1, 10, tzinfo=UTC)
    parsed.db.call(
        lambda s: runs_sql.create_run(
            s,
            "hourly",
            run_type=runs_sql.SCHEDULED,
            now=now,
            logical_date=tick,
            data_interval=(tick, tick),
        )
    )
    view = explain(parsed, "hourly", now)
    time = view["schedule"]["time"]
    assert time["next_run"] == {
        "logical_date": "2026-03-01T11:00:00+00:00",
        "data_interval": ["2026-03-01T11:00:00+00:00", "2026-03-01T11:00:00+00:00"],
        "run_after": "2026-03-01T11:00:00+00:00",
        "due": False,
    }
    assert time["last_scheduled_run"]["logical_date"] == "2026-03-01T10:00:00+00:00"
    assert finding(view, "time_next")["message"].startswith(
        "next time run at 2026-03-01T11:00:00+00:00 (0 * * * *;"
    )

    # What the scheduler stored wins; stored without a time: held by max_active_runs.
    noon = datetime(2026, 3, 1, 12, tzinfo=UTC)
    store = {"logical_date": noon, "data_interval": (noon, noon)}
    parsed.db.call(lambda s: time_schedules.set_next_dagrun(s, "hourly", **store, run_after=noon))
    time = explain(parsed, "hourly", now)["schedule"]["time"]
    assert time["source"] == "scheduler" and time["next_run"]["run_after"] == noon.isoformat()
    parsed.db.call(lambda s: time_schedules.set_next_dagrun(s, "hourly", **store, run_after=None))
    view = explain(parsed, "hourly", now)
    assert view["schedule"]["time"]["held"] is True and "time_held" in codes(view)


def test_an_unknown_dag_is_a_clear_error(parsed: Parsed) -> None:
    with pytest.raises(UnknownDagError, match=r"no DAG 'nope'; `sluice dags list`"):
        explain(parsed, "nope")


def test_a_file_that_fails_to_parse_is_noted(parsed: Parsed, tmp_path: Path) -> None:
    path = tmp_path / "dags" / "why_dags.py"
    path.write_text(path.read_text() + "\nraise RuntimeError('broken on purpose')\n")
    report = anyio.run(parsed.processor.parse_once)
    assert report is not None and report.errors
    view = explain(parsed, "both")
    assert "broken on purpose" in view["dag"]["parse_error"]["error"]
    noted = finding(view, "parse_error")
    assert noted["severity"] == "note" and "last good version is scheduled" in noted["message"]
    assert view["dag"]["active"] is True


# --- the watchers behind the assets ---------------------------------------------------


def test_a_watcher_not_claimed_with_and_without_live_triggerers(parsed: Parsed) -> None:
    w = watcher(explain(parsed, "both"), "a")
    assert (w["status"], w["claimed"], w["owner"]) == ("unclaimed", False, None)
    assert w["classpath"] == "triggers.file.DirectoryFileDeleteTrigger"
    assert "no live triggerer" in w["problem"]
    start_job(parsed, jobs_sql.TRIGGERER_JOB, capacity=0)
    w = watcher(explain(parsed, "both"), "a")
    assert w["status"] == "unclaimed"
    assert w["problem"].startswith("is not claimed although 1 triggerer(s) are alive")
    assert "full" in w["problem"]


def test_a_watcher_held_by_a_dead_triggerer(parsed: Parsed) -> None:
    job = start_job(parsed, jobs_sql.TRIGGERER_JOB, capacity=10)
    own(parsed, "b-w", job)
    stale = models.utcnow() - timedelta(seconds=60)
    parsed.db.call(
        lambda s: s.execute(update(Job).where(Job.id == job).values(latest_heartbeat=stale))
    )
    emit(parsed, "a")
    view = explain(parsed, "both")
    w = watcher(view, "b")
    assert w["status"] == "owner_dead" and w["claimed"] and w["triggerer_id"] == job
    assert w["owner"]["alive"] is False and w["owner"]["heartbeat_age_s"] >= 60
    assert f"its watcher b-w is held by triggerer {job}" in view["verdict"]
    assert (
        "dead (last heartbeat" in view["verdict"]
        and "no live triggerer takes it over" in (view["verdict"])
    )


def test_a_watcher_with_a_recorded_error(parsed: Parsed) -> None:
    job = start_job(parsed, jobs_sql.TRIGGERER_JOB, capacity=10)
    tid = own(parsed, "b-w", job)
    error = "OSError(111, 'Connection refused')\nsecond line"
    parsed.db.call(lambda s: trigger_rows.record_trigger_failure(s, tid, error))
    emit(parsed, "a")
    view = explain(parsed, "both")
    w = watcher(view, "b")
    assert (w["status"], w["failures"], w["last_error"]) == ("failing", 1, error)
    assert w["owner"]["alive"] is True and w["last_failure_at"] is not None
    assert "its watcher b-w failed 1 time(s), last at " in view["verdict"]
    assert view["verdict"].endswith("OSError(111, 'Connection refused')")

    # An event of the watcher after its failure: it works again.
    later = models.utcnow() + timedelta(seconds=1)
    row = {"asset_id": _asset_id(parsed, "b"), "payload": None, "dedup_key": None}
    row |= {"source": "watcher", "source_watcher": "b-w", "timestamp": later}
    parsed.db.call(lambda s: assets_sql.insert_asset_events(s, [row]))
    beat = update(Job).where(Job.id == job).values(latest_heartbeat=later)
    parsed.db.call(lambda s: s.execute(beat))
    w = watcher(explain(parsed, "both", later + timedelta(milliseconds=1)), "b")
    assert w["status"] == "ok" and w["last_event_at"] == later.isoformat()

    load_error = f"{trigger_rows.LOAD_FAILURE_PREFIX} {tid}: no module named 'gone'"
    parsed.db.call(lambda s: trigger_rows.record_trigger_failure(s, tid, load_error))
    w = watcher(explain(parsed, "both"), "b")
    assert w["status"] == "load_failed" and w["load_failed"] is True


def _asset_id(parsed: Parsed, name: str) -> int:
    query = select(models.Asset.id).where(models.Asset.name == name)
    return int(parsed.db.call(lambda s: s.execute(query).scalar_one()))


@pytest.mark.both_databases
def test_the_lag_of_a_watchers_shared_stream_group(parsed: Parsed) -> None:
    job = start_job(parsed, jobs_sql.TRIGGERER_JOB, capacity=10)
    for name in ("a-w", "b-w"):
        own(parsed, name, job)
    query = select(Trigger.stream_digest).where(Trigger.id == trigger_id_of(parsed, "a-w"))
    digest = parsed.db.call(lambda s: s.execute(query).scalar_one())
    assert digest is not None  # the DAG processor wrote it: both share one directory scan
    lanes = {"p0": 3, "p1": 4}
    stats = [
        GroupStats(
            key="('k',)",
            broker="k",
            mode="ack",
            subscribers=2,
            outstanding_by_lane=lanes,
            oldest_unresolved_age_s=1.5,
            dead_lettered=2,
            digest=digest,
        )
    ]
    parsed.db.call(
        lambda s: streams_sql.publish_stream_stats(
            s, triggerer_id=job, stats=stats, now=models.utcnow()
        )
    )
    stream = watcher(explain(parsed, "both"), "a")["shared_stream"]
    assert (stream["digest"], stream["triggers"], stream["holders"]) == (digest, 2, [job])
    assert stream["split"] is False
    snap = stream["snapshot"]
    assert (snap["outstanding_events"], snap["oldest_unresolved_age_s"]) == (7, 1.5)
    assert snap["outstanding_by_lane"] == lanes and snap["subscribers"] == 2
    assert (snap["broker"], snap["dead_lettered"]) == ("k", 2)


async def test_a_real_triggerer_runs_the_watchers_and_their_events_count(
    parsed: Parsed, tmp_path: Path
) -> None:
    settings = TriggererSettings(
        capacity=10,
        heartbeat_s=0.2,
        health_check_threshold_s=THRESHOLD_S,
        claim_idle_interval_s=0.05,
        shutdown_grace_s=5,
    )
    triggerer = Triggerer(db=parsed.db, cipher=parsed.cipher, settings=settings)

    async def view_when(check: Any) -> Any:
        async def probe() -> Any:
            found = await anyio.to_thread.run_sync(explain, parsed, "both")
            return found if check(found) else None

        return await eventually(probe, within=30)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            view = await view_when(lambda v: _snapshot(v, "a") and _snapshot(v, "b"))
            for name in ("a", "b"):
                w = watcher(view, name)
                assert w["status"] == "ok" and w["owner"]["id"] == triggerer.job_id
                assert w["owner"]["alive"] is True
                assert w["shared_stream"]["triggers"] == 2
                assert w["shared_stream"]["snapshot"]["subscribers"] == 2
            assert "its watcher a-w runs on triggerer" in finding(view, "assets_missing")["message"]
            (tmp_path / "inbox" / "a.flag").touch()
            view = await view_when(lambda v: v["assets"][0]["queued"]["count"] == 1)
            assert view["assets"][0]["queued"]["sources"] == {"watcher": 1}
            assert watcher(view, "a")["last_event_at"] is not None
            assert view["schedule"]["assets"]["missing"] == "b"
            triggerer.shutdown()
    # Never the trigger's kwargs (its filename is only in them), nor their Fernet token.
    tokens = parsed.db.call(lambda s: list(s.execute(select(Trigger.kwargs)).scalars()))
    text = json.dumps(view)
    assert "a.flag" not in text and not any(token in text for token in tokens)


def _snapshot(view: dict[str, Any], asset: str) -> Any:
    stream = watcher(view, asset)["shared_stream"]
    return stream and stream["snapshot"]
