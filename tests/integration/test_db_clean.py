"""``db clean`` on SQLite and PostgreSQL: seeded rows, exactly what is kept and what goes.

Times are relative to one ``NOW``: rows are older than ``--before`` (1 day ago) or not,
asset events older than the dedup window (7 days) or not, jobs dead for longer than the
liveness threshold (60 s) or not. Each boundary has a row on each side of it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import func, insert, select

from engine.cli import db_clean
from engine.db import models
from engine.db.database import Database
from engine.db.models import (
    Asset,
    AssetEvent,
    AssetEventQueue,
    AssetWatcher,
    Dag,
    DagRun,
    DagRunAssetEvent,
    Job,
    SharedStreamSnapshot,
    TaskInstance,
    Trigger,
)
from engine.db.queries import assets
from engine.db.queries.clean import TABLES

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime

    from sqlalchemy.orm import Session

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]

NOW = models.utcnow()
BEFORE = NOW - timedelta(days=1)
RETENTION = timedelta(days=7)
OLD = NOW - timedelta(days=30)  # past every cut-off
MIDDLE = NOW - timedelta(days=3)  # older than --before, inside the dedup window
RECENT = NOW - timedelta(hours=1)  # younger than --before
DEAD_AFTER_S = 60.0


@pytest.fixture
def database(migrated_db_url: str) -> Iterator[Database]:
    db = Database(migrated_db_url)
    db.call(_base_rows)
    yield db
    db.dispose()


def _plan(tables: tuple[str, ...] = TABLES, *, before: datetime = BEFORE) -> Any:
    return db_clean.make_plan(
        tables,
        before=before,
        now=NOW,
        dedup_retention_s=RETENTION.total_seconds(),
        dead_after_s=DEAD_AFTER_S,
    )


def _base_rows(s: Session) -> None:
    s.add(Dag(dag_id="d", fileloc="/dags/d.py"))
    s.add(Asset(id=1, name="a", uri="a"))
    s.flush()


def _add(s: Session, model: type[Any], **values: Any) -> int:
    return int(s.execute(insert(model).values(**values).returning(model.id)).scalar_one())


def _event(s: Session, key: str | None, at: datetime) -> int:
    return _add(s, AssetEvent, asset_id=1, payload={}, dedup_key=key, timestamp=at)


def _run(s: Session, name: str, state: str, ended: datetime | None, *tasks: str) -> int:
    run = _add(
        s,
        DagRun,
        dag_id="d",
        run_id=name,
        run_type="asset",
        state=state,
        queued_at=OLD,
        end_date=ended,
    )
    for number, task_state in enumerate(tasks):
        s.add(TaskInstance(dag_run_id=run, dag_id="d", task_id=f"t{number}", state=task_state))
    s.flush()
    return run


def _ids(db: Database, column: Any) -> set[Any]:
    return set(db.call(lambda s: s.execute(select(column)).scalars().all()))


def _count(db: Database, model: type[Any]) -> int:
    return int(db.call(lambda s: s.execute(select(func.count()).select_from(model)).scalar_one()))


# --- asset events -----------------------------------------------------------------------------


def _seed_events(s: Session) -> dict[str, int]:
    ids = {
        "old": _event(s, "old", OLD),
        "in_window": _event(s, "in-window", MIDDLE),
        "at_window_edge": _event(s, "edge", NOW - RETENTION),
        "recent": _event(s, "recent", RECENT),
        "queued": _event(s, "queued", OLD),
        "of_running_run": _event(s, "running", OLD),
        "of_finished_run": _event(s, "finished", OLD),
    }
    s.add(AssetEventQueue(dag_id="d", asset_event_id=ids["queued"]))
    running = _run(s, "running", "running", None, "running")
    finished = _run(s, "finished", "success", RECENT, "success")
    s.add(DagRunAssetEvent(dag_run_id=running, asset_event_id=ids["of_running_run"]))
    s.add(DagRunAssetEvent(dag_run_id=finished, asset_event_id=ids["of_finished_run"]))
    return ids


def test_asset_events_outside_the_window_and_unused_go(database: Database) -> None:
    ids = database.call(_seed_events)
    plan = _plan(("asset_event",))
    assert db_clean.count(database, plan) == {"asset_event": 2}

    assert db_clean.clean(database, plan) == {"asset_event": 2}

    gone = {ids["old"], ids["of_finished_run"]}
    assert _ids(database, AssetEvent.id) == set(ids.values()) - gone
    # The finished run stays (it is recent); only its link to the deleted event went.
    assert _ids(database, DagRunAssetEvent.asset_event_id) == {ids["of_running_run"]}
    assert _ids(database, AssetEventQueue.asset_event_id) == {ids["queued"]}


def test_an_event_queued_only_for_a_retired_dag_goes(database: Database) -> None:
    """A DAG no longer in any file never consumes its queue: it must not pin events forever.
    A paused DAG (still active) keeps them."""

    def seed(s: Session) -> dict[str, int]:
        s.add(Dag(dag_id="retired", fileloc="/dags/gone.py", is_active=False))
        s.add(Dag(dag_id="paused", fileloc="/dags/p.py", is_paused=True))
        s.flush()
        ids = {"retired": _event(s, "r", OLD), "paused": _event(s, "p", OLD)}
        s.add(AssetEventQueue(dag_id="retired", asset_event_id=ids["retired"]))
        s.add(AssetEventQueue(dag_id="paused", asset_event_id=ids["paused"]))
        return ids

    ids = database.call(seed)
    assert db_clean.clean(database, _plan(("asset_event",))) == {"asset_event": 1}
    assert _ids(database, AssetEvent.id) == {ids["paused"]}
    assert _ids(database, AssetEventQueue.dag_id) == {"paused"}


def test_a_redelivery_is_absorbed_while_its_key_is_kept(database: Database) -> None:
    database.call(_seed_events)
    db_clean.clean(database, _plan(("asset_event",)))

    def redeliver(key: str) -> list[tuple[int, int]]:
        row = {"asset_id": 1, "payload": {}, "dedup_key": key, "timestamp": NOW}
        return database.call(lambda s: assets.insert_asset_events(s, [row]))

    assert redeliver("in-window") == []  # inside the window: still a duplicate
    assert redeliver("edge") == []
    assert len(redeliver("old")) == 1  # its key was cleaned: a new event


def test_zero_retention_lets_before_alone_decide(database: Database) -> None:
    ids = database.call(_seed_events)
    plan = db_clean.make_plan(
        ("asset_event",), before=BEFORE, now=NOW, dedup_retention_s=0, dead_after_s=60
    )
    db_clean.clean(database, plan)
    kept = {ids["recent"], ids["queued"], ids["of_running_run"]}
    assert _ids(database, AssetEvent.id) == kept


def test_an_event_without_dedup_key_goes_by_before_alone(database: Database) -> None:
    # Nothing to recognise a redelivery by (migration 0008 makes the key nullable): the
    # dedup window does not apply.
    keyless, keyed = database.call(lambda s: (_event(s, None, MIDDLE), _event(s, "k", MIDDLE)))
    assert db_clean.clean(database, _plan(("asset_event",))) == {"asset_event": 1}
    assert _ids(database, AssetEvent.id) == {keyed} != {keyless}


def test_an_event_stored_exactly_at_before_is_kept(database: Database) -> None:
    older = OLD - timedelta(microseconds=1)
    at, _ = database.call(lambda s: (_event(s, "at", OLD), _event(s, "older", older)))
    assert db_clean.clean(database, _plan(("asset_event",), before=OLD)) == {"asset_event": 1}
    assert _ids(database, AssetEvent.id) == {at}


# --- DAG runs and their task instances --------------------------------------------------------


def test_finished_runs_go_with_their_tasks_unfinished_ones_stay(database: Database) -> None:
    runs = database.call(
        lambda s: {
            "success": _run(s, "ok", "success", OLD, "success", "skipped"),
            "failed": _run(s, "ko", "failed", None, "failed", "upstream_failed"),
            "running": _run(s, "run", "running", None, "success", "running"),
            "queued": _run(s, "q", "queued", None, "none"),
            "recent": _run(s, "new", "success", RECENT, "success"),
            "deferred_task": _run(s, "odd", "failed", OLD, "failed", "deferred"),
        }
    )
    plan = _plan(("dag_run",))
    assert db_clean.count(database, plan) == {"dag_run": 2, "task_instance": 4}

    assert db_clean.clean(database, plan) == {"dag_run": 2, "task_instance": 4}

    assert _ids(database, DagRun.id) == set(runs.values()) - {runs["success"], runs["failed"]}
    assert _ids(database, TaskInstance.dag_run_id) == _ids(database, DagRun.id)


# --- triggers, jobs, snapshots ----------------------------------------------------------------


def _trigger(s: Session, created: datetime, owner: int | None = None) -> int:
    return _add(s, Trigger, classpath="x.Y", kwargs="", created_date=created, triggerer_id=owner)


def _seed_triggers(s: Session) -> dict[str, int]:
    ids = {
        "unused": _trigger(s, OLD),
        "recent": _trigger(s, RECENT),
        "deferred": _trigger(s, OLD),
        "watched": _trigger(s, OLD),
    }
    run = _run(s, "deferring", "running", None)
    s.add(
        TaskInstance(
            dag_run_id=run, dag_id="d", task_id="t", state="deferred", trigger_id=ids["deferred"]
        )
    )
    # A finished task that kept its trigger id holds nothing: that trigger may go.
    s.add(
        TaskInstance(
            dag_run_id=run, dag_id="d", task_id="u", state="success", trigger_id=ids["unused"]
        )
    )
    s.add(AssetWatcher(asset_id=1, name="w", trigger_id=ids["watched"]))
    return ids


def test_only_unused_old_triggers_go(database: Database) -> None:
    ids = database.call(_seed_triggers)
    assert db_clean.clean(database, _plan(("trigger",))) == {"trigger": 1}
    assert _ids(database, Trigger.id) == set(ids.values()) - {ids["unused"]}


def _job(s: Session, state: str, beat: datetime, ended: datetime | None = None) -> int:
    return _add(
        s,
        Job,
        job_type="triggerer",
        state=state,
        start_date=OLD,
        latest_heartbeat=beat,
        end_date=ended,
    )


def _seed_jobs(s: Session) -> dict[str, int]:
    ids = {
        "ended": _job(s, "success", OLD, OLD),
        "failed_no_end": _job(s, "failed", OLD),
        "ended_after_before": _job(s, "success", OLD, NOW - timedelta(seconds=1)),
        "alive": _job(s, "running", NOW),
        "dead": _job(s, "running", OLD),
        "dead_owning_trigger": _job(s, "running", OLD),
        "ended_holding_task": _job(s, "success", OLD, OLD),
        "silent_since_before": _job(s, "running", NOW - timedelta(seconds=30)),
    }
    _trigger(s, RECENT, owner=ids["dead_owning_trigger"])
    run = _run(s, "executing", "running", None)
    holder = ids["ended_holding_task"]
    s.add(
        TaskInstance(
            dag_run_id=run, dag_id="d", task_id="t", state="running", executor_job_id=holder
        )
    )
    for owner in (ids["dead"], ids["alive"]):
        s.add(SharedStreamSnapshot(triggerer_id=owner, stream_key="k", mode="ack", updated_at=OLD))
    return ids


def test_only_dead_jobs_that_own_nothing_go(database: Database) -> None:
    ids = database.call(_seed_jobs)
    # --before 10 s ago: a job marked running goes only once its heartbeat is DEAD_AFTER_S old.
    plan = _plan(("job",), before=NOW - timedelta(seconds=10))
    assert db_clean.clean(database, plan) == {"job": 3}
    gone = {ids["ended"], ids["failed_no_end"], ids["dead"]}
    assert _ids(database, Job.id) == set(ids.values()) - gone
    assert _ids(database, SharedStreamSnapshot.triggerer_id) == {ids["alive"]}  # cascade


def test_snapshots_of_dead_triggerers_go_live_ones_stay(database: Database) -> None:
    ids = database.call(_seed_jobs)
    assert db_clean.clean(database, _plan(("shared_stream_snapshot",))) == {
        "shared_stream_snapshot": 1
    }
    assert _ids(database, SharedStreamSnapshot.triggerer_id) == {ids["alive"]}
    assert _count(database, Job) == len(ids)


# --- all tables, batches, dry run -------------------------------------------------------------


def test_dry_run_counts_what_a_clean_then_deletes(database: Database) -> None:
    database.call(lambda s: (_seed_events(s), _seed_triggers(s), _seed_jobs(s)))
    plan = _plan(before=NOW)
    counts = db_clean.count(database, plan)
    assert db_clean.count(database, plan) == counts  # counting deletes nothing
    deleted = db_clean.clean(database, plan)
    # Each table is counted as it is now; cleaning the triggers first frees one more job
    # (the dead one that owned only an unused trigger).
    assert deleted == {**counts, "job": counts["job"] + 1}
    assert sum(db_clean.count(database, plan).values()) == 0


def test_deletes_in_batches_with_a_pause_between(database: Database) -> None:
    database.call(lambda s: [_event(s, f"k{n}", OLD) for n in range(25)])
    pauses: list[float] = []
    deleted = db_clean.clean(
        database, _plan(("asset_event",)), batch_size=10, pause_s=0.5, sleep=pauses.append
    )
    assert deleted == {"asset_event": 25}
    assert pauses == [0.5, 0.5]  # batches of 10, 10, 5
    assert _count(database, AssetEvent) == 0
