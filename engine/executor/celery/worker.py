"""Inside ``sluice celery worker``: a Celery worker whose one task runs a Sluice task try.

Theory of operation. The worker process is a Sluice executor like a local one: it registers
an ``executor`` job (capacity = its concurrency), heartbeats it, and runs each try through
``engine.executor.task_supervisor.TaskSupervisor``, the local executor's supervisor: same
task runner child process, log file, results, outlets, deferral, execution timeout and
operator actions (``stop_changed``). What differs is where the claim comes from: a message
``(ti_id, sender_job_id)``. Before running anything the worker moves the try, still
``queued`` under the sender, to its own job (``take_over_queued``, one atomic UPDATE); a
message whose try is not waiting any more (another delivery took it, it finished, it is
running elsewhere, it was recovered and re-sent) is acknowledged and dropped, with the
reason in the log.

Celery runs the task on its ``threads`` pool: one worker process holds the database
connections and an event loop (an anyio blocking portal in a thread), and each pool thread
hands its try to that loop and blocks until the try's outcome is written. A deferring try
ends its Celery task there (the slot is free); its resume is a new message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from concurrent.futures import CancelledError, Future
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread

from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.queries import celery as celery_sql
from engine.db.queries import jobs, tasks
from engine.db.schema import check_schema
from engine.executor.celery.app import RUN_TRY_TASK, celery_app
from engine.executor.claiming import hostname
from engine.executor.recording import run_retrying
from engine.executor.settings import ExecutorSettings, ExecutorStats
from engine.executor.task_supervisor import TaskSupervisor
from engine.executor.warm_process import WarmRunner
from engine.jobs.service import FINAL_WRITE_TIMEOUT_S, JobService
from engine.logs import child_environment

if TYPE_CHECKING:
    from concurrent.futures import Future

    from celery import Celery
    from sqlalchemy.orm import Session

    from engine.config import Config

logger = logging.getLogger(__name__)


class WorkerRuntime:
    """The Sluice side of one Celery worker process: its executor job, its supervisor and
    the event loop its tries run on. ``start()`` before the Celery worker consumes,
    ``stop()`` after it stopped; ``run_try`` from Celery's pool threads."""

    def __init__(self, config: Config, *, concurrency: int, queues: tuple[str, ...]) -> None:
        self.settings = ExecutorSettings.from_config(config)
        self.settings = _with_parallelism(self.settings, concurrency)
        self.queues = queues
        self._config = config
        self._db = Database(config.core.sql_alchemy_conn)
        self._cipher = KwargsCipher.from_config(config.core.fernet_key, config.home)
        self.stats = ExecutorStats()
        self._job = JobService(
            self._db,
            job_type=tasks.EXECUTOR_JOB,
            part="Celery worker",
            heartbeat_s=self.settings.heartbeat_s,
        )
        self.job_id: int | None = None
        self.running: set[int] = set()
        self._try_ended: anyio.Event | None = None  # set as a try ends (while stopping)
        self._supervisor: TaskSupervisor | None = None
        #: the pre-imported process tries are forked from, as in the local executor
        self._warm = _warm_runner(self.settings)
        self._exits = contextlib.ExitStack()
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._background: Future[None] | None = None

    def __repr__(self) -> str:
        return (
            f"WorkerRuntime(job_id={self.job_id}, queues={list(self.queues)}, "
            f"running={sorted(self.running)}, stats={self.stats})"
        )

    def start(self) -> None:
        """Check the schema, open the event loop, register the executor job, start its
        heartbeat (``SchemaNotCurrentError``: the database needs ``sluice db migrate``)."""
        check_schema(self._db.engine)
        self._portal = self._exits.enter_context(anyio.from_thread.start_blocking_portal())
        self.job_id = self._portal.call(self._start_job)
        self._background = self._portal.start_task_soon(self._keep_alive, self.job_id)
        self._background.add_done_callback(_stop_when_heartbeat_ends)

    def stop(self) -> None:
        """Interrupt the tries still running (a cold shutdown does not wait for them: they
        go back to ``scheduled`` as the same try), end the executor job, close the loop."""
        try:
            if self._portal is not None and self.running:
                self._portal.call(self._interrupt_running)
            if self._background is not None:
                self._background.cancel()
                with contextlib.suppress(CancelledError):
                    self._background.result()
            if self._portal is not None and self.job_id is not None:
                self._portal.call(self._end_job)
        finally:
            self._exits.close()
            self._db.dispose()

    def run_try(self, ti_id: int, sender_job_id: int) -> str:
        """Run the try a message names, if the metadata DB says it still waits; returns
        what happened (``ran`` or ``dropped``). Called from a Celery pool thread."""
        assert self._portal is not None
        return self._portal.call(self._run_try, ti_id, sender_job_id)

    # --- on the event loop --------------------------------------------------------------

    async def _start_job(self) -> int:
        self._supervisor = TaskSupervisor(
            db=self._db,
            cipher=self._cipher,
            settings=self.settings,
            hostname=await anyio.to_thread.run_sync(hostname),
            stats=self.stats,
            warm=self._warm,
        )
        job_id = await self._job.start(self._register)
        logger.info(
            "Celery worker started job_id=%s queues=%s concurrency=%d",
            job_id,
            ",".join(self.queues),
            self.settings.parallelism,
            extra={"action": "celery_worker_started", "job_id": job_id, "queues": self.queues},
        )
        return job_id

    def _register(self, session: Session) -> int:
        job_id = jobs.start_job(
            session, job_type=tasks.EXECUTOR_JOB, capacity=self.settings.parallelism
        )
        celery_sql.set_worker_queues(session, job_id=job_id, queues=self.queues)
        return job_id

    async def _interrupt_running(self) -> None:
        """SIGTERM the running tries' processes (SIGKILL after ``kill_grace_s``) and wait for
        their supervisors to record them as interrupted, as the local executor's shutdown
        does: ending the job under them would make the scheduler fail them as lost while
        they still run."""
        assert self._supervisor is not None
        logger.warning(
            "Stopping %d running task(s): the worker stops without waiting for them; they "
            "will run again as the same try",
            len(self.running),
            extra={"action": "executor_interrupting", "ti_ids": sorted(self.running)},
        )
        self._supervisor.interrupt_all()
        with anyio.move_on_after(self.settings.kill_grace_s):
            await self._until_none_running()
        self._supervisor.kill_all()
        with anyio.move_on_after(FINAL_WRITE_TIMEOUT_S):
            await self._until_none_running()

    async def _until_none_running(self) -> None:
        while self.running:
            self._try_ended = anyio.Event()
            await self._try_ended.wait()

    async def _end_job(self) -> None:
        await self._job.end()
        logger.info("Celery worker stopped", extra={"action": "celery_worker_stopped"})

    async def _keep_alive(self, job_id: int) -> None:
        """The warm runner, the heartbeat and the operator-change watch, until ``stop``."""
        assert self._supervisor is not None
        async with anyio.create_task_group() as tg:
            if self._warm is not None:  # until it is ready, tries start cold interpreters
                tg.start_soon(self._warm.run)
            tg.start_soon(self._job.keep_alive)
            tg.start_soon(self._supervisor.stop_changed_forever, job_id)

    async def _run_try(self, ti_id: int, sender_job_id: int) -> str:
        assert self._supervisor is not None and self.job_id is not None
        take = partial(
            celery_sql.take_over_queued,
            ti_id=ti_id,
            sender_job_id=sender_job_id,
            worker_job_id=self.job_id,
        )
        if ti_id in self.running:  # another delivery of the try runs here now
            await self._log_dropped(ti_id, sender_job_id)
            return "dropped"
        self.running.add(ti_id)  # before the take-over: one delivery of a try at a time
        try:
            if not await run_retrying(self._db, take):
                await self._log_dropped(ti_id, sender_job_id)
                return "dropped"
            await self._supervisor.execute(self.job_id, ti_id)
        finally:
            self.running.discard(ti_id)
            if self._try_ended is not None:
                self._try_ended.set()
        return "ran"

    async def _log_dropped(self, ti_id: int, sender_job_id: int) -> None:
        threshold_s = self.settings.health_check_threshold_s
        held = await self._db.read(
            partial(celery_sql.held_try, ti_id=ti_id, now=models.utcnow(), threshold_s=threshold_s)
        )
        fields: dict[str, Any] = {"ti_id": ti_id, "sender_job_id": sender_job_id}
        if held is not None:
            fields.update(
                state=held.state,
                holder_job_id=held.executor_job_id,
                holder_alive=held.holder_alive,
                try_number=held.try_number,
            )
        logger.info(
            "Message for task instance %s means no work: it is no longer queued by sender job "
            "%s (now %s); dropped",
            ti_id,
            sender_job_id,
            "gone" if held is None else f"{held.state} under job {held.executor_job_id}",
            extra={"action": "celery_message_dropped", **fields},
        )


