"""Supervising one task step: spawn the child, feed it, log it, judge it, record it.

Used by ``engine.executor.local.LocalExecutor``, one ``TaskSupervisor.execute`` per claimed
task instance. The child (``engine.execution.task_runner``) gets its ``TaskSpec`` on stdin;
what it prints goes to the try's log (``engine.executor.task_logs``); its ``TaskResult`` (or,
when it died without one, its exit status) becomes an ``Outcome``
(``engine.executor.outcomes``) written in one transaction guarded by the executor's job id.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from contextlib import suppress
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

import anyio
from sqlalchemy.exc import DBAPIError, OperationalError

from engine.db import models
from engine.db.queries import actions, deferrals, tasks
from engine.db.queries import callbacks as callbacks_sql
from engine.exceptions import DatabaseError
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
from engine.executor.task_logs import TaskLogWriter, log_path
from engine.executor.task_requests import TaskRequestServer
from engine.executor.task_specs import build_spec, with_results
from engine.logs import secret_forms
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from pathlib import Path

    from anyio.abc import ByteReceiveStream, ByteSendStream
    from sqlalchemy.orm import Session

    from engine.config import Config
    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.db.queries.tasks import TaskRun
    from engine.execution.protocol import CallbackSpec
    from engine.executor.warm_process import WarmRunner

logger = logging.getLogger(__name__)

T = TypeVar("T")

DRAIN_AFTER_EXIT_S: Final = 5.0  # reading what is left in the pipes once the child exited
RESULT_MAX_BYTES: Final = 64 * 1024 * 1024
DB_RETRY_BACKOFF_S: Final = (0.2, 5.0)
SPAWN_RETRY_DELAY_S: Final = 1.0


@dataclass
class ExecutorStats:
    claimed: int = 0
    discarded: int = 0  # outcomes of task instances taken over meanwhile
    outcomes: Counter[str] = field(default_factory=Counter)  # Decision -> count


class StepProcess(Protocol):
    """A task process as the supervisor sees it: started cold (``anyio.abc.Process``) or
    forked by the warm runner (``engine.executor.warm_process.ForkedProcess``)."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def stdin(self) -> ByteSendStream | None: ...
    @property
    def stdout(self) -> ByteReceiveStream | None: ...
    @property
    def stderr(self) -> ByteReceiveStream | None: ...
    async def wait(self) -> int | None: ...
    async def aclose(self) -> None: ...


class TaskProcess:
    """One task process and why the executor stopped it, if it did."""

    def __init__(
        self, ti_id: int, process: StepProcess, channel: socket.socket | None = None
    ) -> None:
        self.ti_id = ti_id
        self.process = process
        #: the executor's end of the task's request channel (``engine.execution.task_channel``)
        self.channel = channel
        self.interrupted = False  # stopped by the shutdown
        self.killed_for_timeout = False
        #: marked running for this executor (before that, ``queued`` is no external change)
        self.started = False
        #: the state an operator action gave its task instance while it ran (clear, set-state,
        #: cancel, dagrun_timeout): the process is stopped and its outcome not recorded
        self.external_state: str | None = None
        self.externally_changed = anyio.Event()
        self.reported = False  # it wrote a result (and so ran its outcome's callbacks)

    def __repr__(self) -> str:
        return f"<TaskProcess ti={self.ti_id} pid={self.process.pid} rc={self.process.returncode}>"

    def signal_group(self, signum: int) -> None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def interrupt(self) -> None:
        self.interrupted = True
        self.signal_group(signal.SIGTERM)

    def changed_externally(self, state: str) -> None:
        """Its task instance left ``running`` under this executor: stop it (``_wait``)."""
        if self.external_state is None:
            self.external_state = state
            self.externally_changed.set()


def _is_transient(exc: DatabaseError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, OperationalError) or (
        isinstance(cause, DBAPIError) and cause.connection_invalidated
    )


