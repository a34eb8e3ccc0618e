"""Recovering the task instances of dead executors (Airflow's "task instance heartbeat
timeout", once "zombie tasks"): the scheduler's decision, on the statements of
``engine.db.queries.orphans``.

Dead: no executor job with a heartbeat newer than a threshold holds the task instance
(``executor_job_id``). What becomes of a try it held depends on whether it started:

- a ``queued`` try was claimed but never ran (no process started): after ``threshold_s``
  (the executors' health threshold) it goes back to ``scheduled`` and does not consume a try;
- a ``running`` try of an executor silent for ``running_threshold_s`` (``[scheduler]
  task_instance_heartbeat_timeout``, 300 s by default as in Airflow: an executor that only
  lost the database for a while keeps its running tries) lost its process with its executor
  (or Celery worker): it counts as a failed try, decided by the executor's own rule
  (``engine.task_retries``): ``up_for_retry`` after the task's retry delay while tries
  remain, else ``failed``. A callback request asks a live executor to run the task's
  ``on_retry_callback`` / ``on_failure_callback`` in a fresh process and to write why the
  try ended into its log (``engine.executor.callbacks``), as for a try whose process was
  killed. The scheduler then advances the run as after any failure (trigger rules
  downstream, the run's end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.db.queries import callbacks, jobs, tasks
from engine.db.queries import orphans as orphans_sql
from engine.states import TaskState
from engine.task_retries import next_try_at

if TYPE_CHECKING:
    from collections.abc import Collection
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.db.queries.orphans import LostTryFacts

#: A task gone from its DAG file retries after Airflow's default ``retry_delay``.
DEFAULT_RETRY_DELAY_S = 300.0


@dataclass(frozen=True, slots=True)
class LostTry:
    """A running try of a dead executor (``facts``: its row), ended as ``state``:
    ``failed``, or ``up_for_retry`` until ``retry_at`` (``retry_wait_s`` after its end)."""

    facts: LostTryFacts
    state: str
    reason: str
    retry_at: datetime | None = None
    retry_wait_s: float = 0.0

    def log_fields(self) -> dict[str, object]:
        return tasks.try_log_fields(self.facts)

    def message(self) -> str:
        """What the scheduler logs of it: the try, why it was lost, what became of it."""
        f = self.facts
        if self.retry_at is None:
            outcome = "failed"
        else:
            outcome = f"up for retry at {self.retry_at.isoformat(timespec='milliseconds')}"
        return (
            f"Task {f.dag_id}.{f.task_id} (run {f.run_id}, try {f.try_number} of "
            f"{f.max_tries + 1}): {self.reason}; the try failed, {outcome}"
        )


@dataclass(frozen=True, slots=True)
class Recovery:
    """What ``recover_orphaned_tasks`` did: queued tries put back, running tries ended."""

    requeued: list[int] = field(default_factory=list)
    lost: list[LostTry] = field(default_factory=list)


def recover_orphaned_tasks(
    session: Session,
    *,
    threshold_s: float,
    now: datetime,
    running_threshold_s: float | None = None,
) -> Recovery:
    """Recover the queued and running task instances of dead executors (see the module
    docstring); ``now`` (the scheduler's clock) ends the failed tries and times retries.
    ``running_threshold_s`` (at least ``threshold_s``; None: the same) is how long an
    executor is silent before its running tries are failed."""
    running_threshold_s = max(threshold_s, running_threshold_s or threshold_s)
    queued_alive = _alive_executors(session, threshold_s)
    running_alive = _alive_executors(session, running_threshold_s)
    queued, running = orphans_sql.orphaned_tries(
        session, queued_alive=queued_alive, running_alive=running_alive
    )
    recovery = Recovery(orphans_sql.requeue_orphans(session, queued, alive=queued_alive), [])
    for ti_id in running:
        facts = orphans_sql.lost_try_facts(session, ti_id)
        if facts is None:
            continue
        lost = lost_try(facts, threshold_s=running_threshold_s, now=now)
        ended = orphans_sql.end_lost_try(
            session, ti_id, state=lost.state, retry_at=lost.retry_at, alive=running_alive, now=now
        )
        if ended:
            data = {callbacks.LOST_TRY: _callback_data(lost, now)}
            callbacks.request_task_callback(
                session, dag_id=facts.dag_id, run_id=facts.run_id, data=data, now=now
            )
            recovery.lost.append(lost)
    return recovery


def _alive_executors(session: Session, threshold_s: float) -> Collection[int]:
    return jobs.alive_job_ids(session, job_type=tasks.EXECUTOR_JOB, threshold_s=threshold_s)


def lost_try(facts: LostTryFacts, *, threshold_s: float, now: datetime) -> LostTry:
    """The end of a running try whose executor died at ``now``: a failed try, retried by the
    task's retry rule while tries remain."""
    retry = next_try_at(
        dag_id=facts.dag_id,
        task_id=facts.task_id,
        run_id=facts.run_id,
        try_number=facts.try_number,
        max_tries=facts.max_tries,
        delay_s=DEFAULT_RETRY_DELAY_S if facts.retry_delay_s is None else facts.retry_delay_s,
        exponential_backoff=facts.retry_exponential_backoff,
        max_delay_s=facts.max_retry_delay_s,
        now=now,
    )
    return LostTry(
        facts,
        state=TaskState.FAILED if retry is None else TaskState.UP_FOR_RETRY,
        reason=_reason(facts, threshold_s),
        retry_at=None if retry is None else retry[0],
        retry_wait_s=0.0 if retry is None else retry[1],
    )


def _reason(facts: LostTryFacts, threshold_s: float) -> str:
    job_id, heartbeat = facts.executor_job_id, facts.latest_heartbeat
    if job_id is None or heartbeat is None:
        return "its executor is gone (no executor job holds it); its process is presumed dead"
    host = f" on {facts.hostname}" if facts.hostname else ""
    return (
        f"its executor (job {job_id}{host}) stopped heartbeating at "
        f"{heartbeat.isoformat(timespec='milliseconds')} (no heartbeat for {threshold_s:g}s): "
        "its process is presumed dead"
    )


def _callback_data(lost: LostTry, now: datetime) -> dict[str, Any]:
    """What a callback request says of ``lost`` (read by ``engine.executor.callbacks``)."""
    return {
        "ti_id": lost.facts.ti_id,
        "task_id": lost.facts.task_id,
        "map_index": lost.facts.map_index,
        "try_number": lost.facts.try_number,
        "state": lost.state,
        "reason": lost.reason,
        "retry_at": None if lost.retry_at is None else lost.retry_at.isoformat(),
        "retry_wait_s": lost.retry_wait_s,
        "ended_at": now.isoformat(),
    }
