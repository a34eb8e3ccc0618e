"""Deadline alerts on SQLite and PostgreSQL: the scheduler (on a fake clock) sets each run's
deadlines when it first sees the run; one still running at its deadline fires its callback
once, which an executor runs with the alert's kwargs and Airflow's context; a run that
finished in time never fires it."""

from __future__ import annotations

import json
import textwrap
from datetime import timedelta
from typing import TYPE_CHECKING

import anyio
import pytest
from sqlalchemy import func, select

from engine.db.models import CallbackRequest, Deadline
from engine.states import DagRunState, TaskState
from engine.views import runs as runs_view
from tests.integration.harness import parsed_database
from tests.integration.test_retry_delay import Env, engine_parts
from tests.waiting import wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.integration

DAGS = """
import json
import pathlib
from datetime import timedelta

from engine import (
    DAG,
    AsyncCallback,
    DeadlineAlert,
    DeadlineReference,
    SyncCallback,
    task,
)

OUT = pathlib.Path({out!r})


async def late(context, **kwargs):
    name = context["dag_run"]["run_id"].replace(":", "_") + ".json"
    (OUT / name).write_text(json.dumps({{"kwargs": kwargs, "context": context}}))


def also_late(context, **kwargs):
    (OUT / "sync.json").write_text(json.dumps(kwargs))


@task
def work():
    return 1


with DAG(
    "slow",
    deadline=DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(minutes=10),
        callback=AsyncCallback(late, kwargs={{"team": "data"}}),
        name="ten minutes",
    ),
):
    work()

with DAG(
    "quick",
    deadline=[
        DeadlineAlert(
            DeadlineReference.DAGRUN_QUEUED_AT, timedelta(minutes=10), SyncCallback(also_late)
        ),
        DeadlineAlert(
            DeadlineReference.DAGRUN_LOGICAL_DATE, timedelta(0), SyncCallback(also_late)
        ),
    ],
):
    work()
"""


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path) -> Iterator[Env]:
    dags = tmp_path / "dags"
    dags.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (dags / "deadline_dags.py").write_text(textwrap.dedent(DAGS.format(out=str(out))))
    parsed = parsed_database(migrated_db_url, tmp_path, dags)
    yield Env(parsed.db, parsed.cipher, parsed.config)
    parsed.db.dispose()


def _requests(env: Env) -> int:
    query = select(func.count()).select_from(CallbackRequest)
    return int(env.db.call(lambda s: s.execute(query).scalar_one()))


def _deadlines(env: Env) -> list[Deadline]:
    return list(env.db.call(lambda s: s.execute(select(Deadline)).scalars().all()))


@pytest.mark.both_databases
async def test_a_run_past_its_deadline_fires_the_callback_once(env: Env, tmp_path: Path) -> None:
    clock = env.clock
    scheduler = env.scheduler()
    queued_at = clock()
    run_pk, run_id, _ = env.new_run("slow", now=queued_at)
    await scheduler.schedule_once()
    (deadline,) = _deadlines(env)
    assert (deadline.dag_run_id, deadline.name, deadline.missed) == (run_pk, "ten minutes", False)
    assert deadline.deadline_time == queued_at + timedelta(minutes=10)

    clock.advance(minutes=9, seconds=59)
    await scheduler.schedule_once()
    assert _requests(env) == 0  # not yet
    clock.advance(seconds=1)
    await scheduler.schedule_once()
    await scheduler.schedule_once()  # once only
    assert _requests(env) == 1
    (deadline,) = _deadlines(env)
    assert (deadline.missed, deadline.missed_at) == (True, clock())
    assert env.run_state(run_pk) == DagRunState.RUNNING  # the alert changes no state

    written = tmp_path / "out" / (run_id.replace(":", "_") + ".json")
    with anyio.fail_after(60):
        async with engine_parts(env, scheduler, parallelism=1):
            await wait_until(written.exists, within=50, step=0.05)
            await wait_until(lambda: _requests(env) == 0, within=20, step=0.05)
    called = json.loads(written.read_text())
    assert called["kwargs"] == {"team": "data"}
    context = called["context"]
    assert context["deadline"]["deadline_time"] == deadline.deadline_time.isoformat()
    assert context["deadline"]["id"] == deadline.id
    assert (context["dag_run"]["dag_id"], context["dag_run"]["run_id"]) == ("slow", run_id)
    assert context["dag_run"]["dag_run_id"] == run_id  # Airflow's name for it
    assert context["dag_run"]["queued_at"] == queued_at.isoformat()
    details = env.db.call(lambda s: runs_view.show_run(s, "slow", run_id, now=clock()))
    assert details is not None
    (shown,) = details["deadlines"]
    assert (shown["name"], shown["reference"], shown["missed"]) == (
        "ten minutes",
        "DagRunQueuedAtDeadline",
        True,
    )
    assert shown["deadline_time"] == deadline.deadline_time.isoformat()
    assert shown["callback"].endswith(".late")
    (line,) = [ln for ln in env.cli("dags", "show", "slow").splitlines() if ln.startswith("deadl")]
    assert line.split(None, 1)[1].startswith("ten minutes: DAGRUN_QUEUED_AT + 0:10:00 -> ")
    assert line.endswith(".late (async)")


async def test_a_run_that_finishes_in_time_never_fires(env: Env, tmp_path: Path) -> None:
    clock = env.clock
    scheduler = env.scheduler()
    with anyio.fail_after(60):
        async with engine_parts(env, scheduler, parallelism=1):
            run_pk, _, tis = env.new_run("quick", now=clock())
            await env.until(tis["work"], TaskState.SUCCESS)
            await env.run_ended(run_pk)
    assert env.run_state(run_pk) == DagRunState.SUCCESS
    by_index = {d.alert_index: d for d in _deadlines(env)}
    # a manual run has no logical date: that alert gets no deadline
    assert by_index[1].deadline_time is None
    assert by_index[0].deadline_time is not None
    clock.advance(hours=1)
    await scheduler.schedule_once()
    assert _requests(env) == 0
    assert not any(d.missed for d in _deadlines(env))
    assert not (tmp_path / "out" / "sync.json").exists()
