"""The metadata-DB decisions of the Celery executor (``engine.db.queries.celery``), on SQLite
and PostgreSQL, with explicit clocks: which delivery of a message runs a try, which queued
tries are sent again, the queue of each try, the counts per queue."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import select, update

from engine.db import models
from engine.db.database import Database
from engine.db.models import Dag, DagRun, DagTask, Job, TaskInstance
from engine.db.queries import celery as celery_sql
from engine.db.queries import jobs, tasks
from engine.executor import admission
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.orm import Session

pytestmark = [pytest.mark.integration, pytest.mark.both_databases]


@pytest.fixture
def db(migrated_db_url: str) -> Iterator[Database]:
    database = Database(migrated_db_url)
    yield database
    database.dispose()


def _seed(session: Session, queues: dict[str, str | None]) -> dict[str, int]:
    """A DAG whose tasks have ``queues``, one run, its task instances ``scheduled``."""
    session.add(Dag(dag_id="d", fileloc="/dags/d.py"))
    session.flush()
    for task_id, queue in queues.items():
        session.add(DagTask(dag_id="d", task_id=task_id, operator="PythonOperator", queue=queue))
    run = DagRun(dag_id="d", run_id="r", run_type="manual", state="running")
    session.add(run)
    session.flush()
    ids = {}
    for task_id in queues:
        ti = TaskInstance(dag_run_id=run.id, dag_id="d", task_id=task_id, state=TaskState.SCHEDULED)
        session.add(ti)
        session.flush()
        ids[task_id] = ti.id
    return ids


def _job(session: Session) -> int:
    return jobs.start_job(session, job_type=tasks.EXECUTOR_JOB, capacity=2)


def _held(db: Database, ti_id: int) -> tuple[str, int | None]:
    query = select(TaskInstance.state, TaskInstance.executor_job_id).where(TaskInstance.id == ti_id)
    state, holder = db.call(lambda s: s.execute(query).one())
    return str(state), holder


def test_only_one_delivery_takes_a_queued_try_over(db: Database) -> None:
    ids = db.call(lambda s: _seed(s, {"a": None}))
    sender, w1, w2 = (db.call(_job) for _ in range(3))
    now = models.utcnow()
    assert db.call(partial(admission.claim_task_instances, job_id=sender, limit=10, now=now)) == [
        ids["a"]
    ]
    take = partial(celery_sql.take_over_queued, ti_id=ids["a"], sender_job_id=sender)
    assert db.call(partial(take, worker_job_id=w1)) is True
    assert db.call(partial(take, worker_job_id=w2)) is False  # the redelivery
    assert _held(db, ids["a"]) == ("queued", w1)
    # w1 again (its retry after a commit whose answer was lost): already its own
    assert db.call(partial(take, worker_job_id=w1)) is True
    assert _held(db, ids["a"]) == ("queued", w1)
    # the try is then the worker's, with the local executor's guarded writes
    run = db.call(
        partial(tasks.start_task_run, ti_id=ids["a"], job_id=w1, pid=1, hostname="h", now=now)
    )
    assert run is not None and run.try_number == 1
    held = db.call(partial(celery_sql.held_try, ti_id=ids["a"], now=now, threshold_s=10.0))
    assert held == celery_sql.HeldTry("running", w1, 1, holder_alive=True)
    later = now + timedelta(seconds=60)  # w1 stopped heartbeating long ago
    held = db.call(partial(celery_sql.held_try, ti_id=ids["a"], now=later, threshold_s=10.0))
    assert held is not None and held.holder_alive is False


def test_a_message_of_another_sender_takes_nothing(db: Database) -> None:
    ids = db.call(lambda s: _seed(s, {"a": None}))
    sender, other, worker = (db.call(_job) for _ in range(3))
    db.call(partial(admission.claim_task_instances, job_id=sender, limit=10, now=models.utcnow()))
    take = partial(celery_sql.take_over_queued, ti_id=ids["a"], worker_job_id=worker)
    assert db.call(partial(take, sender_job_id=other)) is False
    assert _held(db, ids["a"]) == ("queued", sender)


def test_tries_queued_past_the_timeout_are_sent_again_once_per_timeout(db: Database) -> None:
    ids = db.call(lambda s: _seed(s, {"a": None, "b": None, "c": None}))
    sender, worker = db.call(_job), db.call(_job)
    t0 = models.utcnow()
    db.call(partial(admission.claim_task_instances, job_id=sender, limit=10, now=t0))
    db.call(
        partial(
            celery_sql.take_over_queued, ti_id=ids["c"], sender_job_id=sender, worker_job_id=worker
        )
    )
    stale = partial(celery_sql.stale_queued, job_id=sender, timeout_s=30.0, limit=10)
    assert db.call(partial(stale, now=t0 + timedelta(seconds=29))) == []
    again = db.call(partial(stale, now=t0 + timedelta(seconds=31)))
    assert sorted(again) == [ids["a"], ids["b"]]  # not c: a worker has it
    # their clock restarted: not again before another timeout
    assert db.call(partial(stale, now=t0 + timedelta(seconds=40))) == []
    assert sorted(db.call(partial(stale, now=t0 + timedelta(seconds=62)))) == [ids["a"], ids["b"]]
    assert db.call(partial(celery_sql.queued_count, job_id=sender)) == 2


def test_queues_of_tries_and_counts_per_queue(db: Database) -> None:
    ids = db.call(lambda s: _seed(s, {"a": None, "b": "gpu", "c": "gpu"}))
    sender = db.call(_job)
    queues = db.call(partial(celery_sql.task_queues, ti_ids=list(ids.values())))
    assert queues == {ids["a"]: None, ids["b"]: "gpu", ids["c"]: "gpu"}
    db.call(partial(admission.claim_task_instances, job_id=sender, limit=10, now=models.utcnow()))
    db.call(
        lambda s: s.execute(
            update(TaskInstance).where(TaskInstance.id == ids["c"]).values(state="running")
        )
    )
    counts = db.call(partial(celery_sql.queue_counts, default_queue="default"))
    assert counts == {"default": (1, 0), "gpu": (1, 1)}


def test_a_worker_records_its_queues(db: Database) -> None:
    worker = db.call(_job)
    db.call(partial(celery_sql.set_worker_queues, job_id=worker, queues=("default", "gpu")))
    query = select(Job.queues).where(Job.id == worker)
    assert db.call(lambda s: s.execute(query).scalar_one()) == "default,gpu"
