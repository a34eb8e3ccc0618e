"""The real triggerer (claim, run, persist) on SQLite and PostgreSQL, in-process."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import delete as sa_delete
from sqlalchemy import insert, select, update

from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.models import (
    Asset,
    AssetEvent,
    AssetWatcher,
    Dag,
    DagRun,
    Job,
    TaskInstance,
    Trigger,
)
from engine.db.queries import deferrals
from engine.db.queries import triggers as trigger_rows
from engine.states import TaskState, TriggerKind
from engine.triggerer import claiming
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from tests.waiting import eventually as db_eventually
from tests.waiting import wait_until
from triggers.serde import deserialize_value, loads
from triggers.testing import ManualTrigger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

pytestmark = pytest.mark.integration

PLUGIN = """
import sys

from triggers import BaseTrigger, TriggerEvent

IMPORTED = True


class RaisingTrigger(BaseTrigger):
    def serialize(self):
        return ("sluice_test_plugin.RaisingTrigger", {})

    async def run(self):
        raise RuntimeError("upstream exploded")
        yield


class EndingTrigger(BaseTrigger):
    # Ends its task on the triggerer (end_from_trigger), publishing results.

    def serialize(self):
        return ("sluice_test_plugin.EndingTrigger", {})

    async def run(self):
        from datetime import UTC, datetime

        from triggers import TaskSuccessEvent

        at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        yield TaskSuccessEvent(xcoms={"rows": 3, "at": at, "return_value": {"ok": True}})
