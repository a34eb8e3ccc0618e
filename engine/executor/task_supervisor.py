"""Supervising one task step: spawn the child, feed it, log it, judge it, record it.

Used by ``engine.executor.local.LocalExecutor`` and the Celery worker, one
``TaskSupervisor.execute`` per claimed task instance. The child (a task process,
``engine.executor.task_process``, running ``engine.execution.task_runner``) gets its
``TaskSpec`` on stdin; what it prints goes to the try's log (``engine.executor.task_logs``);
its ``TaskResult`` (or, when it died without one, its exit status) becomes an ``Outcome``
(``engine.executor.outcomes``) that ``engine.executor.recording`` writes in one transaction
guarded by the executor's job id.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
from contextlib import suppress
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Final

import anyio

from engine.db import models
from engine.db.queries import actions, tasks
from engine.exceptions import DatabaseError
from engine.execution.protocol import TaskPrelude, TaskResult
from engine.executor.callbacks import lost_callback_spec
from engine.executor.outcomes import (
    Decision,
    Outcome,
    decide_outcome,
    header_line,
    kill_after_s,
    outcome_line,
    read_result,
)
from engine.executor.recording import OutcomeClaims, OutcomeRecorder, Recorded, run_retrying
from engine.executor.task_logs import TaskLogWriter, log_path
from engine.executor.task_process import (
    StepProcess,
    TaskProcess,
    drain,
    pump,
    start_cold,
)
from engine.executor.task_requests import TaskRequestServer
from engine.executor.task_specs import build_spec, with_results
from engine.logs import child_environment

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.db.queries.pools import Candidate
    from engine.db.queries.tasks import TaskRun
    from engine.executor.settings import ExecutorSettings, ExecutorStats
    from engine.executor.warm_process import WarmRunner

logger = logging.getLogger(__name__)

DRAIN_AFTER_EXIT_S: Final = 5.0  # reading what is left in the pipes once the child exited
RESULT_MAX_BYTES: Final = 64 * 1024 * 1024
SPAWN_RETRY_DELAY_S: Final = 1.0


class TaskSupervisor:
    """Runs task steps for one executor; ``processes`` holds the live children by ti id."""

    def __init__(
        self,
        *,
        db: Database,
        cipher: KwargsCipher,
        settings: ExecutorSettings,
        hostname: str,
        stats: ExecutorStats,
        on_outcome: Callable[[Recorded], None] | None = None,
        claims: OutcomeClaims | None = None,
        warm: WarmRunner | None = None,
    ) -> None:
        self._db = db
        self._recorder = OutcomeRecorder(
            db=db,
            cipher=cipher,
            settings=settings,
            stats=stats,
            on_outcome=on_outcome,
            claims=claims,
        )
        #: forks task processes from a pre-imported process; without one (or while it is
        #: down) each step starts a cold interpreter
        self._warm = warm
        self._cipher = cipher
        self.settings = settings
        self._hostname = hostname
        self.stats = stats
        self.processes: dict[int, TaskProcess] = {}
        self.interrupting = False

    def __repr__(self) -> str:
        return f"<TaskSupervisor processes={sorted(self.processes)}>"

    def interrupt_all(self) -> None:
        """SIGTERM every task process, now and as they start (the shutdown grace is over)."""
        self.interrupting = True
        for process in list(self.processes.values()):
            process.interrupt()

    def kill_all(self) -> None:
        for process in list(self.processes.values()):
            process.signal_group(signal.SIGKILL)

    async def stop_changed(self, job_id: int) -> list[int]:
        """Stop the running children whose task instance an operator action took out of
        ``running`` under ``job_id`` (cleared, marked, run cancelled or timed out); returns
        their ti ids."""
        watched = [ti for ti, p in self.processes.items() if p.started and p.external_state is None]
        if not watched:
            return []
        query = partial(actions.changed_task_instances, ti_ids=watched, job_id=job_id)
        changed = await self._db.read(query)
        for ti_id, state in changed.items():
            child = self.processes.get(ti_id)
            if child is not None and child.process.returncode is None:
                child.changed_externally(state)
        return sorted(changed)

    async def stop_changed_forever(self, job_id: int) -> None:
        """Every ``heartbeat_s`` until cancelled, ``stop_changed``; a failed look is logged
        and tried again at the next round."""
        while True:
            await anyio.sleep(self.settings.heartbeat_s)
            if not self.processes:
                continue
            try:
                stopped = await self.stop_changed(job_id)
            except DatabaseError as exc:
                logger.warning(
                    "Checking running tasks for external state changes failed: %s",
                    exc,
                    extra={"action": "external_check_failed"},
                )
                continue
            if stopped:
                logger.info(
                    "Stopping %d task(s) whose state was set from outside: %s",
                    len(stopped),
                    stopped,
                    extra={"action": "tasks_externally_changed", "ti_ids": stopped},
                )

    async def execute(self, job_id: int, ti_id: int, claimed: Candidate | None = None) -> None:
        """Run the next step of task instance ``ti_id`` (claimed by ``job_id``: ``claimed``
        names its task and DAG file, which its process then imports while the try is marked
        running) and record its outcome; the child is killed whatever happens to this
        coroutine."""
        try:
            await self._execute(job_id, ti_id, claimed)
        except DatabaseError as exc:  # not transient: a bug or bad data, retrying won't help
            logger.error(
                "Task instance %s: cannot record its state (%s); failing it",
                ti_id,
                exc,
                extra={"action": "task_state_unrecorded", "ti_id": ti_id},
            )
            fail = partial(tasks.fail_held_task, ti_id=ti_id, job_id=job_id)
            with suppress(DatabaseError):
                await self._db.run(fail)
        finally:
            self.processes.pop(ti_id, None)

    async def _spawn(self, job_id: int, ti_id: int) -> TaskProcess | None:
        ours: socket.socket | None = None
        theirs: socket.socket | None = None
        try:
            ours, theirs = socket.socketpair()  # the task's request channel
            env = child_environment(os.environ, self.settings.secrets)
            process: StepProcess | None = None
            if self._warm is not None:
                process = await self._warm.spawn(ti_id=ti_id, env=env, channel_fd=theirs.fileno())
            if process is None:
                process = await start_cold(ti_id, env, theirs.fileno())
            return TaskProcess(ti_id, process, ours)
        except OSError as exc:  # e.g. out of processes or file descriptors: try again later
            if ours is not None:
                ours.close()
            logger.error(
                "Cannot start a process for task instance %s (%s); it goes back to scheduled",
                ti_id,
                exc,
                extra={"action": "task_spawn_failed", "ti_id": ti_id},
            )
            requeue = partial(tasks.requeue_task, ti_id=ti_id, job_id=job_id)
            await run_retrying(self._db, requeue)
            await anyio.sleep(SPAWN_RETRY_DELAY_S)  # keeps the slot busy a moment
            return None
        finally:
            if theirs is not None:
                theirs.close()  # the child has its copy

    async def _execute(self, job_id: int, ti_id: int, claimed: Candidate | None) -> None:
        child = await self._spawn(job_id, ti_id)
        if child is None:
            return
        process = child.process
        self.processes[ti_id] = child
        if self.interrupting:
            child.interrupt()  # spawned as the shutdown began: the step reruns later
        try:
            await self._run_and_record(job_id, child, claimed)
        finally:
            await process.aclose()  # reaped after the record: its exit is not waited for

    async def _run_and_record(
        self, job_id: int, child: TaskProcess, claimed: Candidate | None
    ) -> None:
        process = child.process
        try:
            if claimed is not None and claimed.fileloc:
                await self._send_prelude(child, claimed)
            run = await self._start(job_id, child)
            if run is None:
                return
            child.started = True
            log = TaskLogWriter(self._log_path(run), secrets=self.settings.secrets)
            try:
                # the task's error text leaves the log below: mask what the log masks
                outcome = (await self._supervise(child, run, log)).redacted(log.redact)
                if child.external_state is None:
                    await log.write(outcome_line(outcome, run, now=models.utcnow()).encode())
            finally:
                log.close()
        finally:
            if process.returncode is None:
                child.signal_group(signal.SIGKILL)
            if child.channel is not None:
                child.channel.close()
        lost = None
        if not child.reported and child.external_state is None:  # killed or crashed
            lost = lost_callback_spec(run, outcome, self.settings)
        await self._recorder.record(job_id, run, outcome, lost, external_state=child.external_state)

    async def _send_prelude(self, child: TaskProcess, claimed: Candidate) -> None:
        prelude = TaskPrelude(
            ti_id=claimed.ti_id,
            dag_id=claimed.dag_id,
            task_id=claimed.task_id,
            fileloc=claimed.fileloc,
            dags_folder=str(self.settings.dags_folder),
            plugins_folder=None
            if self.settings.plugins_folder is None
            else str(self.settings.plugins_folder),
        )
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            assert child.process.stdin is not None
            await child.process.stdin.send(prelude.to_json().encode() + b"\n")

    async def _start(self, job_id: int, child: TaskProcess) -> TaskRun | None:
        """Mark the task instance running with the child's pid; None if it is not ours."""
        start = partial(
            tasks.start_task_run,
            ti_id=child.ti_id,
            job_id=job_id,
            pid=child.process.pid,
            hostname=self._hostname,
            now=models.utcnow(),
        )
        run = await run_retrying(self._db, start)
        if run is None:
            logger.info(
                "Task instance %s is no longer queued for this executor; skipped",
                child.ti_id,
                extra={"action": "task_skipped", "ti_id": child.ti_id},
            )
        return run

    def _log_path(self, run: TaskRun) -> Path:
        folder = self.settings.task_log_folder
        return log_path(
            folder, run.dag_id, run.run_id, run.task_id, run.try_number, map_index=run.map_index
        )

    async def _supervise(self, child: TaskProcess, run: TaskRun, log: TaskLogWriter) -> Outcome:
        process = child.process
        now = models.utcnow()
        started = anyio.current_time()
        settings = self.settings
        spec = build_spec(
            run,
            dags_folder=settings.dags_folder,
            plugins_folder=settings.plugins_folder,
            default_deferrable=settings.default_deferrable,
        )
        spec = with_results(
            spec, run.xcoms, max_bytes=settings.max_xcom_size_bytes, mapped=run.mapped_xcoms
        )
        # The spec first: the child starts while the header is written (what it prints
        # meanwhile waits in its pipes; they are read into the log after the header).
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            assert process.stdin is not None
            await process.stdin.send(spec.to_json().encode() + b"\n")
        await log.write(
            header_line(run, pid=process.pid, hostname=self._hostname, now=now).encode()
        )
        out = bytearray()
        drained = anyio.Event()
        read: list[tuple[TaskResult | None, str | None]] = []  # the result, once drained

        async def drain_all() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pump, process.stderr, log)
                tg.start_soon(drain, process.stdout, out, RESULT_MAX_BYTES)
            read.append(read_result(bytes(out)))
            drained.set()

        async def reported() -> None:
            await drained.wait()
            if read[0][0] is None:
                await anyio.sleep_forever()  # nothing reported: the exit status tells

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain_all)
            if child.channel is not None:
                server = TaskRequestServer(
                    db=self._db,
                    cipher=self._cipher,
                    mask=log.add_secrets,
                    log_fields=run.log_fields(),
                    dag_fileloc=run.fileloc,
                    ti_id=run.ti_id,
                    state_retention_days=settings.state_store_retention_days,
                    run=(run.dag_id, run.run_id),
                )
                channel, child.channel = child.channel, None  # the server owns it now
                tg.start_soon(server.serve, channel)
            kill_after = kill_after_s(run, now=now, grace_s=settings.kill_grace_s)
            await self._wait(child, kill_after, log, reported)
            child.signal_group(signal.SIGKILL)  # what the task left running in its group
            with anyio.move_on_after(DRAIN_AFTER_EXIT_S):
                await drained.wait()
            tg.cancel_scope.cancel()
        result, problem = read[0] if read else read_result(bytes(out))
        child.reported = result is not None
        if problem:
            await log.write(f"[executor] {problem}\n".encode())
        outcome = decide_outcome(
            result,
            run,
            returncode=process.returncode,
            interrupted=child.interrupted,
            killed_for_timeout=child.killed_for_timeout,
            wall_s=anyio.current_time() - started,
            now=models.utcnow(),
        )
        keeps_results = outcome.decision in (Decision.SUCCEED, Decision.DEFER)
        if keeps_results and result is not None and result.xcoms:
            outcome = replace(outcome, xcoms=dict(result.xcoms))  # pushed ones too
        return outcome

    async def _wait(
        self,
        child: TaskProcess,
        kill_after: float | None,
        log: TaskLogWriter,
        reported: Callable[[], Awaitable[None]],
    ) -> None:
        """Until the child exits, or ``reported`` returns (it closed its output after its
        result: it is exiting, and its exit, the kernel freeing a forked interpreter's
        memory, need not be waited for); killed at its execution deadline, or stopped once
        an operator action changed its task instance (``_stop_when_changed``)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._stop_when_changed, child, log)
            with anyio.move_on_after(math.inf if kill_after is None else kill_after) as scope:
                await _first_of(child.process.wait, reported)
            tg.cancel_scope.cancel()
        if scope.cancelled_caught:
            child.killed_for_timeout = True
            child.signal_group(signal.SIGKILL)
            await child.process.wait()

    async def _stop_when_changed(self, child: TaskProcess, log: TaskLogWriter) -> None:
        """SIGTERM the child's process group once its state was set from outside, SIGKILL
        ``kill_grace_s`` later (as the shutdown does)."""
        await child.externally_changed.wait()
        await log.write(
            f"[executor] state externally set to {child.external_state}; stopping\n".encode()
        )
        child.signal_group(signal.SIGTERM)
        await anyio.sleep(self.settings.kill_grace_s)
        child.signal_group(signal.SIGKILL)


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Until the first of ``waits`` returns; the others are cancelled."""
    async with anyio.create_task_group() as tg:

        async def until(wait: Callable[[], Awaitable[object]]) -> None:
            await wait()
            tg.cancel_scope.cancel()

        for wait in waits:
            tg.start_soon(until, wait)
