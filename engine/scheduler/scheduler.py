"""The scheduler: asset events and clock ticks -> DAG runs -> ready task instances -> finished
runs.

Each loop runs at once when nudged by an in-process part or signalled by another process's
write (``RowsSignal``: on PostgreSQL the ``sluice_scheduler_work`` notifications of a run
created, a try ended, asset events queued; on SQLite any commit), else every
``loop_interval_sec`` while runs run and every ``idle_poll_interval_sec`` while none does:

1. every active, unpaused DAG with queued asset events whose schedule condition is now met
   gets one asset-triggered run; all its queued events are attached and consumed in the same
   transaction (the DAG row is locked with ``SKIP LOCKED`` on PostgreSQL, so two schedulers
   never create two runs from one event);
2. every active, unpaused time-scheduled DAG whose next run is due gets it (a ``scheduled``
   run for the timetable's next interval; unique per logical date, so two schedulers never
   create one interval twice), unless ``max_active_runs`` runs are already active; the next
   one is computed from the timetable (``engine.authoring.timetables``) and stored on the
   DAG row. In ``run`` a clock task of its own does this step, waking at the next tick, so
   a tick never waits for a long loop;
3. queued runs are admitted (``running``) while their DAG has room under ``max_active_runs``
   (a backfill's under its own limit; stamped once their transaction holds the lock);
   backfills whose runs all ended are completed;
4. each running run's tasks advance (``engine.advancing.rules.next_states``): a ready
   task becomes ``scheduled`` for the executor (or goes straight to the triggerer when it
   starts from a trigger); a run whose tasks all finished ends;
5. tasks ``up_for_retry`` whose retry delay has passed (by the scheduler's clock) are
   ``scheduled`` again for their next try; deferrals past their timeout fail (both before
   queued runs are admitted, in the transaction that times runs out, see below).

Before queued runs are admitted, running runs older than their DAG's ``dagrun_timeout`` (by
the scheduler's clock) fail, their unfinished tasks skipped (running ones are stopped by
their executor), which makes room for the next queued run; then runs get their deadlines
and those past due fire their callbacks (``engine.scheduler.deadlines``).

Paused DAGs keep their queued events; on unpause they create the run they would have created.
A paused time-scheduled DAG creates no runs; on unpause its next run is computed afresh.
"""

from __future__ import annotations

import logging
import math
import time
from functools import partial
from typing import TYPE_CHECKING, Final

import anyio

from engine.advancing.advance import advance_run
from engine.advancing.rules import is_condition_met
from engine.authoring.assets import BaseAsset
from engine.db import models
from engine.db.listen import LISTEN_SCHEDULER_WORK, process_token
from engine.db.queries import (
    actions,
    advancing,
    asset_queue,
    backfills,
    deferrals,
    jobs,
    run_ends,
    runs,
    time_schedules,
)
from engine.exceptions import SluiceError
from engine.jobs.service import JobService
from engine.jobs.wakeup import RowsSignal
from engine.metrics.readings import SchedulerReading
from engine.retry import Backoff
from engine.scheduler import deadlines, orphans
from engine.scheduler.partition_runs import create_partitioned_runs, partitioned_timetable
from engine.scheduler.settings import SchedulerSettings, SchedulerStats
from engine.scheduler.time_runs import create_time_run, store_next

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.crypto import KwargsCipher
    from engine.db.database import Database

__all__ = ("SCHEDULER_JOB", "Scheduler", "SchedulerSettings", "SchedulerStats")

logger = logging.getLogger(__name__)

SCHEDULER_JOB: Final = jobs.SCHEDULER_JOB
TIME_RUN_BATCH: Final = 50  # due DAGs per transaction
#: running runs advanced per transaction: a commit per run made 1,000 running runs cost
#: 1,000 commits (a WAL flush each on PostgreSQL) every loop
ADVANCE_BATCH: Final = 50
CLOCK_POLL_S: Final = 1.0  # the clock task's longest sleep (a new DAG waits at most this)