def _with_parallelism(settings: ExecutorSettings, parallelism: int) -> ExecutorSettings:
    from dataclasses import replace

    return replace(settings, parallelism=parallelism)


def _warm_runner(settings: ExecutorSettings) -> WarmRunner | None:
    """The local executor's warm runner, set up the same way (``LocalExecutor.run``)."""
    if not settings.warm_runner:
        return None
    folders = [f for f in (settings.dags_folder, settings.plugins_folder) if f is not None]
    environment = partial(child_environment, os.environ, settings.secrets)
    return WarmRunner(
        environment=environment,
        dag_folders=folders if settings.warm_runner_dag_imports else [],
    )


def worker_app(config: Config, runtime: WorkerRuntime) -> Celery:
    """The Celery app of a worker, with the one task that runs a Sluice try."""
    app = celery_app(config.celery)

    @app.task(name=RUN_TRY_TASK)
    def run_try(ti_id: int, sender_job_id: int) -> str:
        return runtime.run_try(int(ti_id), int(sender_job_id))

    return app


def run_worker(
    config: Config, *, queues: tuple[str, ...], concurrency: int, hostname: str, loglevel: str
) -> int:
    """Run a Celery worker consuming ``queues`` until it is stopped (SIGTERM: warm
    shutdown, running tries finish first); its exit code."""
    runtime = WorkerRuntime(config, concurrency=concurrency, queues=queues)
    app = worker_app(config, runtime)
    try:
        runtime.start()
        worker = app.Worker(
            pool_cls="threads",
            concurrency=concurrency,
            queues=list(queues),
            hostname=hostname,
            loglevel=loglevel,
            without_mingle=True,
            without_gossip=True,
            optimization="fair",
        )
        worker.start()
        return int(getattr(worker, "exitcode", 0) or 0)
    finally:
        runtime.stop()


def _stop_when_heartbeat_ends(done: Future[None]) -> None:
    """The heartbeat (with the warm runner and the change watch) ended before ``stop``: the
    worker would take tries the scheduler then fails as lost. Say why, and stop it (a warm
    shutdown: running tries finish)."""
    if done.cancelled():
        return
    error = done.exception()
    if error is None:
        return
    logger.critical(
        "The Celery worker's heartbeat ended: %s; stopping the worker",
        error,
        exc_info=error,
        extra={"action": "celery_worker_heartbeat_ended"},
    )
    os.kill(os.getpid(), signal.SIGTERM)