"""

EVIL = "import pathlib\npathlib.Path(__file__).with_suffix('.imported').touch()\n"


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plugins")
    (folder / "sluice_test_plugin.py").write_text(PLUGIN)
    return folder


@pytest.fixture
def key() -> str:
    return Fernet.generate_key().decode()


@pytest.fixture
def db(migrated_db_url: str):
    database = Database(migrated_db_url)
    yield database
    database.dispose()


async def eventually(db: Database, query: Callable[[Any], Any], *, within: float = 10) -> Any:
    """Poll the database (off the loop) until ``query`` returns something truthy."""
    return await db_eventually(lambda: db.run(query), within=within)


def _deferred_task(
    db: Database,
    cipher: KwargsCipher,
    classpath: str,
    kwargs: dict[str, Any],
    *,
    timeout: datetime | None = None,
) -> tuple[int, int]:
    def seed(session: Any) -> tuple[int, int]:
        if session.get(Dag, "d") is None:
            session.execute(insert(Dag).values(dag_id="d", fileloc="d.py"))
        run_id = session.execute(
            insert(DagRun)
            .values(dag_id="d", run_id=f"r{models.utcnow().timestamp()}", run_type="manual")
            .returning(DagRun.id)
        ).scalar_one()
        tid = trigger_rows.add_trigger_row(
            session, cipher, classpath, kwargs, kind=TriggerKind.TASK
        )
        ti = session.execute(
            insert(TaskInstance)
            .values(
                dag_run_id=run_id,
                dag_id="d",
                task_id="t",
                state=TaskState.DEFERRED,
                trigger_id=tid,
                next_method="execute_complete",
                trigger_timeout=timeout,
            )
            .returning(TaskInstance.id)
        ).scalar_one()
        return tid, ti

    return db.call(seed)


def _ti(ti_id: int) -> Callable[[Any], TaskInstance | None]:
    return lambda s: s.get(TaskInstance, ti_id)


async def _running(
    db: Database, key: str, plugins: Path, **overrides: Any
) -> AsyncIterator[Triggerer]:
    defaults: dict[str, Any] = {
        "capacity": 100,
        "heartbeat_s": 0.5,
        "health_check_threshold_s": 1.05,
        "allowed_modules": ("triggers", "producers"),
        "plugins_folder": plugins,
        "claim_idle_interval_s": 0.05,
        "cleanup_interval_s": 0.2,
        "shutdown_grace_s": 5,
    }
    settings = TriggererSettings(**{**defaults, **overrides})
    triggerer = Triggerer(db=db, cipher=KwargsCipher(key), settings=settings)
    async with anyio.create_task_group() as tg:
        await tg.start(triggerer.run)
        yield triggerer
        triggerer.shutdown()


@pytest.fixture
def running(db: Database, key: str, plugins: Path):

    return asynccontextmanager(lambda **kw: _running(db, key, plugins, **kw))


@pytest.mark.both_databases
async def test_served_deferred_tasks_leave_nothing_behind_in_the_triggerer(
    db, key, running
) -> None:
    # Once its task resumed, a trigger is forgotten: no container of the triggerer grows by
    # one entry per served trigger (the persister takes each event's dedup key from the
    # event itself, so the triggerer keeps no instances for it).
    served = 12
    moment = datetime.now(UTC) - timedelta(seconds=1)
    cipher = KwargsCipher(key)
    ti_ids = [
        _deferred_task(db, cipher, "triggers.temporal.DateTimeTrigger", {"moment": moment})[1]
        for _ in range(served)
    ]

    def all_resumed(session: Any) -> bool:
        rows = session.execute(select(TaskInstance.state).where(TaskInstance.id.in_(ti_ids)))
        return all(state == "scheduled" for (state,) in rows)

    with anyio.fail_after(15):
        async with running() as triggerer:
            await eventually(db, all_resumed)
            await wait_until(lambda: len(triggerer.runner) == 0)
            sizes = {
                name: len(value)
                for name, value in vars(triggerer).items()
                if isinstance(value, dict | set | list)
            }
    assert {name: size for name, size in sizes.items() if size >= served} == {}


@pytest.mark.both_databases
async def test_deferred_task_resumes_with_the_event_payload(db, key, running) -> None:
    moment = datetime.now(UTC) - timedelta(seconds=1)
    trigger_id, ti_id = _deferred_task(
        db, KwargsCipher(key), "triggers.temporal.DateTimeTrigger", {"moment": moment}
    )
    with anyio.fail_after(15):
        async with running():
            ti = await eventually(
                db, lambda s: (t := _ti(ti_id)(s)) and t.state == "scheduled" and t
            )
    assert ti.next_method == "execute_complete"
    assert loads(ti.next_kwargs) == {"event": moment}
    assert ti.trigger_id is None
    assert db.call(lambda s: s.get(Trigger, trigger_id)) is None


async def test_end_from_trigger_xcoms_are_the_task_results(db, key, running) -> None:
    """TaskSuccessEvent(xcoms=...) ends the task with those results, stored as an executor
    stores a returned value (tagged JSON per key), so the same reader sees them."""
    trigger_id, ti_id = _deferred_task(
        db, KwargsCipher(key), "sluice_test_plugin.EndingTrigger", {}
    )
    with anyio.fail_after(15):
        async with running():
            ti = await eventually(db, lambda s: (t := _ti(ti_id)(s)) and t.state == "success" and t)
    assert ti.end_date is not None and ti.trigger_id is None
    results = {name: deserialize_value(value) for name, value in ti.xcoms.items()}
    assert results == {
        "rows": 3,
        "at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "return_value": {"ok": True},
    }
    assert db.call(lambda s: s.get(Trigger, trigger_id)) is None


async def test_raising_trigger_fails_its_task_with_reason_and_traceback(db, key, running) -> None:
    _, ti_id = _deferred_task(db, KwargsCipher(key), "sluice_test_plugin.RaisingTrigger", {})
    with anyio.fail_after(15):
        async with running():
            ti = await eventually(
                db, lambda s: (t := _ti(ti_id)(s)) and t.state == "scheduled" and t
            )
    assert ti.next_method == "__fail__"
    failure = loads(ti.next_kwargs)
    assert "upstream exploded" in failure["error"]
    assert "RuntimeError" in failure["traceback"]


async def test_classpath_outside_the_allowlist_is_refused_and_never_imported(
    db, key, running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "evil_module.py").write_text(EVIL)
    monkeypatch.syspath_prepend(str(tmp_path))
    _, ti_id = _deferred_task(db, KwargsCipher(key), "evil_module.Evil", {})
    with anyio.fail_after(15):
        async with running():
            ti = await eventually(
                db, lambda s: (t := _ti(ti_id)(s)) and t.state == "scheduled" and t
            )
    assert ti.next_method == "__fail__"
    assert "allowed_trigger_modules" in loads(ti.next_kwargs)["error"]
    assert not (tmp_path / "evil_module.imported").exists()


async def test_undecryptable_row_is_reported_by_id_and_others_run(db, key, running, caplog) -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    bad_trigger, bad_ti = _deferred_task(
        db,
        KwargsCipher(Fernet.generate_key().decode()),
        "triggers.temporal.DateTimeTrigger",
        {"moment": past},
    )
    _, good_ti = _deferred_task(
        db, KwargsCipher(key), "triggers.temporal.DateTimeTrigger", {"moment": past}
    )
    caplog.set_level(logging.ERROR, logger="engine")
    with anyio.fail_after(15):
        async with running():
            good = await eventually(
                db, lambda s: (t := _ti(good_ti)(s)) and t.state == "scheduled" and t
            )
            bad = await eventually(
                db, lambda s: (t := _ti(bad_ti)(s)) and t.state == "scheduled" and t
            )
    assert good.next_method == "execute_complete"
    assert bad.next_method == "__fail__"
    assert (
        f"trigger {bad_trigger}" in loads(bad.next_kwargs)["error"].lower()
        or str(bad_trigger) in loads(bad.next_kwargs)["error"]
    )
    assert any(getattr(r, "trigger_id", None) == bad_trigger for r in caplog.records)


async def test_deferral_past_its_timeout_fails_and_the_trigger_stops(db, key, running) -> None:
    far = datetime.now(UTC) + timedelta(days=1)
    trigger_id, ti_id = _deferred_task(
        db,
        KwargsCipher(key),
        "triggers.temporal.DateTimeTrigger",
        {"moment": far},
        timeout=datetime.now(UTC) + timedelta(seconds=0.5),
    )
    with anyio.fail_after(15):
        async with running() as triggerer:
            ti = await eventually(
                db, lambda s: (t := _ti(ti_id)(s)) and t.state == "scheduled" and t
            )
            assert loads(ti.next_kwargs) == {"error": "trigger timeout"}
            assert ti.next_method == "__fail__"
            await eventually(db, lambda s: s.get(Trigger, trigger_id) is None)
            await wait_until(lambda: trigger_id not in triggerer.runner, within=5)


def test_a_round_writes_its_preparation_only_when_there_is_some(db, key) -> None:
    # The read that spares most rounds a write transaction: nothing to clear, hand back or
    # time out -> no; a recovered row, a row to rehome, a deferral past its timeout -> yes.
    def needs(**kw: Any) -> bool:
        fields = {"recovered": set(), "rehome": {}, **kw}
        return db.call(lambda s: claiming.round_needs_prepare(s, **fields))

    cipher = KwargsCipher(key)
    later = datetime.now(UTC) + timedelta(days=1)
    _deferred_task(
        db, cipher, "triggers.temporal.DateTimeTrigger", {"moment": later}, timeout=later
    )
    assert not needs()
    assert needs(recovered={1})
    assert needs(rehome={1: "digest"})
    past = datetime.now(UTC) - timedelta(seconds=1)
    _, ti_id = _deferred_task(
        db, cipher, "triggers.temporal.DateTimeTrigger", {"moment": later}, timeout=past
    )
    assert needs()
    assert db.call(deferrals.fail_timed_out_deferrals) == [ti_id]
    assert not needs()


def _watcher(db: Database, cipher: KwargsCipher, name: str) -> tuple[int, int]:
    def seed(session: Any) -> tuple[int, int]:
        asset_id = session.execute(
            insert(Asset).values(name=name, uri=f"test://{name}", extra={}).returning(Asset.id)
        ).scalar_one()
        tid = trigger_rows.add_trigger_row(
            session,
            cipher,
            "triggers.testing.ManualTrigger",
            {"name": name},
            kind=TriggerKind.WATCHER,
        )
        session.execute(insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid))
        return asset_id, tid

    return db.call(seed)


@pytest.mark.both_databases
async def test_watcher_events_become_deduplicated_asset_events(db, key, running) -> None:
    ManualTrigger.reset()
    asset_id, _ = _watcher(db, KwargsCipher(key), "orders")
    channel = ManualTrigger.channel("orders")
    with anyio.fail_after(15):
        async with running() as triggerer:
            await channel.wait_subscribed()
            channel.fire({"status": "ok"})
            channel.fire({"status": "ok"})  # sent twice, meant twice: two asset events
            channel.fire({"n": 2}, dedup_key="custom-2")
            channel.fire({"n": 2}, dedup_key="custom-2")  # a redelivery: absorbed
            # all four fired events stored or skipped as duplicates
            await wait_until(lambda: triggerer.persister.stats.events >= 4)
            rows = await db.run(
                lambda s: (
                    s.execute(
                        select(AssetEvent)
                        .where(AssetEvent.asset_id == asset_id)
                        .order_by(AssetEvent.id)
                    )
                    .scalars()
                    .all()
                )
            )
    assert [(r.payload, r.dedup_key) for r in rows] == [
        ({"status": "ok"}, None),
        ({"status": "ok"}, None),
        ({"n": 2}, "custom-2"),
    ]
    assert all(r.source_watcher == "w" for r in rows)


@pytest.mark.both_databases
async def test_graceful_shutdown_releases_rows_and_ends_the_job(db, key, running) -> None:
    far = datetime.now(UTC) + timedelta(days=1)
    trigger_id, _ = _deferred_task(
        db, KwargsCipher(key), "triggers.temporal.DateTimeTrigger", {"moment": far}
    )
    with anyio.fail_after(15):
        async with running() as triggerer:
            await eventually(db, lambda s: (t := s.get(Trigger, trigger_id)) and t.triggerer_id)
            job_id = triggerer.job_id
    trigger = db.call(lambda s: s.get(Trigger, trigger_id))
    assert trigger.triggerer_id is None
    job = db.call(lambda s: s.get(Job, job_id))
    assert job.state == "success"
    assert job.end_date is not None


@pytest.mark.both_databases
async def test_deleted_row_stops_its_running_trigger(db, key, running) -> None:
    far = datetime.now(UTC) + timedelta(days=1)
    trigger_id, ti_id = _deferred_task(
        db, KwargsCipher(key), "triggers.temporal.DateTimeTrigger", {"moment": far}
    )
    with anyio.fail_after(15):
        async with running() as triggerer:
            await wait_until(lambda: trigger_id in triggerer.runner, within=5)
            await db.run(
                lambda s: s.execute(
                    update(TaskInstance).where(TaskInstance.id == ti_id).values(trigger_id=None)
                )
            )
            await db.run(lambda s: s.execute(sa_delete(Trigger).where(Trigger.id == trigger_id)))
            await wait_until(lambda: trigger_id not in triggerer.runner, within=5)


async def test_a_watcher_that_loads_again_forgets_its_load_failure(db, key, plugins: Path) -> None:
    ManualTrigger.reset()
    old_key = Fernet.generate_key().decode()
    _, trigger_id = _watcher(db, KwargsCipher(old_key), "rekeyed")
    last_error = lambda s: (t := s.get(Trigger, trigger_id)) and t.last_error  # noqa: E731
    with anyio.fail_after(20):
        # Started with the wrong key only: the watcher cannot load, and the row says why.
        async with asynccontextmanager(lambda: _running(db, key, plugins))():
            error = await eventually(db, last_error)
        assert error.startswith(trigger_rows.LOAD_FAILURE_PREFIX)
        # Restarted with the old key added (a rotation in progress): it runs, the error goes.
        async with asynccontextmanager(lambda: _running(db, f"{key},{old_key}", plugins))():
            await ManualTrigger.channel("rekeyed").wait_subscribed()
            await eventually(db, lambda s: s.get(Trigger, trigger_id).last_error is None)


async def test_lines_logged_in_a_trigger_carry_what_it_serves(db, key, running, caplog) -> None:
    from engine.logs import ContextFields

    ManualTrigger.reset()
    moment = datetime.now(UTC) - timedelta(seconds=1)
    trigger_id, _ = _deferred_task(
        db, KwargsCipher(key), "triggers.temporal.DateTimeTrigger", {"moment": moment}
    )
    _, watcher_trigger = _watcher(db, KwargsCipher(key), "logged")
    caplog.handler.addFilter(ContextFields())  # what configure_logging installs
    caplog.set_level(logging.DEBUG, logger="engine.triggerer.runtime")  # watcher events: DEBUG
    with anyio.fail_after(15):
        async with running():
            await ManualTrigger.channel("logged").wait_subscribed()
            ManualTrigger.channel("logged").fire({"n": 1})
            fired = lambda: {  # noqa: E731
                r.trigger_id: r
                for r in caplog.records
                if r.__dict__.get("action") == "trigger_fired"
            }
            records = await wait_until(
                lambda: (f := fired()) and {trigger_id, watcher_trigger} <= f.keys() and f
            )
    task_line, watcher_line = records[trigger_id], records[watcher_trigger]
    assert (task_line.dag_id, task_line.task_id) == ("d", "t")
    assert task_line.run_id.startswith("r")
    assert (watcher_line.asset, watcher_line.watcher) == ("logged", "w")
    assert not hasattr(watcher_line, "dag_id")


@pytest.mark.both_databases
async def test_a_row_added_by_another_process_is_claimed_before_the_next_full_round(
    db, key, running
) -> None:
    with anyio.fail_after(15):
        async with running(claim_idle_interval_s=60, new_trigger_poll_s=0.05) as triggerer:
            # No nudge: the row arrives as if another process had deferred a task.
            past = datetime.now(UTC) - timedelta(seconds=1)
            _, ti_id = _deferred_task(
                db, KwargsCipher(key), "triggers.temporal.DateTimeTrigger", {"moment": past}
            )
            with anyio.fail_after(5):  # far less than the 60 s full-round interval
                await eventually(
                    db, lambda s: (t := _ti(ti_id)(s)) and t.state == "scheduled" and t
                )
            assert triggerer.job_id is not None
