"""``sluice db clean --yes`` while ``sluice run`` is running, on SQLite and on PostgreSQL.

The engine watches a flag file (its dedup key is the file's identity and mtime, as a broker
message's is its coordinates). Old rows are seeded beside what the engine writes; the clean
deletes them in small batches while the engine keeps writing, and a flag dropped again with
the same mtime (a redelivery) meanwhile is still absorbed: its first event is inside the
dedup window, so the clean kept it. Afterwards a new flag still becomes an event and a run.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import func, insert, select

from engine.db import models
from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, Dag, DagRun, Job, TaskInstance
from tests.cli import CliResult, invoke
from tests.e2e.helpers import (
    SLUICE,
    asset_event_count,
    engine_env,
    start_engine,
    stop,
    wait_for,
)

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.orm import Session

pytestmark = [pytest.mark.e2e, pytest.mark.both_databases]

DAGS = """
from engine import DAG, Asset, AssetWatcher, task
from triggers import DirectoryFileDeleteTrigger

inbox = Asset("inbox", watchers=[AssetWatcher("flag", DirectoryFileDeleteTrigger(
    directory={inbox!r}, filename="flag", poke_interval=0.1))])
archive = Asset("archive")


@task
def report():
    return "ok"


with DAG("on_flag", schedule=inbox):
    report()