async def _drain(stream: ByteReceiveStream | None, sink: bytearray, limit: int) -> None:
    if stream is None:
        return
    async for chunk in stream:
        if len(sink) < limit:
            sink.extend(chunk[: limit - len(sink)])


#: Engine settings a task's process must not inherit (it needs neither: it gets its spec on
#: stdin and never touches the metadata database).
SECRET_ENVIRONMENT: Final = ("SLUICE__CORE__FERNET_KEY", "SLUICE__CORE__SQL_ALCHEMY_CONN")


async def _start_cold(ti_id: int, env: dict[str, str], channel_fd: int) -> StepProcess:
    """The task process as a fresh interpreter: ``python -P -m engine.execution.task_runner``."""
    command = [sys.executable, "-P", "-m", "engine.execution.task_runner"]
    command += ["--ti-id", str(ti_id), "--channel-fd", str(channel_fd)]
    return await anyio.open_process(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
        pass_fds=(channel_fd,),
    )


def task_environment(environ: Mapping[str, str], secrets: Iterable[str]) -> dict[str, str]:
    """``environ`` without the engine's secrets: the Fernet key and database URL settings,
    and any other ``SLUICE__`` setting whose value holds a configured secret."""
    forms = secret_forms(secrets)
    return {
        name: value
        for name, value in environ.items()
        if name not in SECRET_ENVIRONMENT
        and not (name.startswith("SLUICE__") and any(form in value for form in forms))
    }


async def _pump(stream: ByteReceiveStream | None, log: TaskLogWriter) -> None:
    if stream is None:
        return
    async for chunk in stream:
        await log.write(chunk)


