"""The local executor: runs ``scheduled`` task instances, one child process per task step.

Theory of operation. The executor registers an ``executor`` job and heartbeats it
(``engine.jobs.service``). Its claim loop moves up to ``parallelism - running`` task
instances from ``scheduled`` to ``queued`` (``SKIP LOCKED`` on PostgreSQL) and starts one
supervisor task per claim. It claims when a part of its own process says there is work
(``nudge``), when a slot frees while every slot was taken, every ``poll_interval_s`` while
slots are idle, and at once when another process
may have made task instances ``scheduled`` (``engine.jobs.wakeup.RowsSignal``: a PostgreSQL
notification from migration 0019's row triggers, or on SQLite any commit, answered by a
cheap read first; a signal for rows the last claim left, e.g. for want of pool slots, is
not answered: the poll retries them).

A supervisor starts the step's child: a standby forked ahead from the executor's warm
runner (``warm_process``, a pre-imported process; handing a standby its step costs one
message where a fresh interpreter costs ~100 ms) or, while none is ready, ``python -P -m
engine.execution.task_runner``; either way a task process in its own session, running the
same code. It marks the task instance ``running``
(with the child's pid), sends it a ``TaskSpec`` and appends what the child prints to the
try's log file. When the child exits, the supervisor turns its ``TaskResult`` (or its exit status,
when it died without one) into an ``Outcome`` (``decide_outcome``, pure) and writes it in one
transaction: success (with the return value), failure or retry, or a deferral (trigger row
with encrypted kwargs + ``deferred`` state). Then the slot is free: a deferred task holds no
slot while it waits.

Every write is guarded by this executor's job id, so a task recovered from an executor
presumed dead (``orphans.recover_orphaned_tasks``, called by the scheduler: a queued try
goes back to ``scheduled``, a running one's try failed, retried per the task's retries) is
never overwritten. A child outlives neither its executor (it exits when its stdin closes) nor the
execution deadline (killed ``kill_grace_s`` after it), nor an operator action that took its
task instance out of ``running`` (clear, set-state, a cancelled or timed-out run): every
``heartbeat_s`` the executor looks for such changes and stops those children's process
groups, and their outcomes are not recorded (``engine.db.queries.actions``).

Beside the task slots, a ``CallbackRunner`` (``engine.executor.callbacks``) runs the callback
requests (DAG callbacks of ended runs, callbacks of killed tries) in child processes. Each
claim admits only task instances that fit their pool and their run's ``max_active_tasks``
(``engine.executor.admission``).

Shutdown (``shutdown()``): stop claiming, let running children finish within
``shutdown_grace_s``, then SIGTERM (then SIGKILL) the rest. Their task instances go back to
``scheduled`` and rerun the interrupted step as the same try: being stopped is not the
task's fault, so it costs no retry.
"""

from __future__ import annotations

import logging
import math
import os
from functools import partial
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from engine.db import models
from engine.db.queries import tasks
from engine.exceptions import DatabaseError
from engine.executor import admission
from engine.executor.callbacks import CallbackRunner
from engine.executor.claiming import ClaimingExecutor, hostname
from engine.executor.task_supervisor import TaskSupervisor
from engine.executor.warm_process import WarmRunner
from engine.jobs.service import JobService
from engine.jobs.wakeup import RowsSignal
from engine.logs import child_environment
from engine.retry import Backoff

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskGroup, TaskStatus

    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.db.queries.pools import Candidate
    from engine.executor.recording import Recorded
    from engine.executor.settings import ExecutorSettings
    from engine.metrics.readings import ExecutorReading

logger = logging.getLogger(__name__)


