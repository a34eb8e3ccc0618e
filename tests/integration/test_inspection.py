"""Operator views on SQLite and PostgreSQL: snapshots the real triggerer publishes, the
job / trigger / DAG queries, and the doctor's findings on rows made by the real store."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import anyio.lowlevel
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import delete, insert, select, text, update

from engine import doctor
from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.models import (
    Asset,
    AssetWatcher,
    Dag,
    DagRun,
    DagScheduleAsset,
    DagTask,
    Job,
    SharedStreamSnapshot,
    TaskInstance,
    Trigger,
)
from engine.db.queries import dags, streams
from engine.db.queries import jobs as jobs_sql
from engine.db.queries import triggers as trigger_rows
from engine.states import TaskState, TriggerKind
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from engine.views import dags as dags_view
from engine.views import doctor as doctor_view
from engine.views import jobs as jobs_view
from engine.views import streams as streams_view
from engine.views import triggers as triggers_view
from shared_stream import GroupStats, SharedStreamManager
from shared_stream.stats import KEY_LABEL_MAX_CHARS, REPORTED_LANES
from shared_stream.testing import BlockingProducer, InMemoryProducer, SubscriberHarness
from tests.waiting import eventually
from triggers.base import BaseEventTrigger, TriggerEvent, classpath_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Hashable
    from pathlib import Path

pytestmark = pytest.mark.integration

THRESHOLD_S = 2.0
DIR_TRIGGER = "triggers.file.DirectoryFileDeleteTrigger"


@pytest.fixture
def db(migrated_db_url: str):
    database = Database(migrated_db_url)
    yield database
    database.dispose()


@pytest.fixture
def cipher() -> KwargsCipher:
    return KwargsCipher(Fernet.generate_key().decode())


def _watcher(session: Any, cipher: KwargsCipher, asset: str, kwargs: dict[str, Any]) -> int:
    asset_id = session.execute(
        insert(Asset).values(name=asset, uri=f"test://{asset}", extra={}).returning(Asset.id)
    ).scalar_one()
    tid = trigger_rows.add_trigger_row(
        session, cipher, DIR_TRIGGER, kwargs, kind=TriggerKind.WATCHER
    )
    session.execute(insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid))
    return int(tid)


def _deferred(session: Any, trigger_id: int | None, *, dag: str = "d", task: str = "t") -> None:
    if session.get(Dag, dag) is None:
        session.execute(insert(Dag).values(dag_id=dag, fileloc=f"/dags/{dag}.py"))
    run_pk = session.execute(
        insert(DagRun)
        .values(dag_id=dag, run_id=f"r-{task}", run_type="manual")
        .returning(DagRun.id)
    ).scalar_one()
    session.execute(
        insert(TaskInstance).values(
            dag_run_id=run_pk,
            dag_id=dag,
            task_id=task,
            state=TaskState.DEFERRED,
            trigger_id=trigger_id,
            next_method="resume",
        )
    )


def _task_trigger(session: Any, cipher: KwargsCipher, triggerer_id: int | None = None) -> int:
    tid = trigger_rows.add_trigger_row(
        session,
        cipher,
        "triggers.temporal.TimeDeltaTrigger",
        {"delta": timedelta(hours=1)},
        kind=TriggerKind.TASK,
    )
    if triggerer_id is not None:
        session.execute(update(Trigger).where(Trigger.id == tid).values(triggerer_id=triggerer_id))
    return int(tid)


def _stale(session: Any, job_id: int, age_s: float = 60) -> None:
    then = models.utcnow() - timedelta(seconds=age_s)
    session.execute(update(Job).where(Job.id == job_id).values(latest_heartbeat=then))


def _snapshots(db: Database) -> list[dict[str, Any]]:
    now = models.utcnow()
    return db.call(lambda s: streams_view.snapshot_page(s, threshold_s=THRESHOLD_S, now=now)[0])


def _facts(db: Database) -> dict[str, Any]:
    thresholds = {"triggerer": THRESHOLD_S}
    now = models.utcnow()
    return db.call(
        lambda s: doctor_view.doctor_facts(
            s, now=now, thresholds=thresholds, default_threshold_s=THRESHOLD_S
        )
    )


def _findings(db: Database) -> dict[str, list[doctor.Finding]]:
    by_check: dict[str, list[doctor.Finding]] = {}
    for finding in doctor.diagnose(_facts(db), claim_grace_s=THRESHOLD_S):
        by_check.setdefault(finding.check, []).append(finding)
    return by_check


def _triggerer(db: Database, cipher: KwargsCipher) -> Triggerer:
    settings = TriggererSettings(
        capacity=10,
        heartbeat_s=0.2,
        health_check_threshold_s=THRESHOLD_S,
        claim_idle_interval_s=0.05,
        shutdown_grace_s=5,
    )
    return Triggerer(db=db, cipher=cipher, settings=settings)


# --- the triggerer publishes its groups ------------------------------------------------


@pytest.mark.both_databases
async def test_triggerer_publishes_group_snapshots_and_removes_them(
    db: Database, cipher: KwargsCipher, tmp_path: Path
) -> None:
    inbox = str(tmp_path)
    ids = db.call(
        lambda s: [
            _watcher(s, cipher, f"a{i}", {"directory": inbox, "filename": f"f{i}"})
            for i in range(2)
        ]
    )
    triggerer = _triggerer(db, cipher)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            (row,) = await eventually(lambda: _live_rows(db, subscribers=2))
            assert row["triggerer_id"] == triggerer.job_id
            assert row["mode"] == "fast" and row["key"].startswith(f"('directory-scan', {inbox!r}")
            assert row["outstanding_by_lane"] == {} and row["oldest_unresolved_age_s"] is None
            assert row["events_polled"] >= 1 and row["snapshot_age_s"] < THRESHOLD_S
            # Its watchers go away: the group stops and its row goes with it.
            db.call(lambda s: s.execute(delete(Trigger).where(Trigger.id.in_(ids))))
            await eventually(lambda: _no_rows(db))
            db.call(lambda s: _watcher(s, cipher, "again", {"directory": inbox, "filename": "g"}))
            await eventually(lambda: _live_rows(db, subscribers=1))
            triggerer.shutdown()
    assert db.call(lambda s: s.query(SharedStreamSnapshot).count()) == 0


async def _live_rows(db: Database, *, subscribers: int) -> list[dict[str, Any]] | None:
    rows = await anyio.to_thread.run_sync(_snapshots, db)
    return rows if rows and rows[0]["subscribers"] == subscribers else None


async def _no_rows(db: Database) -> bool:
    return not await anyio.to_thread.run_sync(_snapshots, db)


async def test_publishing_survives_a_database_error_and_resumes(
    db: Database, cipher: KwargsCipher, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="engine.triggerer.triggerer")
    db.call(lambda s: _watcher(s, cipher, "a", {"directory": str(tmp_path), "filename": "f"}))
    triggerer = _triggerer(db, cipher)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await eventually(lambda: _live_rows(db, subscribers=1))
            db.call(lambda s: s.execute(text("DROP TABLE shared_stream_snapshot")))
            await eventually(lambda: _warned(caplog))
            assert len(triggerer.runner) == 1  # the triggerer runs on
            SharedStreamSnapshot.__table__.create(db.engine)  # type: ignore[attr-defined]
            await eventually(lambda: _live_rows(db, subscribers=1))
            triggerer.shutdown()


async def _warned(caplog: pytest.LogCaptureFixture) -> bool:
    await anyio.lowlevel.checkpoint()
    return any(getattr(r, "action", None) == "stream_stats_publish_failed" for r in caplog.records)


def test_snapshots_of_dead_triggerers_are_not_listed(db: Database) -> None:
    def seed(session: Any) -> tuple[int, int]:
        live = jobs_sql.start_job(session, job_type="triggerer", capacity=5)
        dead = jobs_sql.start_job(session, job_type="triggerer", capacity=5)
        stats = [GroupStats(key="('k',)", mode="ack", subscribers=2, outstanding_by_lane={"0": 3})]
        for job in (live, dead):
            streams.publish_stream_stats(
                session, triggerer_id=job, stats=stats, now=models.utcnow()
            )
        _stale(session, dead)
        return live, dead

    live, _dead = db.call(seed)
    (row,) = _snapshots(db)
    assert (row["triggerer_id"], row["mode"], row["outstanding_by_lane"]) == (live, "ack", {"0": 3})
    long_key = "x" * 5000
    db.call(
        lambda s: streams.publish_stream_stats(
            s,
            triggerer_id=live,
            stats=[GroupStats(key=long_key, mode="fast", subscribers=1)],
            now=models.utcnow(),
        )
    )
    (row,) = _snapshots(db)
    assert len(row["key"]) <= KEY_LABEL_MAX_CHARS and row["key"].startswith("xxx")


# --- jobs, triggers, DAG details ----------------------------------------------------------


@pytest.mark.both_databases
def test_jobs_list_shows_liveness_and_load(db: Database, cipher: KwargsCipher) -> None:
    def seed(session: Any) -> tuple[int, int, int]:
        trig = jobs_sql.start_job(session, job_type="triggerer", capacity=4)
        dead = jobs_sql.start_job(session, job_type="triggerer", capacity=4)
        sched = jobs_sql.start_job(session, job_type="scheduler")
        _stale(session, dead)
        for _ in range(3):
            _task_trigger(session, cipher, trig)
        return trig, dead, sched

    trig, dead, sched = db.call(seed)
    now = models.utcnow()
    rows = db.call(
        lambda s: jobs_view.all_jobs(
            s, now=now, thresholds={"triggerer": THRESHOLD_S}, default_threshold_s=THRESHOLD_S
        )
    )
    by_id = {r["id"]: r for r in rows}
    assert (by_id[trig]["alive"], by_id[trig]["load"], by_id[trig]["capacity"]) == (True, 3, 4)
    assert by_id[dead]["alive"] is False and by_id[dead]["heartbeat_age_s"] >= 59
    assert (by_id[sched]["type"], by_id[sched]["load"], by_id[sched]["alive"]) == (
        "scheduler",
        None,
        True,
    )
    assert by_id[trig]["pid"] and by_id[trig]["hostname"]


def test_triggers_list_says_what_each_trigger_serves(db: Database, cipher: KwargsCipher) -> None:
    def seed(session: Any) -> tuple[int, int, int]:
        dead = jobs_sql.start_job(session, job_type="triggerer", capacity=4)
        _stale(session, dead)
        task_trigger = _task_trigger(session, cipher, dead)
        _deferred(session, task_trigger, dag="dd", task="wait")
        watcher = _watcher(session, cipher, "orders", {"directory": "/x", "filename": "y"})
        trigger_rows.record_trigger_failure(
            session, watcher, "cannot load trigger: no module named q"
        )
        return dead, task_trigger, watcher

    dead, task_trigger, watcher = db.call(seed)
    now = models.utcnow()
    rows = db.call(lambda s: triggers_view.all_triggers(s, now=now, threshold_s=THRESHOLD_S))
    by_id = {r["id"]: r for r in rows}
    assert by_id[task_trigger]["serves"] == "task dd/r-wait/wait"
    assert (by_id[task_trigger]["triggerer_id"], by_id[task_trigger]["owner_alive"]) == (
        dead,
        False,
    )
    assert by_id[task_trigger]["load_failed"] is False
    assert by_id[watcher]["serves"] == "watcher orders/w"
    assert by_id[watcher]["owner_alive"] is None and by_id[watcher]["load_failed"] is True


def test_dag_details(db: Database, cipher: KwargsCipher) -> None:
    def seed(session: Any) -> None:
        session.execute(
            insert(Dag).values(
                dag_id="flow", fileloc="/dags/flow.py", schedule={"asset": "orders"}, is_paused=True
            )
        )
        _watcher(session, cipher, "orders", {"directory": "/x", "filename": "y"})
        asset_id = session.query(Asset.id).filter(Asset.name == "orders").scalar()
        session.execute(insert(DagScheduleAsset).values(dag_id="flow", asset_id=asset_id))
        session.execute(
            insert(DagTask).values(dag_id="flow", task_id="report", operator="PythonOperator")
        )
        session.execute(insert(DagRun).values(dag_id="flow", run_id="r1", run_type="manual"))

    db.call(seed)
    details = db.call(lambda s: dags_view.show_dag(s, "flow"))
    assert details["fileloc"] == "/dags/flow.py" and details["paused"] is True
    assert details["schedule"] == {"asset": "orders"} and details["assets"] == ["orders"]
    assert [t["task_id"] for t in details["tasks"]] == ["report"]
    assert [(w["asset"], w["name"]) for w in details["watchers"]] == [("orders", "w")]
    assert [r["run_id"] for r in details["last_runs"]] == ["r1"]
    assert db.call(lambda s: dags_view.show_dag(s, "nope")) is None


# --- the doctor ------------------------------------------------------------------------------


def _healthy_parts(session: Any, *, capacity: int = 10) -> int:
    trig = jobs_sql.start_job(session, job_type="triggerer", capacity=capacity)
    jobs_sql.start_job(session, job_type="scheduler")
    jobs_sql.start_job(session, job_type="executor", capacity=2)
    jobs_sql.start_job(session, job_type=jobs_sql.DAG_PROCESSOR_JOB)
    return trig


def test_doctor_finds_nothing_on_a_healthy_engine(db: Database, cipher: KwargsCipher) -> None:
    def seed(session: Any) -> None:
        trig = _healthy_parts(session)
        _deferred(session, _task_trigger(session, cipher, trig))

    db.call(seed)
    assert _findings(db) == {}


def test_doctor_with_nothing_running_names_each_missing_part(db: Database) -> None:
    found = _findings(db)
    assert set(found) == {"live_triggerer", "live_scheduler", "live_executor", "live_dag_processor"}
    assert found.pop("live_dag_processor")[0].severity == doctor.WARNING  # runs go on without
    assert all(f.severity == "error" for fs in found.values() for f in fs)


@pytest.mark.both_databases
def test_doctor_deferred_task_whose_triggerer_died(db: Database, cipher: KwargsCipher) -> None:
    def seed(session: Any) -> int:
        dead = jobs_sql.start_job(session, job_type="triggerer", capacity=10)
        jobs_sql.start_job(session, job_type="scheduler")
        jobs_sql.start_job(session, job_type="executor", capacity=2)
        _stale(session, dead)
        _deferred(session, _task_trigger(session, cipher, dead), dag="d", task="wait")
        return dead

    dead = db.call(seed)
    found = _findings(db)
    (owner,) = found["trigger_owner_dead"]
    assert owner.severity == "error"
    assert "task d/r-wait/wait" in owner.problem and f"triggerer {dead}" in owner.problem
    assert "start a triggerer" in owner.action
    assert "live_triggerer" in found and "dead_job" in found
    # A live triggerer with spare capacity appears: it will take the trigger over.
    db.call(lambda s: jobs_sql.start_job(s, job_type="triggerer", capacity=10))
    (owner,) = _findings(db)["trigger_owner_dead"]
    assert owner.severity == "warning"


def test_doctor_missing_trigger_timeout_and_capacity(db: Database, cipher: KwargsCipher) -> None:
    def seed(session: Any) -> None:
        trig = _healthy_parts(session, capacity=1)
        _task_trigger(session, cipher, trig)  # fills the only slot
        _deferred(session, _task_trigger(session, cipher), task="waiting")  # unassigned
        gone = _task_trigger(session, cipher, trig)
        _deferred(session, gone, task="orphan")
        session.execute(delete(Trigger).where(Trigger.id == gone))
        _deferred(session, _task_trigger(session, cipher, trig), task="late")
        past = models.utcnow() - timedelta(minutes=5)
        session.execute(
            update(TaskInstance).where(TaskInstance.task_id == "late").values(trigger_timeout=past)
        )

    db.call(seed)
    found = _findings(db)
    (missing,) = found["trigger_missing"]
    assert "task d/r-orphan/orphan" in missing.problem and missing.severity == "error"
    (late,) = found["deferral_timeout"]
    assert "task d/r-late/late" in late.problem and late.severity == "error"
    (unassigned,) = found["trigger_unassigned"]
    assert "task d/r-waiting/waiting" in unassigned.problem
    assert "[triggerer] capacity" in unassigned.action
    (capacity,) = found["triggerer_capacity"]
    assert "capacity exhausted" in capacity.problem


def test_doctor_reports_parse_errors_and_unloadable_watchers(
    db: Database, cipher: KwargsCipher
) -> None:
    def seed(session: Any) -> None:
        _healthy_parts(session)
        row = {"fileloc": "/dags/bad.py", "error": "SyntaxError: invalid syntax", "lineno": 3}
        dags.replace_parse_errors(session, [], [{**row, "timestamp": models.utcnow()}])
        tid = _watcher(session, cipher, "orders", {"directory": "/x", "filename": "y"})
        trigger_rows.record_trigger_failure(
            session, tid, "cannot load trigger: module q not allowed"
        )

    db.call(seed)
    found = _findings(db)
    (parse,) = found["dag_parse_error"]
    assert "/dags/bad.py:3" in parse.problem and "SyntaxError" in parse.problem
    (watcher,) = found["watcher_load_failed"]
    assert "'orders'" in watcher.problem and "module q not allowed" in watcher.problem
    assert doctor.has_errors([parse])


def test_doctor_reports_watchers_that_keep_failing(db: Database, cipher: KwargsCipher) -> None:
    def seed(session: Any) -> tuple[int, int]:
        _healthy_parts(session)
        failing = _watcher(session, cipher, "orders", {"directory": "/x", "filename": "y"})
        for _ in range(3):
            trigger_rows.record_trigger_failure(session, failing, "BrokerUnavailable('kafka down')")
        recovered = _watcher(session, cipher, "invoices", {"directory": "/x", "filename": "z"})
        trigger_rows.record_trigger_failure(session, recovered, "BrokerUnavailable('sqs down')")
        long_ago = models.utcnow() - timedelta(seconds=doctor_view.FAILING_WATCHER_WINDOW_S + 1)
        session.execute(
            update(Trigger).where(Trigger.id == recovered).values(last_failure_date=long_ago)
        )
        return failing, recovered

    failing, recovered = db.call(seed)
    found = _findings(db)
    (watcher,) = found.pop("watcher_failing")  # the one that failed long ago is not reported
    assert watcher.severity == doctor.WARNING and not doctor.has_errors([watcher])
    assert f"'orders' (trigger {failing})" in watcher.problem
    assert "3 failure(s)" in watcher.problem and "kafka down" in watcher.problem
    assert found == {}
    now = models.utcnow()
    rows = {
        r["id"]: r for r in db.call(lambda s: triggers_view.all_triggers(s, now=now, threshold_s=9))
    }
    assert rows[failing]["failures"] == 3 and rows[failing]["last_failure_age_s"] < 60
    assert rows[recovered]["last_failure_age_s"] > doctor_view.FAILING_WATCHER_WINDOW_S


# --- shared-stream snapshots: one row per key, bounded lanes, crashed triggerers ---------


class _ReplacedWatcher(BaseEventTrigger):
    """Ack mode; each new group of its key takes the next producer (a restarted watcher)."""

    producers: ClassVar[list[InMemoryProducer]] = []

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath_of(self), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({})

    def shared_stream_key(self) -> Hashable:
        return ("replaced",)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> InMemoryProducer:
        return cls.producers.pop(0)

    async def filter_shared_stream(self, shared_stream: Any) -> AsyncIterator[TriggerEvent]:
        async for raw in shared_stream:
            yield TriggerEvent(raw)


async def test_a_group_draining_next_to_its_replacement_is_published_as_one_row(
    db: Database,
) -> None:
    """The old group of a key still drains (its advance is blocked) when the new one starts:
    the two must not be two rows (primary key (triggerer_id, stream_key))."""
    old, new = BlockingProducer(), InMemoryProducer()
    _ReplacedWatcher.producers[:] = [old, new]
    job = db.call(lambda s: jobs_sql.start_job(s, job_type="triggerer", capacity=5))
    with anyio.fail_after(10):
        async with SharedStreamManager() as mgr, anyio.create_task_group() as tg:
            first = SubscriberHarness(mgr, _ReplacedWatcher(), trigger_id=1)
            first.unsubscribe_on_exit = False
            tg.start_soon(first.run)
            await old.put({"n": 1}, "old-1")
            await old.wait_blocked()
            tg.start_soon(mgr.unsubscribe, 1, first.key)  # the old group drains
            await first.wait_finished()
            second = SubscriberHarness(mgr, _ReplacedWatcher(), trigger_id=2)
            tg.start_soon(second.run)
            await new.put({"n": 2}, "new-1")
            await new.wait_for_advanced(1)
            stats = mgr.stats()
            now = models.utcnow()
            db.call(
                lambda s: streams.publish_stream_stats(s, triggerer_id=job, stats=stats, now=now)
            )
            old.release_all()
            tg.cancel_scope.cancel()
    (row,) = _snapshots(db)
    assert (row["key"], row["subscribers"], row["events_polled"]) == ("('replaced',)", 1, 2)
    assert row["outstanding_by_lane"] == {"None": 1}  # the old group's event, in flight


def test_the_snapshot_names_the_busiest_lanes_and_sums_the_others(db: Database) -> None:
    lanes = {repr(f"group-{n:04}"): n for n in range(1, 501)}  # SQS FIFO message groups
    stats = [GroupStats(key="('sqs',)", mode="ack", subscribers=1, outstanding_by_lane=lanes)]
    job = db.call(lambda s: jobs_sql.start_job(s, job_type="triggerer", capacity=5))
    db.call(
        lambda s: streams.publish_stream_stats(
            s, triggerer_id=job, stats=stats, now=models.utcnow()
        )
    )
    (row,) = _snapshots(db)
    column = row["outstanding_by_lane"]
    busiest = {repr(f"group-{n:04}"): n for n in range(501 - REPORTED_LANES, 501)}
    others = 500 - REPORTED_LANES
    assert column == {**busiest, f"({others} other lanes)": sum(range(1, 501 - REPORTED_LANES))}
    assert sum(column.values()) == sum(lanes.values())


def _seed_snapshot_owners(session: Any) -> dict[str, int]:
    """Triggerers with one snapshot row each: live, crashed (stale), ended (not running)."""
    jobs = {
        name: jobs_sql.start_job(session, job_type="triggerer", capacity=5)
        for name in ("live", "stale", "ended")
    }
    stats = [GroupStats(key="('k',)", mode="fast", subscribers=1)]
    for job in jobs.values():
        streams.publish_stream_stats(session, triggerer_id=job, stats=stats, now=models.utcnow())
    _stale(session, jobs["stale"])
    session.execute(update(Job).where(Job.id == jobs["ended"]).values(state="failed"))
    return jobs


def _snapshot_owners(session: Any) -> set[int]:
    return set(session.execute(select(SharedStreamSnapshot.triggerer_id)).scalars())


def test_snapshots_of_triggerers_that_are_not_alive_are_deleted(db: Database) -> None:
    jobs = db.call(_seed_snapshot_owners)
    assert {r["triggerer_id"] for r in _snapshots(db)} == {jobs["live"]}  # listed: live only
    now = models.utcnow()
    deleted = db.call(
        lambda s: streams.delete_dead_stream_snapshots(s, threshold_s=THRESHOLD_S, now=now)
    )
    assert deleted == 2
    assert db.call(_snapshot_owners) == {jobs["live"]}
    later = now + timedelta(seconds=THRESHOLD_S)  # the live one's heartbeat is as old
    assert (
        db.call(
            lambda s: streams.delete_dead_stream_snapshots(s, threshold_s=THRESHOLD_S, now=later)
        )
        == 1
    )
    assert db.call(_snapshot_owners) == set()


async def test_the_triggerer_clean_up_deletes_snapshots_of_crashed_triggerers(
    db: Database, cipher: KwargsCipher
) -> None:
    jobs = db.call(_seed_snapshot_owners)
    settings = TriggererSettings(
        capacity=10,
        heartbeat_s=0.2,
        health_check_threshold_s=THRESHOLD_S,
        claim_idle_interval_s=0.05,
        shutdown_grace_s=5,
        cleanup_interval_s=0.1,
    )
    triggerer = Triggerer(db=db, cipher=cipher, settings=settings)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)

            async def only_live_rows_left() -> bool:
                owners = await anyio.to_thread.run_sync(db.call, _snapshot_owners)
                return owners == {jobs["live"]}

            await eventually(only_live_rows_left)
            triggerer.shutdown()