"""
OLD_EVENTS = 600
OLD_RUNS = 40
FIRST_MTIME_NS = 1_700_000_000_000_000_000
SECOND_MTIME_NS = FIRST_MTIME_NS + 1_000_000_000


def _drop_flag(tmp_path: Path, inbox: Path, mtime_ns: int) -> None:
    """Hard-link ``inbox/flag`` to a kept file with this mtime: the same file (inode, mtime,
    size) each time, as a redelivered message is the same message. The link puts it in place
    at once (the trigger may take it any time)."""
    kept = tmp_path / f"flag-{mtime_ns}"
    if not kept.exists():
        kept.write_text("go")
        os.utime(kept, ns=(mtime_ns, mtime_ns))
    os.link(kept, inbox / "flag")


def _seed_old_rows(s: Session) -> None:
    """Rows a month old: asset events of another asset, finished runs, an ended job."""
    old = models.utcnow() - timedelta(days=30)
    archive = s.execute(select(Asset.id).where(Asset.name == "archive")).scalar_one()
    events = [
        {"asset_id": archive, "payload": {"n": n}, "dedup_key": f"old-{n}", "timestamp": old}
        for n in range(OLD_EVENTS)
    ]
    s.execute(insert(AssetEvent), events)
    for n in range(OLD_RUNS):
        run = s.execute(
            insert(DagRun)
            .values(
                dag_id="on_flag",
                run_id=f"old-{n}",
                run_type="manual",
                state="success",
                queued_at=old,
                end_date=old,
            )
            .returning(DagRun.id)
        ).scalar_one()
        s.add(TaskInstance(dag_run_id=run, dag_id="on_flag", task_id="report", state="success"))
    s.add(Job(job_type="triggerer", state="success", start_date=old, latest_heartbeat=old))


def _count(db: Database, query: Any) -> int:
    return int(db.call(lambda s: s.execute(query).scalar_one()))


def _successful_runs(db: Database) -> int:
    query = (
        select(func.count())
        .select_from(DagRun)
        .where(
            DagRun.dag_id == "on_flag", DagRun.state == "success", DagRun.run_id.not_like("old-%")
        )
    )
    return _count(db, query)


def _live_jobs(db: Database) -> int:
    return _count(db, select(func.count()).select_from(Job).where(Job.state == "running"))


def test_clean_while_the_engine_runs_keeps_dedup_and_the_engine_working(
    tmp_path: Path, migrated_db_url: str
) -> None:
    home, dags, inbox = tmp_path / "home", tmp_path / "dags", tmp_path / "inbox"
    for folder in (home, dags, inbox):
        folder.mkdir()
    (dags / "flows.py").write_text(textwrap.dedent(DAGS.format(inbox=str(inbox))))
    env = engine_env(home, url=migrated_db_url, dags=dags, parallelism=1, heartbeat_s=0.5)
    log = tmp_path / "engine.log"
    proc = start_engine(env, log)
    db = Database(migrated_db_url)
    try:
        _exercise(tmp_path, env, db, inbox)
        assert proc.poll() is None, "the engine died during the clean"
    finally:
        code = stop(proc, timeout=60)
        db.dispose()
    assert code == 0, log.read_text()[-3000:]


def _inbox_events(db: Database) -> dict[int, str]:
    """Event id -> dedup key (it holds the flag file's mtime) of the watched asset."""
    query = select(AssetEvent.id, AssetEvent.dedup_key).join(Asset).where(Asset.name == "inbox")
    return {int(i): str(k) for i, k in db.call(lambda s: s.execute(query).all())}


def _event_of(db: Database, mtime_ns: int) -> int | None:
    return next((i for i, key in _inbox_events(db).items() if str(mtime_ns) in key), None)


def _exercise(tmp_path: Path, env: dict[str, str], db: Database, inbox: Path) -> None:
    has_dag = select(func.count()).select_from(Dag).where(Dag.dag_id == "on_flag")
    wait_for(lambda: _count(db, has_dag), timeout=60, what="the DAG to be parsed")
    _drop_flag(tmp_path, inbox, FIRST_MTIME_NS)
    wait_for(lambda: _successful_runs(db) == 1, timeout=60, what="the first flag's run")
    first = _event_of(db, FIRST_MTIME_NS)
    assert first is not None and len(_inbox_events(db)) == 1
    db.call(_seed_old_rows)

    # The clean runs in small batches while the engine works, and a redelivery arrives.
    clean = _start_clean(env, tmp_path / "clean.log")
    _drop_flag(tmp_path, inbox, FIRST_MTIME_NS)
    assert clean.wait(timeout=120) == 0, (tmp_path / "clean.log").read_text()
    wait_for(lambda: not (inbox / "flag").exists(), timeout=30, what="the redelivered flag")
    _check_what_the_clean_deleted((tmp_path / "clean.log").read_text(), db)

    # Events of one trigger are stored in order: once the next flag's event is in, the
    # redelivery before it was processed, and absorbed by the kept first event.
    _drop_flag(tmp_path, inbox, SECOND_MTIME_NS)
    second = wait_for(lambda: _event_of(db, SECOND_MTIME_NS), timeout=30, what="the next event")
    assert set(_inbox_events(db)) == {first, second}
    wait_for(lambda: _successful_runs(db) == 1, timeout=60, what="the next flag's run")


def _check_what_the_clean_deleted(output: str, db: Database) -> None:
    """The seeded rows and the first flag's finished run went; live jobs stayed."""
    assert re.search(rf"^asset_event +{OLD_EVENTS} row\(s\) deleted$", output, re.M), output
    assert re.search(rf"^dag_run +{OLD_RUNS + 1} row\(s\) deleted$", output, re.M), output
    # the seeded dead job, and any life of the engine's triggerer that ended on a loaded
    # machine (a lost lease starts a new job row; the ended one is old enough to go too)
    jobs = re.search(r"^job +(\d+) row\(s\) deleted$", output, re.M)
    assert jobs is not None and int(jobs.group(1)) >= 1, output
    assert asset_event_count(db, "archive") == 0
    assert _successful_runs(db) == 0
    assert _live_jobs(db) >= 1


def _start_clean(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    args = [SLUICE, "db", "clean", "--before", "0s", "--yes", "--batch-size", "25"]
    with log.open("wb") as handle:
        return subprocess.Popen(args, env=env, stdout=handle, stderr=subprocess.STDOUT)


def _dag() -> Dag:
    return Dag(dag_id="on_flag", fileloc="flows.py")


def _answer(env: dict[str, str], answer: str) -> CliResult:
    return invoke("db", "clean", "--before", "7d", "--tables", "asset_event", env=env, input=answer)


def test_dry_run_and_the_prompt(tmp_path: Path, migrated_sqlite_url: str) -> None:
    env = engine_env(tmp_path, url=migrated_sqlite_url, dags=tmp_path)
    db = Database(migrated_sqlite_url)
    try:
        db.call(lambda s: s.add_all([Asset(name="archive", uri="archive"), _dag()]))
        db.call(_seed_old_rows)
        dry = invoke("db", "clean", "--before", "7d", "--dry-run", env=env)
        assert dry.returncode == 0, dry.stderr
        assert re.search(
            rf"^asset_event +{OLD_EVENTS} row\(s\) would be deleted$", dry.stdout, re.M
        )
        assert "Delete these rows?" not in dry.stdout

        refused = _answer(env, "n\n")
        assert refused.returncode == 1 and "Aborted" in refused.stderr
        assert asset_event_count(db) == OLD_EVENTS

        accepted = _answer(env, "y\n")
        assert accepted.returncode == 0, accepted.stderr
        assert re.search(rf"asset_event +{OLD_EVENTS} row\(s\) deleted$", accepted.stdout, re.M)
        assert asset_event_count(db) == 0 and _count(db, select(func.count(DagRun.id))) == OLD_RUNS
    finally:
        db.dispose()


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("--before", "soon"), "--before"),
        (("--before", "2999-01-01"), "--before"),
        (("--before", "1d", "--tables", "dag_run,dags"), "--tables"),
        (("--before", "1d", "--batch-size", "0"), "--batch-size"),
    ],
)
def test_bad_values_are_refused_naming_the_option(
    tmp_path: Path, args: tuple[str, ...], option: str
) -> None:
    env = engine_env(tmp_path, url=f"sqlite:///{tmp_path / 'db.sqlite'}", dags=tmp_path)
    result = invoke("db", "clean", *args, "--yes", env=env)
    assert result.returncode == 2
    assert "Invalid value for" in result.stderr and option in result.stderr