async def run_retrying(db: Database, fn: Callable[[Session], T]) -> T:
    """``fn`` in one transaction, retried while the database is unavailable."""
    delay = DB_RETRY_BACKOFF_S[0]
    while True:
        try:
            return await db.run(fn)
        except DatabaseError as exc:
            if not _is_transient(exc):
                raise
            logger.warning(
                "Metadata database unavailable, retrying a task state write in %.1fs: %s",
                delay,
                exc,
                extra={"action": "task_write_retry"},
            )
            await anyio.sleep(delay)
            delay = min(delay * 2, DB_RETRY_BACKOFF_S[1])


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
        on_outcome: Callable[[Decision], None] | None = None,
        warm: WarmRunner | None = None,
    ) -> None:
        self._db = db
        #: forks task processes from a pre-imported process; without one (or while it is
        #: down) each step starts a cold interpreter
        self._warm = warm
        self._on_outcome = on_outcome
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

    async def execute(self, job_id: int, ti_id: int) -> None:
        """Run the next step of task instance ``ti_id`` (claimed by ``job_id``) and record
        its outcome; the child is killed whatever happens to this coroutine."""
        try:
            await self._execute(job_id, ti_id)
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
            env = task_environment(os.environ, self.settings.secrets)
            process: StepProcess | None = None
            if self._warm is not None:
                process = await self._warm.spawn(ti_id=ti_id, env=env, channel_fd=theirs.fileno())
            if process is None:
                process = await _start_cold(ti_id, env, theirs.fileno())
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

    async def _execute(self, job_id: int, ti_id: int) -> None:
        child = await self._spawn(job_id, ti_id)
        if child is None:
            return
        process = child.process
        self.processes[ti_id] = child
        if self.interrupting:
            child.interrupt()  # spawned as the shutdown began: the step reruns later
        try:
            try:
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
        finally:
            await process.aclose()
        lost = None
        if not child.reported and child.external_state is None:  # killed or crashed
            lost = lost_callback_spec(run, outcome, self.settings)
        await self._record(job_id, run, outcome, lost, external_state=child.external_state)

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

        async def drain_all() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_pump, process.stderr, log)
                tg.start_soon(_drain, process.stdout, out, RESULT_MAX_BYTES)
            drained.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain_all)
            if child.channel is not None:
                server = TaskRequestServer(
                    db=self._db,
                    cipher=self._cipher,
                    mask=log.add_secrets,
                    log_fields=run.log_fields(),
                    dag_fileloc=run.fileloc,
                )
                channel, child.channel = child.channel, None  # the server owns it now
                tg.start_soon(server.serve, channel)
            await self._wait(child, kill_after_s(run, now=now, grace_s=settings.kill_grace_s), log)
            child.signal_group(signal.SIGKILL)  # what the task left running in its group
            with anyio.move_on_after(DRAIN_AFTER_EXIT_S):
                await drained.wait()
            tg.cancel_scope.cancel()
        result, problem = read_result(bytes(out))
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
        if outcome.decision is Decision.SUCCEED and result is not None and result.xcoms:
            outcome = replace(outcome, xcoms=dict(result.xcoms))  # pushed ones too
        return outcome

    async def _wait(self, child: TaskProcess, kill_after: float | None, log: TaskLogWriter) -> None:
        """Until the child exits: killed at its execution deadline, or stopped once an
        operator action changed its task instance (``_stop_when_changed``)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._stop_when_changed, child, log)
            with anyio.move_on_after(math.inf if kill_after is None else kill_after) as scope:
                await child.process.wait()
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

    # --- recording the outcome ----------------------------------------------------------

    async def _record(
        self,
        job_id: int,
        run: TaskRun,
        outcome: Outcome,
        callback: CallbackSpec | None = None,
        *,
        external_state: str | None = None,
    ) -> None:
        write = partial(
            self._write_outcome, job_id=job_id, run=run, outcome=outcome, callback=callback
        )
        ok = await run_retrying(self._db, write)
        if not ok:
            await self._not_recorded(job_id, run, outcome, external_state)
            return
        self.stats.outcomes[outcome.decision] += 1
        if self._on_outcome is not None:
            # e.g. the triggerer claims a new deferral's trigger at once
            self._on_outcome(outcome.decision)
        level = logging.INFO if outcome.decision is not Decision.FAIL else logging.WARNING
        logger.log(
            level,
            "Task %s.%s (run %s, try %d): %s",
            run.dag_id,
            run.task_id,
            run.run_id,
            run.try_number,
            outcome.describe(),
            extra={"action": f"task_{outcome.decision}", **run.log_fields()},
        )

    async def _not_recorded(
        self, job_id: int, run: TaskRun, outcome: Outcome, external_state: str | None
    ) -> None:
        """The outcome matched no row: an operator action changed the task instance (a
        cleared one is ``restarting``: now that its process is gone it is ``none`` again), or
        another executor took it over."""
        release = partial(actions.release_restarted_task, ti_id=run.ti_id, job_id=job_id)
        restarted = await run_retrying(self._db, release)
        if restarted or external_state is not None:
            state = TaskState.RESTARTING if restarted else external_state
            logger.info(
                "Task %s.%s (run %s, try %d): state externally set to %s; its process was "
                "stopped and its outcome (%s) not recorded%s",
                run.dag_id,
                run.task_id,
                run.run_id,
                run.try_number,
                state,
                outcome.decision,
                "; it will run again" if restarted else "",
                extra={"action": "task_externally_changed", "state": state, **run.log_fields()},
            )
            return
        self.stats.discarded += 1
        logger.warning(
            "Task instance %s was taken over while it ran here; outcome %s discarded",
            run.ti_id,
            outcome.decision,
            extra={"action": "task_outcome_discarded", **run.log_fields()},
        )

    def _write_outcome(
        self,
        session: Session,
        job_id: int,
        run: TaskRun,
        outcome: Outcome,
        callback: CallbackSpec | None = None,
    ) -> bool:
        """Record the outcome and, in the same transaction, the request to run the outcome's
        callback in a fresh process when the task's own could not (``callback``)."""
        ok = self._write_state(session, job_id, run, outcome)
        if ok and callback is not None:
            callbacks_sql.request_task_callback(
                session,
                dag_id=run.dag_id,
                run_id=run.run_id,
                data={"callback_spec": asdict(callback)},
                now=models.utcnow(),
            )
        return ok

    def _write_state(self, session: Session, job_id: int, run: TaskRun, outcome: Outcome) -> bool:
        now = models.utcnow()
        finish = partial(tasks.finish_task, session, run.ti_id, job_id=job_id, now=now)
        elapsed_s = outcome.elapsed_s
        if outcome.decision is Decision.SUCCEED:
            return tasks.succeed_task(
                session,
                run,
                job_id=job_id,
                elapsed_s=elapsed_s,
                now=now,
                xcoms=outcome.xcoms,
                outlet_events=list(outcome.outlet_events),
                keep_while_paused=self.settings.keep_events_while_paused,
                skip_task_ids=outcome.skip_task_ids,
            )
        if outcome.decision is Decision.SKIP:
            return finish(state=TaskState.SKIPPED, elapsed_s=elapsed_s)
        if outcome.decision is Decision.FAIL:
            return finish(state=TaskState.FAILED, elapsed_s=elapsed_s)
        if outcome.decision is Decision.RETRY:
            assert outcome.retry_at is not None
            return tasks.retry_task(
                session,
                run.ti_id,
                job_id=job_id,
                elapsed_s=elapsed_s,
                now=now,
                retry_at=outcome.retry_at,
            )
        if outcome.decision is Decision.DEFER:
            assert outcome.deferral is not None
            trigger_id = deferrals.defer_task(
                session,
                self._cipher,
                run.ti_id,
                job_id=job_id,
                deferral=outcome.deferral,
                trigger_timeout=outcome.trigger_timeout,
                elapsed_s=elapsed_s,
            )
            return trigger_id is not None
        return tasks.requeue_task(session, run.ti_id, job_id=job_id)


