"""The task and asset state stores (Airflow 3.3's AIP-103) and ``ResumableJobMixin`` with
the real scheduler and executor in-process: what a try stores its retry reads, across a
killed worker too; ``delete`` and ``clear``; entries scoped to one task instance (another
copy of a mapped task, another run, sees nothing); an asset's entries across runs; a
resumable operator whose first try dies after its submit reconnects on retry (one submit);
``sluice db clean`` deletes expired entries, never ``NEVER_EXPIRE`` ones (a fake clock)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from click.testing import CliRunner
from cryptography.fernet import Fernet
from sqlalchemy import select

from engine.cli import db_clean
from engine.cli.main import cli
from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.models import TaskStateEntry
from engine.db.queries import state_store
from engine.executor.state_requests import StateStoreRequests
from engine.executor.task_requests import TaskRequestServer
from tests.integration.api_support import api_harness, bearer
from tests.integration.inprocess_engine import InProcessEngine

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.integration

DAGS = """
import os
import signal
from datetime import timedelta
from pathlib import Path

from engine import DAG, NEVER_EXPIRE, Asset, BaseOperator, ResumableJobMixin, task

JOBS = Path(JOBS_FOLDER)
ORDERS = Asset("orders")


@task(retries=1, retry_delay=0)
def remember(task_state_store=None, ti=None):
    if ti.try_number == 1:
        task_state_store.set("checkpoint", {"rows": 500, "try": 1})
        raise RuntimeError("the first try fails after its checkpoint")
    return task_state_store.get("checkpoint")


@task
def edit(task_state_store=None):
    store = task_state_store
    store.set("a", 1)
    store.set("b", [1, 2])
    store.set("c", "text")
    store.delete("a")
    store.delete("never-set")  # nothing happens
    seen = [store.get("a", "gone"), store.get("b"), store.get("c")]
    store.clear()
    return seen + [store.get("b"), store.get("c", "cleared")]


@task
def scoped(i, task_state_store=None):
    before = task_state_store.get("k")
    task_state_store.set("k", i, retention=NEVER_EXPIRE)
    return {"before": before}


@task
def retained(task_state_store=None):
    task_state_store.set("short", 1, retention=timedelta(hours=1))
    task_state_store.set("default", 2)
    task_state_store.set("forever", 3, retention=NEVER_EXPIRE)


@task(outlets=[ORDERS])
def load(asset_state_store=None):
    watermark = asset_state_store.get("watermark", 0)
    asset_state_store[ORDERS].set("watermark", watermark + 10)
    return watermark


class FakeJobOperator(ResumableJobMixin, BaseOperator):
    # the external system: a file per job under JOBS holding its status

    def execute(self, context):
        return self.execute_resumable(context)

    def submit_job(self, context):
        job = JOBS / f"job-{len(list(JOBS.iterdir()))}"
        job.write_text("running")
        return job.name

    def get_job_status(self, external_id, context):
        return (JOBS / external_id).read_text()

    def is_job_active(self, status):
        return status == "running"

    def is_job_succeeded(self, status):
        return status == "done"

    def poll_until_complete(self, external_id, context):
        if context["ti"].try_number == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies while the job runs
        (JOBS / external_id).write_text("done")  # the job ends while it is polled

    def get_job_result(self, external_id, context):
        return f"result of {external_id}"


with DAG("retry_reads"):
    remember()

with DAG("delete_clear"):
    edit()

with DAG("scoping"):
    scoped.expand(i=[0, 1])

with DAG("retention"):
    retained()

with DAG("watermark"):
    load()

with DAG("resumable"):
    FakeJobOperator(task_id="job", retries=1, retry_delay=0)
