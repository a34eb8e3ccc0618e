"""The scheduler: asset events -> DAG runs -> ready task instances -> finished runs.

Each loop (every ``loop_interval_sec``, or at once when nudged by an in-process persister):

1. every active, unpaused DAG with queued asset events whose schedule condition is now met
   gets one asset-triggered run; all its queued events are attached and consumed in the same
   transaction (the DAG row is locked with ``SKIP LOCKED`` on PostgreSQL, so two schedulers
   never create two runs from one event);
2. each unfinished run's tasks advance (``engine.scheduler.rules.next_task_states``): a ready task
   becomes ``scheduled`` for the executor (or goes straight to the triggerer when it starts
   from a trigger); a run whose tasks all finished ends;
3. deferrals past their timeout fail.

Paused DAGs keep their queued events; on unpause they create the run they would have created.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Final

import anyio

from engine.authoring.assets import BaseAsset
from engine.db import models
from engine.db.heartbeat import heartbeat_forever
from engine.db.models import DagRunState, JobState, TaskState
from engine.db.queries import deferrals, jobs, runs, tasks
from engine.exceptions import SluiceError
from engine.metrics.readings import SchedulerReading
from engine.retry import Backoff
from engine.scheduler.rules import is_condition_met, next_task_states, run_outcome

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.orm import Session

    from engine.config import Config
    from engine.crypto import KwargsCipher
    from engine.db.database import Database

logger = logging.getLogger(__name__)

SCHEDULER_JOB: Final = "scheduler"


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    loop_interval_s: float = 0.05
    heartbeat_s: float = 5.0
    health_check_threshold_s: float = 10.5
    executor_health_check_threshold_s: float = 10.5

    @classmethod
    def from_config(cls, config: Config) -> SchedulerSettings:
        s = config.scheduler
        return cls(
            loop_interval_s=s.loop_interval_sec,
            heartbeat_s=s.scheduler_heartbeat_sec,
            health_check_threshold_s=s.health_check_threshold_s,
            executor_health_check_threshold_s=s.health_check_threshold_s,
        )


@dataclass
class SchedulerStats:
    loops: int = 0
    runs_created: int = 0
    tasks_scheduled: int = 0
    runs_finished: int = 0


class Scheduler:
    def __init__(
        self,
        *,
        db: Database,
        cipher: KwargsCipher,
        settings: SchedulerSettings,
        on_tasks_scheduled: Callable[[], None] | None = None,
    ) -> None:
        self._db = db
        self._on_tasks_scheduled = on_tasks_scheduled
        self._last_recovery = 0.0
        self._last_failure = -math.inf  # monotonic time of the last failed loop
        self._cipher = cipher
        self.settings = settings
        self.job_id: int | None = None
        self.stats = SchedulerStats()
        self._nudged = anyio.Event()
        self._stopping = anyio.Event()

    def __repr__(self) -> str:
        return f"Scheduler(job_id={self.job_id}, stats={self.stats})"

    def metrics_reading(self) -> SchedulerReading:
        s = self.stats
        created = ((runs.ASSET_TRIGGERED, s.runs_created),)
        return SchedulerReading(self.job_id, created, s.tasks_scheduled, s.runs_finished)

    def nudge(self) -> None:
        """Run the next loop now (called when asset events or task outcomes were stored)."""
        self._nudged.set()

    def shutdown(self) -> None:
        self._stopping.set()
        self._nudged.set()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        self.job_id = await self._db.run(lambda s: jobs.start_job(s, job_type=SCHEDULER_JOB))
        logger.info(
            "Scheduler started job_id=%s",
            self.job_id,
            extra={"action": "scheduler_started", "job_id": self.job_id},
        )
        task_status.started()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    partial(
                        heartbeat_forever,
                        self._db,
                        self.job_id,
                        interval_s=self.settings.heartbeat_s,
                        part="Scheduler",
                    )
                )
                await self._loop()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                job_id = self.job_id
                await self._db.run(lambda s: jobs.end_job(s, job_id, state=JobState.SUCCESS))

    async def _loop(self) -> None:
        backoff = Backoff(self.settings.loop_interval_s)
        while not self._stopping.is_set():
            delay = self.settings.loop_interval_s
            try:
                await self.schedule_once()
            except SluiceError as exc:
                self._last_failure = time.monotonic()
                delay = backoff.failed()
                logger.warning(
                    "Scheduler loop failed (%d in a row), retrying in %.2fs: %s",
                    backoff.failures,
                    delay,
                    exc,
                    extra={"action": "scheduler_loop_failed", "failures": backoff.failures},
                )
            else:
                if failures := backoff.succeeded():
                    logger.info(
                        "Scheduler loop works again after %d failure(s)",
                        failures,
                        extra={"action": "scheduler_loop_recovered"},
                    )
            with anyio.move_on_after(delay):
                await self._nudged.wait()
            self._nudged = anyio.Event()

    async def schedule_once(self) -> None:
        self.stats.loops += 1
        dag_ids = await self._db.run(runs.dags_with_queued_events)
        for dag_id in dag_ids:
            run_pk = await self._db.run(partial(self._create_asset_run, dag_id=dag_id))
            if run_pk is not None:
                self.stats.runs_created += 1
                logger.info(
                    "Created asset-triggered run %s of DAG %s",
                    run_pk,
                    dag_id,
                    extra={"action": "dag_run_created", "dag_id": dag_id, "run": run_pk},
                )
        scheduled_before = self.stats.tasks_scheduled
        for run_pk in await self._db.run(runs.unfinished_runs):
            await self._db.run(partial(self._advance_run, run_pk=run_pk))
        if self.stats.tasks_scheduled > scheduled_before and self._on_tasks_scheduled:
            self._on_tasks_scheduled()
        await self._db.run(deferrals.fail_timed_out_deferrals)
        await self._recover_orphans()

    async def _recover_orphans(self) -> None:
        """Tasks held by an executor that stopped heartbeating go back to ``scheduled``."""
        now = time.monotonic()
        threshold = self.settings.executor_health_check_threshold_s
        if now - self._last_recovery < self.settings.heartbeat_s:
            return
        if now - self._last_failure < threshold:
            # The database was unreachable moments ago: the executors could not heartbeat
            # either. Give them a threshold to catch up before calling them dead.
            return
        self._last_recovery = now
        recovered = await self._db.run(partial(tasks.recover_orphaned_tasks, threshold_s=threshold))
        if recovered:
            logger.warning(
                "Recovered %d task(s) of a dead executor: %s",
                len(recovered),
                recovered,
                extra={"action": "tasks_recovered"},
            )

    def _create_asset_run(self, session: Session, dag_id: str) -> int | None:
        queued = runs.lock_queued_dag(session, dag_id)
        if queued is None or not queued.events:
            return None
        condition = BaseAsset.from_json(queued.schedule) if queued.schedule else None
        if not is_condition_met(condition, {name for _, name in queued.events}):
            return None
        return runs.create_run(
            session,
            dag_id,
            run_type=runs.ASSET_TRIGGERED,
            now=models.utcnow(),
            asset_event_ids=[event_id for event_id, _ in queued.events],
        )

    def _advance_run(self, session: Session, run_pk: int) -> None:
        state = runs.load_run_state(session, run_pk)
        if state is None:
            return
        now = models.utcnow()
        changes = next_task_states(state.downstream, state.task_states)
        to_trigger = [
            t
            for t, s in changes.items()
            if s == TaskState.SCHEDULED and t in state.start_from_trigger
        ]
        runs.set_task_states(session, run_pk, changes, now=now)
        for task_id in to_trigger:
            self._start_from_trigger(session, state.ti_ids[task_id])
        self.stats.tasks_scheduled += sum(s == TaskState.SCHEDULED for s in changes.values())
        if changes and state.state == DagRunState.QUEUED:
            runs.set_run_state(session, run_pk, DagRunState.RUNNING, now=now)
        outcome = run_outcome({**state.task_states, **changes})
        if outcome is not None:
            runs.set_run_state(session, run_pk, outcome, now=now)
            self.stats.runs_finished += 1

    def _start_from_trigger(self, session: Session, ti_id: int) -> None:
        deferrals.start_from_trigger(session, self._cipher, ti_id)
