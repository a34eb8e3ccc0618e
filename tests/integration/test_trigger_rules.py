"""Trigger rules through the real scheduler on SQLite and PostgreSQL: one DAG per family of
rules (all_*, one_*, none_*, always), parsed from a DAG file, synced, and advanced by
``Scheduler.schedule_once``. Task outcomes are written as the executor writes them; the test
checks what the scheduler decides next and how the run ends (Airflow's leaf rule)."""

from __future__ import annotations

import textwrap
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select, update

from engine.crypto import KwargsCipher
from engine.dag_processing.processor import DagProcessor, DagProcessorSettings
from engine.db import models
from engine.db.database import Database
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import runs
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import DagRunState, TaskState

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration

N, SCH, OK, FAIL, SKIP, UF, RETRY = (
    TaskState.NONE,
    TaskState.SCHEDULED,
    TaskState.SUCCESS,
    TaskState.FAILED,
    TaskState.SKIPPED,
    TaskState.UPSTREAM_FAILED,
    TaskState.UP_FOR_RETRY,
)

DAGS = """
from engine import DAG, EmptyOperator, TriggerRule

def rule(task_id, upstream, trigger_rule):
    op = EmptyOperator(task_id=task_id, trigger_rule=trigger_rule)
    upstream >> op
    return op

with DAG("all_family"):
    ok, bad, skip = (EmptyOperator(task_id=t) for t in ("ok", "bad", "skip"))
    rule("all_success_failed", [ok, bad], "all_success")
    rule("all_success_skipped", [ok, skip], "all_success")
    rule("all_failed", [bad], TriggerRule.ALL_FAILED)
    rule("all_failed_skipped", [bad, ok], TriggerRule.ALL_FAILED)
    rule("all_done", [ok, bad, skip], "all_done")
    rule("all_skipped", [skip], "all_skipped")
    rule("all_done_min_one_success", [ok, bad], "all_done_min_one_success")

with DAG("one_family"):
    ok, bad, skip = (EmptyOperator(task_id=t) for t in ("ok", "bad", "skip"))
    rule("one_success", [ok, bad], "one_success")
    rule("one_success_all_skipped", [skip], "one_success")
    rule("one_failed", [ok, bad], "one_failed")
    rule("one_failed_none", [ok, skip], "one_failed")
    rule("one_done", [skip, ok], "one_done")

with DAG("none_family"):
    ok, bad, skip = (EmptyOperator(task_id=t) for t in ("ok", "bad", "skip"))
    rule("none_failed", [ok, skip], "none_failed")
    rule("none_failed_failed", [ok, bad], "none_failed")
    rule("min_one_success", [ok, skip], "none_failed_min_one_success")
    rule("min_one_success_all_skipped", [skip], "none_failed_min_one_success")
    rule("none_skipped", [ok, bad], "none_skipped")
    rule("none_skipped_skipped", [ok, skip], "none_skipped")

with DAG("branch_join"):
    branch = EmptyOperator(task_id="branch")
    left, right = EmptyOperator(task_id="left"), EmptyOperator(task_id="right")
    join = EmptyOperator(task_id="join")
    branch >> [left, right] >> join
    join.trigger_rule = "none_failed_min_one_success"  # set after construction: honoured
    cleanup = EmptyOperator(task_id="cleanup", trigger_rule=TriggerRule.ALWAYS)
    join >> cleanup
"""


