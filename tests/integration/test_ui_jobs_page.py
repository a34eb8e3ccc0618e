"""The engine page (``/jobs``) and what it reads (``GET /api/v1/jobs``, ``/queues``) against
the real application and database (SQLite and PostgreSQL): a Celery fleet whose rows the
executor's own queries wrote (a sender that queued tries, a worker with its queues that took
one over and runs it), a scheduler that stopped heartbeating, parts that ended recently and
long ago; names from the outside (hostnames, queue names) shown escaped."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest
from markupsafe import escape
from sqlalchemy import update

from engine.api.app import create_app
from engine.config import load_config
from engine.db import models
from engine.db.database import Database
from engine.db.models import Dag, DagRun, DagTask, Job, TaskInstance
from engine.db.queries import celery as celery_sql
from engine.db.queries import jobs as jobs_sql
from engine.db.queries import tasks as tasks_sql
from engine.db.queries.jobs import DAG_PROCESSOR_JOB, SCHEDULER_JOB, TRIGGERER_JOB
from engine.executor import admission
from engine.states import TaskState
from tests.integration.api_support import ApiHarness, bearer

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from sqlalchemy.orm import Session

pytestmark = pytest.mark.integration

EVIL_HOST = '<img src=x onerror="alert(1)">.example'
EVIL_QUEUE = "gpu<script>alert(2)</script>"
RUN_ID = "manual__2026-11-27T10:00:00+00:00"


@dataclass(frozen=True)
class Fleet:
    api: ApiHarness
    sender: int  # `sluice run`'s executor, the Celery sender: "load" queued under it
    worker: int  # a `sluice celery worker` on default + EVIL_QUEUE, running "crunch"
    dead: int  # a scheduler whose heartbeat is a minute old
    ended: int  # a triggerer that stopped a moment ago
    ended_long_ago: int  # a DAG processor that stopped two hours ago


def _harness(db_url: str, tmp_path: Path, kind: str) -> ApiHarness:
    db = Database(db_url)
    config = load_config(
        environ={"SLUICE_HOME": str(tmp_path / "home"), "SLUICE__EXECUTOR__KIND": kind}
    )
    return ApiHarness(db=db, config=config, app=create_app(config, db))


def _dag(session: Session, queues: dict[str, str | None]) -> dict[str, int]:
    """DAG ``d`` whose tasks have ``queues``, one run, its task instances ``scheduled``."""
    session.add(Dag(dag_id="d", fileloc="/dags/d.py"))
    session.flush()
    for task_id, queue in queues.items():
        session.add(DagTask(dag_id="d", task_id=task_id, operator="PythonOperator", queue=queue))
    run = DagRun(dag_id="d", run_id=RUN_ID, run_type="manual", state="running")
    session.add(run)
    session.flush()
    ids = {}
    for task_id in queues:
        ti = TaskInstance(dag_run_id=run.id, dag_id="d", task_id=task_id, state=TaskState.SCHEDULED)
        session.add(ti)
        session.flush()
        ids[task_id] = ti.id
    return ids


def _age(session: Session, job_id: int, **ago: timedelta) -> None:
    now = models.utcnow()
    session.execute(
        update(Job).where(Job.id == job_id).values(**{k: now - v for k, v in ago.items()})
    )


def _seed_fleet(session: Session) -> dict[str, int]:
    ids = _dag(session, {"crunch": EVIL_QUEUE, "load": None})
    now = models.utcnow()
    sender = jobs_sql.start_job(session, job_type=tasks_sql.EXECUTOR_JOB, capacity=4)
    worker = jobs_sql.start_job(session, job_type=tasks_sql.EXECUTOR_JOB, capacity=2)
    celery_sql.set_worker_queues(session, job_id=worker, queues=("default", EVIL_QUEUE))
    session.execute(update(Job).where(Job.id == worker).values(hostname=EVIL_HOST))
    assert sorted(admission.claim_task_instances(session, job_id=sender, limit=10, now=now)) == [
        ids["crunch"],
        ids["load"],
    ]
    assert celery_sql.take_over_queued(
        session, ids["crunch"], sender_job_id=sender, worker_job_id=worker
    )
    started = tasks_sql.start_task_run(
        session, ids["crunch"], job_id=worker, pid=4242, hostname=EVIL_HOST, now=now
    )
    assert started is not None
    dead = jobs_sql.start_job(session, job_type=SCHEDULER_JOB)
    _age(session, dead, latest_heartbeat=timedelta(minutes=1))
    ended = jobs_sql.start_job(session, job_type=TRIGGERER_JOB, capacity=10)
    jobs_sql.end_job(session, ended)
    gone = jobs_sql.start_job(session, job_type=DAG_PROCESSOR_JOB)
    jobs_sql.end_job(session, gone)
    _age(session, gone, end_date=timedelta(hours=2), latest_heartbeat=timedelta(hours=2))
    return {"sender": sender, "worker": worker, "dead": dead, "ended": ended, "gone": gone}


@pytest.fixture
def fleet(migrated_db_url: str, tmp_path: Path) -> Iterator[Fleet]:
    api = _harness(migrated_db_url, tmp_path, "celery")
    api.user("vic", "viewer")
    seeded = api.db.call(_seed_fleet)
    try:
        yield Fleet(
            api, seeded["sender"], seeded["worker"], seeded["dead"], seeded["ended"], seeded["gone"]
        )
    finally:
        api.db.dispose()


def _viewer_page(api: ApiHarness, path: str = "/jobs") -> str:
    client = api.client()
    api.login(client, "vic")
    answer = client.get(path)
    assert answer.status_code == 200, answer.text
    return answer.text


def _row(page: str, job_id: int) -> str:
    """The table row of job ``job_id``, its tags stripped to text (links kept as ``[href]``)."""
    found = re.search(rf'<tr id="job-{job_id}"[^>]*>(.*?)</tr>', page, re.DOTALL)
    assert found is not None, f"no row of job {job_id}"
    return _text(found.group(1))


def _text(fragment: str) -> str:
    linked = re.sub(r'<a href="([^"]*)"[^>]*>', r"[\1] ", fragment)
    cells = re.sub(r"</?(?:td|th|tr|ul|li)\b[^>]*>", " ", linked)
    return html.unescape(" ".join(re.sub(r"<[^>]+>", "", cells).split()))


def _section(page: str, testid: str) -> str:
    found = re.search(rf'<section data-testid="{testid}">(.*?)</section>', page, re.DOTALL)
    assert found is not None, f"no section {testid}"
    return found.group(1)


@pytest.mark.both_databases
def test_the_engine_page_shows_the_celery_workers_queues_and_parts(fleet: Fleet) -> None:
    page = _viewer_page(fleet.api)
    task_page = f"/dags/d/runs/{quote(RUN_ID, safe='')}/tasks/crunch"
    # the worker: its host, queues, the try it runs (a link to the task's page), its slots
    worker = _row(_section(page, "workers"), fleet.worker)
    assert EVIL_HOST in worker and f"default, {EVIL_QUEUE}" in worker
    assert "✓ alive" in worker and "1 / 2" in worker
    assert f"[{task_page}] d / crunch {RUN_ID}, try 1, since" in worker
    # per queue: the try the worker runs, the one still queued, who consumes each
    queues = _section(page, "queues")
    assert f'data-queue="{html.escape(EVIL_QUEUE)}"' in queues
    rows = [_text(r) for r in re.findall(r"<tr data-queue=[^>]*>(.*?)</tr>", queues, re.DOTALL)]
    assert rows == [
        f"default 1 0 [#job-{fleet.worker}] worker {fleet.worker}",
        f"{EVIL_QUEUE} 0 1 [#job-{fleet.worker}] worker {fleet.worker}",
    ]
    # the other parts: the sender holds the queued try, runs none itself
    parts = _section(page, "parts")
    sender = _row(parts, fleet.sender)
    assert "executor (sends tries to Celery)" in sender and "✓ alive" in sender
    assert "1 / 4 tries" in sender
    assert sender.endswith("none")
    dead = _row(parts, fleet.dead)
    assert "scheduler" in dead and "✗ not heartbeating" in dead
    # Its heartbeat was set a minute before the fixture's now; the page counts from the
    # request's now, which comes later by however long the setup took.
    age = re.search(r"(\d+) s ago", dead)
    assert age is not None and 60 <= int(age.group(1)) < 600, dead
    assert "ended (success)" in _row(parts, fleet.ended)
    assert f'id="job-{fleet.ended_long_ago}"' not in page  # ended two hours ago
    assert "(2 alive)" in page and 'aria-current="page">Engine</a>' in page
    # refreshed by the static script, no inline script
    assert '<meta name="sluice-refresh" content="5">' in page
    assert re.findall(r"<script(?![^>]*\ssrc=)[^>]*>", page) == []


def test_names_from_the_outside_are_escaped(fleet: Fleet) -> None:
    page = _viewer_page(fleet.api)
    for raw in (EVIL_HOST, EVIL_QUEUE):
        assert raw not in page
        assert str(escape(raw)) in page  # as Jinja2 escapes: <, >, &, quotes
    assert "<script>alert" not in page and "<img src=x" not in page


def test_the_page_needs_a_login_and_is_served_like_every_page(fleet: Fleet) -> None:
    client = fleet.api.client()
    answer = client.get("/jobs")
    assert answer.status_code in (302, 303, 307) and "/login" in answer.headers["location"]
    fleet.api.login(client, "vic")
    answer = client.get("/jobs")
    assert answer.status_code == 200 and answer.headers["cache-control"] == "no-store"
    assert "script-src 'self';" in answer.headers["content-security-policy"]


def test_the_rest_api_lists_the_running_tries_and_the_queues(fleet: Fleet) -> None:
    client = fleet.api.client()
    client.headers.update(bearer(fleet.api.token("vic")))
    jobs = client.get("/api/v1/jobs?include_ended=true").json()
    by_id = {j["id"]: j for j in jobs["items"]}
    assert by_id[fleet.worker]["running_tries"] == [
        {
            "dag_id": "d",
            "run_id": RUN_ID,
            "task_id": "crunch",
            "map_index": -1,
            "try_number": 1,
            "started": by_id[fleet.worker]["running_tries"][0]["started"],
        }
    ]
    assert by_id[fleet.worker]["running_tries"][0]["started"] is not None
    assert by_id[fleet.sender]["running_tries"] == [] and by_id[fleet.sender]["load"] == 1
    assert by_id[fleet.dead]["running_tries"] is None  # a scheduler runs no task
    assert by_id[fleet.ended]["ended"] is not None and by_id[fleet.dead]["ended"] is None
    assert fleet.ended_long_ago in by_id  # the API lists every ended job kept
    queues = client.get("/api/v1/queues").json()
    assert queues == {
        "executor_kind": "celery",
        "items": [
            {"queue": "default", "queued": 1, "running": 0, "workers": [fleet.worker]},
            {"queue": EVIL_QUEUE, "queued": 0, "running": 1, "workers": [fleet.worker]},
        ],
    }
    # a worker that stopped heartbeating consumes nothing any more
    fleet.api.db.call(partial(_age, job_id=fleet.worker, latest_heartbeat=timedelta(minutes=5)))
    items = client.get("/api/v1/queues").json()["items"]
    assert [(q["queue"], q["workers"]) for q in items] == [("default", []), (EVIL_QUEUE, [])]
    page = _viewer_page(fleet.api)
    assert "no live worker consumes this queue" in _section(page, "queues")
    assert "✗ not heartbeating" in _row(page, fleet.worker)


def _seed_local(session: Session) -> tuple[int, int]:
    ids = _dag(session, {"crunch": None})
    now = models.utcnow()
    executor = jobs_sql.start_job(session, job_type=tasks_sql.EXECUTOR_JOB, capacity=8)
    admission.claim_task_instances(session, job_id=executor, limit=10, now=now)
    started = tasks_sql.start_task_run(
        session, ids["crunch"], job_id=executor, pid=99, hostname="h", now=now
    )
    assert started is not None
    return executor, ids["crunch"]


def test_with_the_local_executor_the_page_has_no_celery_part(
    migrated_db_url: str, tmp_path: Path
) -> None:
    api = _harness(migrated_db_url, tmp_path, "local")
    try:
        api.user("vic", "viewer")
        executor, _ = api.db.call(_seed_local)
        page = _viewer_page(api)
        assert 'data-testid="queues"' not in page and 'data-testid="workers"' not in page
        row = _row(_section(page, "parts"), executor)
        assert "1 / 8 tries" in row and "d / crunch" in row and "try 1" in row
    finally:
        api.db.dispose()