@dataclass(frozen=True, slots=True)
class ExecutorSettings:
    parallelism: int
    dags_folder: Path
    plugins_folder: Path | None
    task_log_folder: Path
    default_deferrable: bool = False
    heartbeat_s: float = 5.0
    health_check_threshold_s: float = 10.5
    poll_interval_s: float = 0.05
    shutdown_grace_s: float = 30.0
    #: SIGTERM -> SIGKILL at shutdown, and how long past its execution deadline a task that
    #: ignores its timeout keeps running before it is killed
    kill_grace_s: float = 3.0
    #: configured secrets: kept out of the tasks' environment and replaced in their logs
    secrets: tuple[str, ...] = ()
    #: ``[scheduler] keep_events_while_paused``, for the events of tasks' outlets
    keep_events_while_paused: bool = True
    #: ``[core] max_xcom_size_bytes``: the largest result a task may store
    max_xcom_size_bytes: int | None = 1_048_576
    #: fork task steps from a pre-imported warm runner (``engine.executor.warm_runner``)
    #: rather than start a fresh interpreter for each; a cold start stays the fallback
    warm_runner: bool = True
    #: and import ahead the installed packages the DAG files import. Off by default: a
    #: package seeded at import (numpy's global random state, say) would give every forked
    #: step the same state, where fresh interpreters each get their own
    warm_runner_dag_imports: bool = False

    @classmethod
    def from_config(cls, config: Config) -> ExecutorSettings:
        return cls(
            parallelism=config.core.parallelism,
            dags_folder=config.core.dags_folder,
            plugins_folder=config.core.plugins_folder,
            task_log_folder=config.logging.task_log_folder,
            default_deferrable=config.operators.default_deferrable,
            heartbeat_s=config.scheduler.scheduler_heartbeat_sec,
            health_check_threshold_s=config.scheduler.health_check_threshold_s,
            poll_interval_s=config.scheduler.loop_interval_sec,
            shutdown_grace_s=config.triggerer.shutdown_grace_period_sec,
            secrets=tuple(config.secret_values()),
            keep_events_while_paused=config.scheduler.keep_events_while_paused,
            max_xcom_size_bytes=config.core.max_xcom_size_bytes,
            warm_runner=config.executor.warm_runner,
            warm_runner_dag_imports=config.executor.warm_runner_dag_imports,
        )
