"""``sluice dags backfill`` with a real engine killed (SIGKILL) mid-way and started again, on
SQLite and PostgreSQL: every logical date runs to success exactly once, never two runs at
a time (``--max-active-runs 1``), and the backfill completes. (A try killed with the engine
is a failed try: the task's one retry runs it again once the next engine recovers it.)"""

from __future__ import annotations

import itertools
import json
import os
import signal
import textwrap
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select

from engine.db.database import Database
from engine.db.models import Backfill, Dag, DagRun
from tests.cli import invoke
from tests.e2e.helpers import engine_env, start_engine, stop, wait_for

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

DAG = """
import time
from datetime import datetime

from engine import dag, task


@dag(
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=True,
)
def nightly():
    @task(retries=1, retry_delay=0)
    def load(ds):
        time.sleep(1.0)
        return ds

    load()


nightly()
"""

DAYS = 6


def _backfill_runs(db: Database) -> list[DagRun]:
    return db.call(
        lambda s: (
            s.execute(
                select(DagRun).where(DagRun.backfill_id.is_not(None)).order_by(DagRun.logical_date)
            )
            .scalars()
            .all()
        )
    )


def _succeeded(db: Database) -> int:
    return sum(run.state == "success" for run in _backfill_runs(db))


@pytest.mark.parametrize("migrated_db_url", ["sqlite", "postgres"], indirect=True)
def test_a_backfill_survives_a_killed_engine_without_duplicate_runs(
    migrated_db_url: str, tmp_path: Path
) -> None:
    home, dags = tmp_path / "home", tmp_path / "dags"
    for folder in (home, dags):
        folder.mkdir()
    (dags / "nightly.py").write_text(textwrap.dedent(DAG))
    env = engine_env(home, url=migrated_db_url, dags=dags, parallelism=2, heartbeat_s=1.0)
    db = Database(migrated_db_url)
    log = tmp_path / "engine.log"
    first = start_engine(env, log)
    try:
        wait_for(
            lambda: db.call(lambda s: s.get(Dag, "nightly")),
            timeout=60,
            what="the DAG to be parsed",
        )
        done = invoke(
            "dags",
            "backfill",
            "nightly",
            "--from",
            "2026-01-01",
            "--to",
            f"2026-01-0{DAYS}",
            "--max-active-runs",
            "1",
            env=env,
        )
        assert done.returncode == 0, done.stderr
        assert f"created {DAYS} run(s)" in done.stdout, done.stdout
        assert "paused" in done.stdout  # is_paused_upon_creation: the runs wait
        assert invoke("dags", "unpause", "nightly", env=env).returncode == 0
        wait_for(lambda: _succeeded(db) >= 2, timeout=90, what="two backfill runs to succeed")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # A second command for the same range while nothing runs: resumes, adds nothing.
    again = invoke(
        "dags",
        "backfill",
        "nightly",
        "--from",
        "2026-01-01",
        "--to",
        f"2026-01-0{DAYS}",
        "--max-active-runs",
        "1",
        env=env,
    )
    assert again.returncode == 0, again.stderr
    assert "resumed" in again.stdout and "created 0 run(s)" in again.stdout, again.stdout
    second = start_engine(env, log)
    try:
        wait_for(lambda: _succeeded(db) == DAYS, timeout=150, what="every backfill run to succeed")
        completed = wait_for(
            lambda: db.call(lambda s: s.execute(select(Backfill.completed_at)).scalar()),
            timeout=30,
            what="the backfill to complete",
        )
        assert completed is not None
    finally:
        code = stop(second, timeout=60)
    runs = _backfill_runs(db)
    dates = [run.logical_date.date().isoformat() for run in runs]
    assert dates == [f"2026-01-0{day}" for day in range(1, DAYS + 1)]  # once each
    listed = invoke("runs", "list", "nightly", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert sum(r["backfill_id"] is not None for r in _json(listed.stdout)) == DAYS
    # --max-active-runs 1: a run started only after the previous one ended, kill included
    spans = [(run.start_date, run.end_date) for run in runs]
    assert all(end is not None for _, end in spans)
    for (_, previous_end), (start, _) in itertools.pairwise(spans):
        assert start is not None and previous_end is not None and start >= previous_end
    db.dispose()
    assert code == 0, log.read_text()[-3000:]


def _json(text: str) -> Any:
    return json.loads(text)