class Scheduler:
    def __init__(
        self,
        *,
        db: Database,
        cipher: KwargsCipher,
        settings: SchedulerSettings,
        on_tasks_scheduled: Callable[[], None] | None = None,
        clock: Callable[[], datetime] = models.utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = db
        self._clock = clock
        self._monotonic = monotonic
        self._next_time_run: datetime | None = None
        #: set while ``run`` has its clock task creating time runs (``schedule_once`` then
        #: leaves them to it); tests that call ``schedule_once`` alone get them there
        self._clock_task_running = False
        self._clock_wake = anyio.Event()
        #: an executor of this process ended a run (``run_ended``) since the last loop
        self._runs_ended_elsewhere = False
        self._on_tasks_scheduled = on_tasks_scheduled
        self._last_recovery = 0.0
        #: monotonic time of the last failed loop, or of the first loop after failed ones
        self._last_failure = -math.inf
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
        created = ((runs.ASSET_TRIGGERED, s.runs_created), (runs.SCHEDULED, s.time_runs_created))
        return SchedulerReading(self.job_id, created, s.tasks_scheduled, s.runs_finished)

    def nudge(self) -> None:
        """Run the next loop now (called when asset events or task outcomes were stored)."""
        self._nudged.set()

    def run_ended(self) -> None:
        """An executor's pass ended a run: loop now, and wake the clock task (a time run
        its DAG's ``max_active_runs`` held may be due)."""
        self._runs_ended_elsewhere = True
        self.nudge()

    def shutdown(self) -> None:
        self._stopping.set()
        self._nudged.set()
        self._clock_wake.set()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        job = JobService(
            self._db,
            job_type=SCHEDULER_JOB,
            part="Scheduler",
            heartbeat_s=self.settings.heartbeat_s,
        )
        async with job.running(wake=self._work_signal()) as job_id:
            self.job_id = job_id
            logger.info(
                "Scheduler started job_id=%s",
                job_id,
                extra={"action": "scheduler_started", "job_id": job_id},
            )
            task_status.started()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._clock_loop)
                await self._loop()
                tg.cancel_scope.cancel()

    def _work_signal(self) -> RowsSignal:
        """Loop at once when another process (or this one's API) may have written work:
        on PostgreSQL the transactions that do notify ``SCHEDULER_WORK_CHANNEL``; on
        SQLite any commit (at most one signal per ``SQLITE_SIGNAL_GAP_S``)."""
        return RowsSignal(
            self._db,
            self.nudge,
            listen=LISTEN_SCHEDULER_WORK,
            what="scheduler work",
            ignore_payload=process_token(),  # a try ended here: the executor nudged us
        )

    async def _loop(self) -> None:
        backoff = Backoff(self.settings.loop_interval_s)
        while not self._stopping.is_set():
            before = self.stats.progress()
            if backoff.failures:
                # The database may have come back a moment ago: the executors, which could
                # not heartbeat either, get a threshold from now on (``_recover_orphans``).
                self._last_failure = self._monotonic()
            try:
                await self.schedule_once()
            except SluiceError as exc:
                self._last_failure = self._monotonic()
                delay = backoff.failed()
                logger.warning(
                    "Scheduler loop failed (%d in a row), retrying in %.2fs: %s",
                    backoff.failures,
                    delay,
                    exc,
                    extra={"action": "scheduler_loop_failed", "failures": backoff.failures},
                )
            else:
                delay = self._poll_after(before)
                if failures := backoff.succeeded():
                    logger.info(
                        "Scheduler loop works again after %d failure(s)",
                        failures,
                        extra={"action": "scheduler_loop_recovered"},
                    )
            with anyio.move_on_after(delay):
                await self._nudged.wait()
            self._nudged = anyio.Event()

    def _poll_after(self, before: tuple[int, int, int, int]) -> float:
        """How long to wait for a nudge after a loop: ``loop_interval_s`` while runs run
        or the loop made progress, else ``idle_poll_s``."""
        busy = self.stats.running_runs or self.stats.progress() != before
        return self.settings.loop_interval_s if busy else self.settings.idle_poll_s

    async def _clock_loop(self) -> None:
        """Create time runs as their ticks come, apart from the main loop.

        The main loop's length grows with the runs it advances; a tick must not wait for
        it. This task sleeps until the next due time run (at most ``CLOCK_POLL_S``, so a new
        or changed DAG is seen; at once when the main loop ended a run, which may release a
        run held by ``max_active_runs``), creates what is due, and nudges the main loop to
        admit the new runs and schedule their first tasks. It only reads until something is
        due.
        """
        self._clock_task_running = True
        backoff = Backoff(self.settings.loop_interval_s)
        try:
            while not self._stopping.is_set():
                delay = CLOCK_POLL_S
                try:
                    created = await self._create_time_runs()
                except SluiceError as exc:
                    delay = backoff.failed()
                    logger.warning(
                        "Creating time runs failed (%d in a row), retrying in %.2fs: %s",
                        backoff.failures,
                        delay,
                        exc,
                        extra={"action": "time_runs_failed", "failures": backoff.failures},
                    )
                else:
                    backoff.succeeded()
                    if created:
                        self.nudge()
                    delay = self._until_next_tick(delay)
                with anyio.move_on_after(delay):
                    await self._clock_wake.wait()
                self._clock_wake = anyio.Event()
        finally:
            self._clock_task_running = False

    def _until_next_tick(self, delay: float) -> float:
        """``delay``, or less when the next time run is due sooner."""
        if self._next_time_run is None:
            return delay
        until = (self._next_time_run - self._clock()).total_seconds()
        # A due run that waits (max_active_runs reached) must not make the loop spin.
        return delay if until <= 0 else min(delay, until)

    async def schedule_once(self) -> None:
        self.stats.loops += 1
        dag_ids = await self._db.run(asset_queue.dags_with_queued_events)
        scheduled_before = self.stats.tasks_scheduled
        for dag_id in dag_ids:
            created = await self._db.run(partial(self._start_asset_runs, dag_id=dag_id))
            for run_pk in created:
                self.stats.runs_created += 1
                logger.info(
                    "Created asset-triggered run %s of DAG %s",
                    run_pk,
                    dag_id,
                    extra={"action": "dag_run_created", "dag_id": dag_id, "run": run_pk},
                )
        if self.stats.tasks_scheduled > scheduled_before and self._on_tasks_scheduled:
            self._on_tasks_scheduled()  # the new runs' first tasks: claimed while we go on
        if not self._clock_task_running:
            await self._create_time_runs()
        scheduled_before = self.stats.tasks_scheduled
        finished_before = self.stats.runs_finished
        await self._settle_due_by_clock()
        await deadlines.check_deadlines(self._db, now=self._clock())
        await self._start_queued_runs()
        to_advance, self.stats.running_runs = await self._db.read(advancing.unfinished_runs)
        for start in range(0, len(to_advance), ADVANCE_BATCH):
            batch = to_advance[start : start + ADVANCE_BATCH]
            await self._db.run(partial(self._advance_runs, run_pks=batch))
        if self.stats.tasks_scheduled > scheduled_before and self._on_tasks_scheduled:
            self._on_tasks_scheduled()
        ended_elsewhere, self._runs_ended_elsewhere = self._runs_ended_elsewhere, False
        if self.stats.runs_finished > finished_before or ended_elsewhere:
            self._clock_wake.set()  # a held time run may be due now
        # Runs also end in executors (their pass after a task's end): look every loop.
        if await self._db.read(backfills.has_finished_backfills):
            await self._db.run(partial(backfills.complete_finished_backfills, now=self._clock()))
        await self._recover_orphans()

    async def _settle_due_by_clock(self) -> None:
        """What the scheduler's clock made due, in one transaction (three per loop before,
        each a round trip or more on PostgreSQL), when a read found some (a write each loop
        took the write lock from the other parts for nothing, nearly always): running runs
        past their DAG's ``dagrun_timeout`` fail (Airflow: the run fails, its unfinished
        tasks are skipped), tasks ``up_for_retry`` whose delay has passed become
        ``scheduled`` for their next try, tasks deferred past their timeout fail."""
        now = self._clock()
        probe = partial(advancing.has_clock_work, now=now, deferrals_now=models.utcnow())
        if not await self._db.read(probe):
            return

        def settle(session: Session) -> tuple[list[run_ends.EndedRun], list[int]]:
            ended = run_ends.time_out_runs(session, now=now)
            released = runs.release_due_retries(session, now=now)
            deferrals.fail_timed_out_deferrals(session)
            return ended, released

        ended, released = await self._db.run(settle)
        self._log_timed_out(ended)
        if released:
            self.stats.tasks_scheduled += len(released)
            logger.info(
                "Scheduled %d task instance(s) for their next try after the retry delay: %s",
                len(released),
                released,
                extra={"action": "task_retry_due", "ti_ids": released},
            )

    def _log_timed_out(self, ended: list[run_ends.EndedRun]) -> None:
        for run in ended:
            self.stats.runs_finished += 1
            logger.warning(
                "Run %s of DAG %s timed out: started %s, dagrun_timeout %gs; failed, "
                "%d unfinished task(s) skipped: %s",
                run.run_id,
                run.dag_id,
                run.start_date.isoformat() if run.start_date else "-",
                run.timeout_s,
                len(run.tasks),
                [change.task_id for change in run.tasks],
                extra={
                    "action": "dag_run_timed_out",
                    "dag_id": run.dag_id,
                    "run_id": run.run_id,
                },
            )

    async def _recover_orphans(self) -> None:
        """Tasks held by an executor that stopped heartbeating: a queued one goes back to
        ``scheduled``, a running one's try failed (``up_for_retry`` or ``failed`` by its
        retries: ``engine.scheduler.orphans``)."""
        now = self._monotonic()
        threshold = self.settings.executor_health_check_threshold_s
        if now - self._last_recovery < self.settings.heartbeat_s:
            return
        if now - self._last_failure < threshold:
            # The database was unreachable until moments ago (for all this loop knows, until
            # its first loop that worked again): the executors could not heartbeat either.
            # Give them a threshold of a reachable database before calling them dead.
            return
        self._last_recovery = now
        recover = partial(
            orphans.recover_orphaned_tasks,
            threshold_s=threshold,
            running_threshold_s=max(threshold, self.settings.task_heartbeat_timeout_s),
            now=self._clock(),
        )
        recovery = await self._db.run(recover)
        released = await self._db.run(
            partial(actions.release_orphaned_restarts, threshold_s=threshold)
        )
        if released:
            logger.warning(
                "Cleared task(s) of a dead executor are ready to run again: %s",
                released,
                extra={"action": "restarts_released", "ti_ids": released},
            )
        if recovery.requeued:
            logger.warning(
                "Recovered %d queued task(s) of a dead executor: %s",
                len(recovery.requeued),
                recovery.requeued,
                extra={"action": "tasks_recovered", "ti_ids": recovery.requeued},
            )
            if self._on_tasks_scheduled:
                self._on_tasks_scheduled()
        for lost in recovery.lost:
            extra = {"action": "task_lost", "state": lost.state, **lost.log_fields()}
            logger.warning("%s", lost.message(), extra=extra)
        if recovery.lost:
            self.nudge()  # decide the runs of the failed tries now

    def _start_asset_runs(self, session: Session, dag_id: str) -> list[int]:
        """``_create_asset_runs``, then, in the same transaction, the DAG's queued runs
        admitted while it has room and the admitted ones advanced once (their first tasks
        ``scheduled``): an event's run starts without waiting for two more transactions of
        this loop (admission, advance), each a wait for the write lock."""
        created = self._create_asset_runs(session, dag_id)
        if created:
            for run_pk in runs.start_queued_runs(session, dag_id, now=self._clock()):
                self._advance_run(session, run_pk)
        return created

    def _create_asset_runs(self, session: Session, dag_id: str) -> list[int]:
        queued = asset_queue.lock_queued_dag(session, dag_id)
        if queued is None or not queued.updated:
            return []
        timetable = partitioned_timetable(queued)
        if timetable is not None:  # one run per partition key (engine.scheduler.partition_runs)
            return create_partitioned_runs(session, queued, timetable, now=self._clock())
        condition = BaseAsset.from_json(queued.schedule) if queued.schedule else None
        if not is_condition_met(condition, queued.updated, queued.aliases):
            return []
        now = self._clock()
        run_pk = runs.create_run(
            session, dag_id, run_type=runs.ASSET_TRIGGERED, now=now, run_after=now
        )
        if run_pk is None:
            return []
        # the run consumes its events set-wise (a busy watcher queues thousands per run)
        asset_queue.consume_queued_events(session, dag_id, run_pk, queued.last_event_id)
        return [run_pk]

    # --- time schedules ---------------------------------------------------------------------

    async def _create_time_runs(self) -> int:
        """Create every due time run; returns how many were created.

        Due DAGs are handled ``TIME_RUN_BATCH`` to a transaction: at a round hour hundreds
        of DAGs tick at once, and one commit each would make the last one wait.
        """
        created_count = 0
        now = self._clock()
        due = await self._db.read(partial(time_schedules.dags_due_for_time_runs, now=now))
        for start in range(0, len(due), TIME_RUN_BATCH):
            batch = due[start : start + TIME_RUN_BATCH]
            created = await self._db.run(partial(self._create_time_run_batch, dag_ids=batch))
            for dag_id, run_pk, logical_date in created:
                created_count += 1
                self.stats.time_runs_created += 1
                logger.info(
                    "Created scheduled run %s of DAG %s for %s",
                    run_pk,
                    dag_id,
                    logical_date.isoformat(),
                    extra={"action": "dag_run_created", "dag_id": dag_id, "run": run_pk},
                )
        self._next_time_run = await self._db.read(time_schedules.next_time_run_at)
        return created_count

    def _create_time_run_batch(
        self, session: Session, dag_ids: list[str]
    ) -> list[tuple[str, int, datetime]]:
        created: list[tuple[str, int, datetime]] = []
        for dag_id in dag_ids:
            try:
                result = create_time_run(session, dag_id, now=self._clock())
            except ValueError as exc:  # a stored timetable this version cannot read
                logger.error(
                    "DAG %s: cannot read its stored schedule, no time runs until its file "
                    "changes: %s",
                    dag_id,
                    exc,
                    extra={"action": "timetable_unreadable", "dag_id": dag_id},
                )
                store_next(session, dag_id, None)  # said once, not every loop
                continue
            if result is not None:
                created.append((dag_id, *result))
        return created

    async def _start_queued_runs(self) -> None:
        for dag_id in await self._db.read(partial(runs.dags_with_queued_runs, now=self._clock())):
            await self._db.run(partial(runs.start_queued_runs, dag_id=dag_id, now=self._clock))

    def _advance_runs(self, session: Session, run_pks: list[int]) -> None:
        """Advance ``run_pks`` in one transaction (``ADVANCE_BATCH`` of them)."""
        for run_pk in run_pks:
            self._advance_run(session, run_pk)

    def _advance_run(self, session: Session, run_pk: int) -> None:
        advanced = advance_run(session, self._cipher, run_pk)
        if advanced is None:
            return  # ended since it was listed (cancelled, timed out), or advanced elsewhere
        self.stats.tasks_scheduled += advanced.scheduled
        if advanced.decided:
            self.nudge()  # a mapped task skipped, failed or expanded: decide below it now
        if advanced.ended:
            self.stats.runs_finished += 1