"""


@pytest.fixture
def jobs(tmp_path: Path) -> Path:
    folder = tmp_path / "jobs"
    folder.mkdir()
    return folder


@pytest.fixture
def engine(migrated_db_url: str, tmp_path: Path, jobs: Path) -> Iterator[InProcessEngine]:
    source = DAGS.replace("JOBS_FOLDER", repr(str(jobs)))
    engine = InProcessEngine(migrated_db_url, tmp_path, {"state_dags.py": source})
    yield engine
    engine.db.dispose()


def _cli(engine: InProcessEngine, *args: str) -> str:
    result = CliRunner().invoke(cli, list(args), obj={"config": engine.config})
    assert result.exit_code == 0, result.output
    return result.output


def _rest(engine: InProcessEngine, tmp_path: Path, *paths: str) -> list[Any]:
    """What the REST API answers for ``paths`` (GET, as a viewer): (status, JSON) each."""
    harness = api_harness(str(engine.config.core.sql_alchemy_conn), tmp_path)
    token = harness.token(harness.user("viewer", "viewer"))
    with harness.client() as client:
        answers = [client.get(f"/api/v1{path}", headers=bearer(token)) for path in paths]
    harness.db.dispose()
    return [(a.status_code, a.json()) for a in answers]


def _submitted(jobs: Path) -> list[str]:
    return sorted(p.name for p in jobs.iterdir())


@pytest.mark.both_databases
async def test_a_retry_reads_what_the_failed_try_stored(
    engine: InProcessEngine, tmp_path: Path
) -> None:
    run = engine.trigger("retry_reads")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run) == ["success"]
    [ti] = engine.instances(run)
    assert ti.try_number == 2
    assert engine.xcom(run, "remember") == {"rows": 500, "try": 1}
    run_id = engine.run(run).run_id
    shown = json.loads(_cli(engine, "tasks", "state", "retry_reads", run_id, "remember", "--json"))
    assert [(e["key"], e["value"]) for e in shown] == [("checkpoint", {"rows": 500, "try": 1})]
    assert shown[0]["expires_at"] is not None  # [state_store] default_retention_days
    task = f"/dags/retry_reads/runs/{run_id}/tasks"
    found, missing = _rest(
        engine, tmp_path, f"{task}/remember/state-store", f"{task}/nope/state-store"
    )
    assert found[0] == 200
    assert [(e["key"], e["value"]) for e in found[1]["entries"]] == [
        ("checkpoint", {"rows": 500, "try": 1})
    ]
    assert missing[0] == 404


async def test_delete_removes_a_key_and_clear_every_key(engine: InProcessEngine) -> None:
    run = engine.trigger("delete_clear")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run) == ["success"]
    assert engine.xcom(run, "edit") == ["gone", [1, 2], "text", None, "cleared"]
    assert engine.db.call(lambda s: s.execute(select(TaskStateEntry)).all()) == []


async def test_entries_belong_to_one_task_instance(engine: InProcessEngine) -> None:
    first, second = engine.trigger("scoping"), engine.trigger("scoping")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(first, second) == ["success", "success"]
    for run in (first, second):  # neither the other copy nor the other run's is seen
        seen = [engine.xcom(run, "scoped", map_index=i) for i in (0, 1)]
        assert seen == [{"before": None}, {"before": None}]
    for run in (first, second):
        run_id = engine.run(run).run_id
        for i in (0, 1):
            entries = engine.db.call(
                lambda s, run_id=run_id, i=i: state_store.task_state_entries(
                    s, dag_id="scoping", run_id=run_id, task_id="scoped", map_index=i
                )
            )
            assert [(e.key, e.value, e.expires_at) for e in entries] == [("k", i, None)]


async def test_an_assets_entries_last_across_runs(engine: InProcessEngine, tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with engine.running():
            first = engine.trigger("watermark")
            assert await engine.run_to_end(first) == ["success"]
            second = engine.trigger("watermark")
            assert await engine.run_to_end(second) == ["success"]
    assert [engine.xcom(first, "load"), engine.xcom(second, "load")] == [0, 10]
    found = engine.db.call(
        lambda s: state_store.get_asset_state(s, asset="orders", key="watermark")
    )
    assert found == (True, 20)
    table = _cli(engine, "assets", "state", "orders").splitlines()
    assert table[0].split() == ["KEY", "VALUE", "UPDATED_AT"]
    assert table[1].split()[:2] == ["watermark", "20"]
    [(status, shown)] = _rest(engine, tmp_path, "/asset-state-store/orders")
    assert status == 200
    assert [(e["key"], e["value"], e["expires_at"]) for e in shown["entries"]] == [
        ("watermark", 20, None)
    ]


async def test_a_resumable_job_killed_after_its_submit_reconnects_on_retry(
    engine: InProcessEngine, jobs: Path
) -> None:
    run = engine.trigger("resumable")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run) == ["success"]
    [ti] = engine.instances(run)
    assert ti.try_number == 2  # the first try was killed
    assert _submitted(jobs) == ["job-0"]  # submitted once
    assert engine.xcom(run, "job") == "result of job-0"
    assert "Reconnecting to job job-0 (status running)" in engine.log(run, "job")


@pytest.mark.both_databases
async def test_db_clean_deletes_expired_entries_never_the_never_expiring(
    engine: InProcessEngine,
) -> None:
    run = engine.trigger("retention")
    with anyio.fail_after(60):
        async with engine.running():
            assert await engine.run_to_end(run) == ["success"]
    written = models.utcnow()

    def keys() -> list[str]:
        rows = engine.db.call(lambda s: s.execute(select(TaskStateEntry.key)).scalars().all())
        return sorted(rows)

    def clean_at(now: object) -> dict[str, int]:
        plan = db_clean.make_plan(
            ("task_state_store",),
            before=written - timedelta(days=400),  # no run is old enough to go
            now=now,  # type: ignore[arg-type]
            dedup_retention_s=0,
            dead_after_s=3600,
        )
        assert db_clean.count(engine.db, plan) == db_clean.clean(engine.db, plan, pause_s=0)
        return db_clean.count(engine.db, plan)

    assert keys() == ["default", "forever", "short"]
    clean_at(written + timedelta(minutes=30))
    assert keys() == ["default", "forever", "short"]  # nothing expired yet
    clean_at(written + timedelta(hours=2))
    assert keys() == ["default", "forever"]  # past its hour
    clean_at(written + timedelta(days=31))
    assert keys() == ["forever"]  # past [state_store] default_retention_days (30)
    clean_at(written + timedelta(days=3650))
    assert keys() == ["forever"]


# --- the executor's side, request by request -------------------------------------------------


def _requests(db_url: str, *, ti_id: int | None, days: int, now: datetime) -> Any:

    return StateStoreRequests(
        db=Database(db_url), ti_id=ti_id, default_retention_days=days, clock=lambda: now
    )


def test_expiry_from_the_retention_the_default_or_never(migrated_sqlite_url: str) -> None:
    now = datetime(2026, 6, 1, tzinfo=UTC)
    served = _requests(migrated_sqlite_url, ti_id=1, days=30, now=now)
    assert served.expires_at(now, retention_s=3600, never_expire=False) == now + timedelta(hours=1)
    assert served.expires_at(now, retention_s=None, never_expire=False) == now + timedelta(days=30)
    assert served.expires_at(now, retention_s=None, never_expire=True) is None
    no_default = _requests(migrated_sqlite_url, ti_id=1, days=0, now=now)
    assert no_default.expires_at(now, retention_s=None, never_expire=False) is None
    with pytest.raises(ValueError, match="must be positive"):
        served.expires_at(now, retention_s=-5, never_expire=False)


async def test_requests_the_executor_refuses(migrated_sqlite_url: str) -> None:

    db = Database(migrated_sqlite_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    callback = TaskRequestServer(db=db, cipher=cipher, mask=lambda _: None)  # no task
    task = TaskRequestServer(db=db, cipher=cipher, mask=lambda _: None, ti_id=1)

    async def answer(server: TaskRequestServer, **request: Any) -> dict[str, Any]:
        return await server.answer(json.dumps({"id": 1, **request}).encode())

    refused = await answer(callback, kind="task_state_get", key="k")
    assert "only available to a task's process" in refused["error"]
    refused = await answer(task, kind="asset_state_set", asset="nope", key="k", value=1)
    assert "asset 'nope' is not in the metadata database" in refused["error"]
    refused = await answer(task, kind="task_state_set", key="", value=1)
    assert "non-empty string" in refused["error"]
    refused = await answer(task, kind="task_state_set", key="k", value=None)
    assert "must not be None" in refused["error"]
    assert await answer(task, kind="asset_state_get", asset="nope", key="k") == {
        "id": 1,
        "ok": True,
        "value": {"found": False, "value": None},
    }
    db.dispose()