@pytest.fixture
def env(migrated_db_url: str, tmp_path: Path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "rules.py").write_text(textwrap.dedent(DAGS))
    db = Database(migrated_db_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    processor = DagProcessor(db=db, cipher=cipher, settings=_settings(dags, tmp_path))
    anyio.run(processor.parse_once)
    yield db, Scheduler(db=db, cipher=cipher, settings=SchedulerSettings())
    db.dispose()


def _settings(dags: Path, tmp_path: Path) -> DagProcessorSettings:
    from engine.config import load_config

    config = load_config(
        environ={"SLUICE_HOME": str(tmp_path / "home"), "SLUICE__CORE__DAGS_FOLDER": str(dags)}
    )
    return DagProcessorSettings.from_config(config)


class Run:
    """One manual run of a DAG, advanced by the scheduler; its tasks finished by hand."""

    def __init__(self, db: Database, scheduler: Scheduler, dag_id: str) -> None:
        self.db, self.scheduler = db, scheduler
        created = db.call(
            lambda s: runs.create_run(s, dag_id, run_type=runs.MANUAL, now=models.utcnow())
        )
        assert created is not None
        self.pk: int = created

    def advance(self) -> None:
        anyio.run(self.scheduler.schedule_once)

    def finish(self, **states: str) -> None:
        """Write task outcomes as the executor does, then let the scheduler advance."""

        def write(session: Any) -> None:
            for task_id, state in states.items():
                values: dict[str, Any] = {"state": state, "end_date": models.utcnow()}
                if state == RETRY:  # not due within this test
                    values["next_retry_at"] = models.utcnow() + timedelta(days=1)
                session.execute(
                    update(TaskInstance)
                    .where(TaskInstance.dag_run_id == self.pk, TaskInstance.task_id == task_id)
                    .values(**values)
                )

        self.db.call(write)
        self.advance()

    def tasks(self) -> dict[str, str]:
        return dict(
            self.db.call(
                lambda s: s.execute(
                    select(TaskInstance.task_id, TaskInstance.state).where(
                        TaskInstance.dag_run_id == self.pk
                    )
                ).all()
            )
        )

    def state(self) -> str:
        return str(
            self.db.call(
                lambda s: s.execute(select(DagRun.state).where(DagRun.id == self.pk)).scalar_one()
            )
        )

    def succeed_scheduled(self) -> None:
        self.finish(**{t: OK for t, s in self.tasks().items() if s == SCH})


def _rules(db: Database, dag_id: str) -> dict[str, str]:
    def read(session: Any) -> dict[str, str]:
        from engine.db.models import DagTask

        rows = session.execute(
            select(DagTask.task_id, DagTask.trigger_rule).where(DagTask.dag_id == dag_id)
        )
        return dict(rows.all())

    return db.call(read)


@pytest.mark.both_databases
def test_all_family(env) -> None:
    db, scheduler = env
    run = Run(db, scheduler, "all_family")
    run.advance()
    assert {t: s for t, s in run.tasks().items() if s != N} == {"ok": SCH, "bad": SCH, "skip": SCH}
    run.finish(ok=OK, bad=RETRY, skip=SKIP)  # bad waits for a retry: not finished yet
    tasks = run.tasks()
    assert tasks["all_success_skipped"] == SKIP  # a skip decides at once
    assert tasks["all_failed_skipped"] == SKIP  # a success does too
    assert tasks["all_skipped"] == SCH
    for waiting in ("all_success_failed", "all_failed", "all_done", "all_done_min_one_success"):
        assert tasks[waiting] == N, waiting
    assert run.state() == DagRunState.RUNNING
    run.finish(bad=FAIL)
    tasks = run.tasks()
    assert tasks["all_success_failed"] == UF
    assert tasks["all_failed"] == SCH
    assert tasks["all_done"] == SCH
    assert tasks["all_done_min_one_success"] == SCH
    run.succeed_scheduled()
    assert run.state() == DagRunState.FAILED  # the leaf all_success_failed is upstream_failed


def test_one_family(env) -> None:
    db, scheduler = env
    run = Run(db, scheduler, "one_family")
    run.advance()
    run.finish(ok=OK, skip=SKIP)  # bad still running: the one_* rules do not wait for it
    tasks = run.tasks()
    assert tasks["one_success"] == SCH
    assert tasks["one_success_all_skipped"] == SKIP
    assert tasks["one_failed"] == N  # bad may still fail
    assert tasks["one_failed_none"] == SKIP  # every upstream done, none failed
    assert tasks["one_done"] == SCH
    run.finish(bad=FAIL)
    assert run.tasks()["one_failed"] == SCH
    run.succeed_scheduled()
    # bad failed but is no leaf, and every leaf succeeded or was skipped
    assert run.tasks()["bad"] == FAIL
    assert run.state() == DagRunState.SUCCESS


def test_none_family(env) -> None:
    db, scheduler = env
    run = Run(db, scheduler, "none_family")
    run.advance()
    run.finish(ok=OK, skip=SKIP, bad=FAIL)
    assert run.tasks() == {
        "ok": OK,
        "bad": FAIL,
        "skip": SKIP,
        "none_failed": SCH,
        "none_failed_failed": UF,
        "min_one_success": SCH,
        "min_one_success_all_skipped": SKIP,
        "none_skipped": SCH,
        "none_skipped_skipped": SKIP,
    }
    run.succeed_scheduled()
    assert run.state() == DagRunState.FAILED  # none_failed_failed is a leaf


def test_always_and_a_branch_join_with_a_rule_set_after_construction(env) -> None:
    db, scheduler = env
    assert _rules(db, "branch_join")["join"] == "none_failed_min_one_success"
    run = Run(db, scheduler, "branch_join")
    run.advance()
    assert run.tasks()["cleanup"] == SCH  # always: runs without waiting for anything
    run.finish(branch=OK)
    run.finish(left=OK, right=SKIP)  # as a branch that followed "left" leaves it
    assert run.tasks()["join"] == SCH
    run.finish(join=FAIL)
    assert run.state() == DagRunState.RUNNING  # cleanup has not finished
    run.finish(cleanup=OK)
    # Airflow's leaf rule: cleanup is the only leaf and succeeded; join failed above it
    assert run.state() == DagRunState.SUCCESS