class LocalExecutor(ClaimingExecutor):
    """Runs task instances in child processes on this machine, ``parallelism`` at a time;
    at ``shutdown`` running tasks get ``shutdown_grace_s`` to finish."""

    def __init__(
        self,
        *,
        db: Database,
        cipher: KwargsCipher,
        settings: ExecutorSettings,
        on_outcome: Callable[[Recorded], None] | None = None,
        watch_commits: bool = True,
    ) -> None:
        super().__init__(db=db, cipher=cipher, settings=settings)
        self._on_outcome = on_outcome
        #: on SQLite, look for scheduled tasks at every commit (``engine.jobs.wakeup``); off
        #: when this process's scheduler and triggerer, which schedule them, wake it anyway
        self._watch_commits = watch_commits
        self._claim_backoff = Backoff(settings.poll_interval_s)
        self._supervisor: TaskSupervisor | None = None
        #: the pre-imported process task steps are forked from (``warm_process``)
        self.warm_runner: WarmRunner | None = None
        self._active: set[int] = set()  # claimed task instances (slots in use)
        self._workers: TaskGroup | None = None
        self._slot_freed = anyio.Event()
        #: the last claim filled every free slot: a slot freed now may let a waiting task in
        self._saturated = False
        self._signalled = anyio.Event()  # another process may have made tasks scheduled
        #: ``tasks.scheduled_tasks_digest`` when a signal asked for the next claim, and of
        #: the rows such a claim left although slots were free (signals for them are ignored
        #: until a claim takes something)
        self._signal_digest: tuple[int, int] | None = None
        self._left_digest: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return (
            f"LocalExecutor(job_id={self.job_id}, running={self.running}/"
            f"{self.settings.parallelism}, stopping={self._stopping.is_set()}, "
            f"stats={self.stats})"
        )

    def metrics_reading(self) -> ExecutorReading:
        return self._reading(self.running)

    @property
    def running(self) -> int:
        """Slots in use: task instances claimed and not finished yet."""
        return len(self._active)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        settings = self.settings
        environment = partial(child_environment, os.environ, settings.secrets)
        folders = [f for f in (settings.dags_folder, settings.plugins_folder) if f is not None]
        folders = folders if settings.warm_runner_dag_imports else []
        self.warm_runner = (
            WarmRunner(environment=environment, dag_folders=folders)
            if settings.warm_runner
            else None
        )
        self._supervisor = TaskSupervisor(
            db=self._db,
            cipher=self._cipher,
            settings=settings,
            hostname=await anyio.to_thread.run_sync(hostname),
            stats=self.stats,
            on_outcome=self._outcome_recorded,
            claims=self,
            warm=self.warm_runner,
        )
        job = JobService(
            self._db,
            job_type=tasks.EXECUTOR_JOB,
            part="Executor",
            heartbeat_s=settings.heartbeat_s,
            capacity=settings.parallelism,
        )
        signal = self._rows_signal()
        try:
            async with job.running(wake=signal) as job_id:
                self.job_id = job_id
                logger.info(
                    "Executor started job_id=%s parallelism=%d",
                    job_id,
                    settings.parallelism,
                    extra={"action": "executor_started", "job_id": job_id},
                )
                await self._serve(job_id, signal, task_status)
        finally:
            logger.info("Executor stopped", extra={"action": "executor_stopped"})

    async def _serve(
        self, job_id: int, signal: RowsSignal | None, task_status: TaskStatus[None]
    ) -> None:
        assert self._supervisor is not None
        async with anyio.create_task_group() as outer:
            outer.start_soon(self._supervisor.stop_changed_forever, job_id)
            if signal is not None:
                outer.start_soon(self._answer_signals, signal.source == "postgresql")
            if self.warm_runner is not None:
                await outer.start(self.warm_runner.run)
            callbacks = CallbackRunner(
                db=self._db,
                cipher=self._cipher,
                settings=self.settings,
                environment=child_environment(os.environ, self.settings.secrets),
            )
            outer.start_soon(callbacks.run, job_id)  # DAG callbacks, lost task callbacks
            task_status.started()
            async with anyio.create_task_group() as workers:
                self._workers = workers
                workers.start_soon(self._stop_children_after_grace)
                await self._claim_loop(workers, job_id)
            self._workers = None
            outer.cancel_scope.cancel()

    # --- claiming -----------------------------------------------------------------------

    async def _claim_loop(self, workers: TaskGroup, job_id: int) -> None:
        while not self._stopping.is_set():
            changed = self._changed
            free = self.settings.parallelism - len(self._active)
            signalled, self._signal_digest = self._signal_digest, None
            claimed = await self._claim(job_id, free) if free > 0 else []
            for step in claimed:
                self._start(workers, job_id, step)
            idle_slots = free - len(claimed) > 0
            self._saturated = not idle_slots
            if claimed:
                self._left_digest = None
            elif free > 0 and signalled is not None:
                self._left_digest = await self._still_left(signalled)
            if not idle_slots and len(self._active) < self.settings.parallelism:
                # The claim took all it asked for and a step ended meanwhile (its end saw
                # idle slots, so it did not nudge): more work may wait for the freed slot.
                continue
            with anyio.move_on_after(self.settings.poll_interval_s if idle_slots else math.inf):
                await changed.wait()

    async def _claim(self, job_id: int, free: int) -> list[Candidate]:
        now = models.utcnow()
        try:
            claimed = await self._db.run(
                partial(
                    admission.claim_task_steps,
                    job_id=job_id,
                    limit=free,
                    now=now,
                    warnings=self._pool_warnings,
                )
            )
        except DatabaseError as exc:
            delay = self._claim_backoff.failed()
            logger.warning(
                "Claiming tasks failed (%d in a row), retrying in %.2fs: %s",
                self._claim_backoff.failures,
                delay,
                exc,
                extra={"action": "claim_failed", "failures": self._claim_backoff.failures},
            )
            await anyio.sleep(delay)
            return []
        self._claim_backoff.succeeded()
        self.stats.claimed += len(claimed)
        return claimed

    def _rows_signal(self) -> RowsSignal | None:
        """The listener for task instances other processes make scheduled; None when this
        executor does not listen (SQLite, when ``watch_commits`` is off)."""
        signal = RowsSignal(
            self._db,
            lambda: self._signalled.set(),  # the current event, not the first one
            listen=tasks.LISTEN_SCHEDULED_TASKS,
            what="scheduled task instances",
        )
        if signal.source == "sqlite-wal" and not self._watch_commits:
            return None
        return signal

    async def _still_left(self, signalled: tuple[int, int]) -> tuple[int, int] | None:
        """``signalled`` if the scheduled rows a signal showed are still there after a claim
        took none of them: rows it cannot take now (pools, limits); signals for them are
        ignored. (An empty claim may also just have come after another claim took them.)"""
        try:
            digest = await self._db.read(tasks.scheduled_tasks_digest)
        except DatabaseError:
            return None
        return digest if digest == signalled else None

    async def _answer_signals(self, exact: bool) -> None:
        """Claim when another process may have made task instances ``scheduled``: at once
        when the signal says so (``exact``: PostgreSQL's notification), else (SQLite: any
        commit) when a read finds scheduled rows other than those the last claim left."""
        while True:
            await self._signalled.wait()
            self._signalled = anyio.Event()  # signals from now on ask for another look
            if self.running >= self.settings.parallelism:
                continue  # the slot that frees first claims (``_run_ti``)
            if exact:
                self.nudge()
                continue
            try:
                digest = await self._db.read(tasks.scheduled_tasks_digest)
            except DatabaseError:
                continue  # the poll claims meanwhile
            if digest != (0, 0) and digest != self._left_digest:
                self._signal_digest = digest
                self.nudge()

    async def _stop_children_after_grace(self) -> None:
        await self._stopping.wait()
        with anyio.move_on_after(self.settings.shutdown_grace_s):
            await self._until_idle()
        if not self._active:
            return
        logger.warning(
            "Stopping %d running task(s) after the %gs shutdown grace period; they will run "
            "again as the same try",
            len(self._active),
            self.settings.shutdown_grace_s,
            extra={"action": "executor_interrupting", "ti_ids": sorted(self._active)},
        )
        assert self._supervisor is not None
        self._supervisor.interrupt_all()
        with anyio.move_on_after(self.settings.kill_grace_s):
            await self._until_idle()
        self._supervisor.kill_all()

    async def _until_idle(self) -> None:
        while self._active:
            await self._slot_freed.wait()

    # --- one task step ------------------------------------------------------------------

    def claim_room(self) -> tuple[int, bool]:
        """The slots an outcome's transaction may claim for (``OutcomeClaims``): the one
        its step frees (still counted in use meanwhile: no claim of the claim loop's takes
        it), none while stopping; other idle slots stay the claim loop's. Whether the last
        claim filled every slot is left as it is: the step's end still nudges the claim
        loop then (``_run_ti``), which finds no free slot when this claim took it."""
        if self._stopping.is_set() or self._workers is None:
            return 0, False
        return 1, self._saturated

    def _start(self, workers: TaskGroup, job_id: int, step: Candidate) -> None:
        self._active.add(step.ti_id)
        workers.start_soon(self._run_ti, job_id, step, name=f"task instance {step.ti_id}")

    def _outcome_recorded(self, recorded: Recorded) -> None:
        claimed = recorded.claimed or ()
        if claimed and self._workers is not None and self.job_id is not None:
            for step in claimed:  # claimed in the outcome's transaction
                self._start(self._workers, self.job_id, step)
        if recorded.scheduled > len(claimed):
            self.nudge()  # what the step's end made ready in its run: claim it now
        if self._on_outcome is not None:
            self._on_outcome(recorded)

    async def _run_ti(self, job_id: int, step: Candidate) -> None:
        assert self._supervisor is not None
        try:
            await self._supervisor.execute(job_id, step.ti_id, step)
        finally:
            self._active.discard(step.ti_id)
            self._slot_freed.set()
            self._slot_freed = anyio.Event()
            # A claim that left slots idle found no more work: until a nudge or the poll
            # says otherwise there is none, and another claim would only take the write
            # lock (on SQLite, from the triggerer taking this step's deferral, say).
            if self._saturated or self._stopping.is_set():
                self.nudge()
