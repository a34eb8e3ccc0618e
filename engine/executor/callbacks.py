"""Running callback requests: each in a child ``engine.execution.callback_runner`` process.

Theory of operation. The scheduler writes a ``dag`` request when it ends a run of a DAG
with callbacks, a ``deadline`` one when a run missed a deadline
(``engine.executor.deadline_callbacks``); the task supervisor writes a ``task`` request when
a task's own process could not run its outcome callback (killed, crashed); the scheduler
writes one when it fails a running try whose executor died (built here from the task
instance, with a first line for the try's log saying why it ended). Every executor runs a
``CallbackRunner`` beside its task slots: it claims requests no live executor holds
(``engine.db.queries.callbacks``), at most ``concurrency`` at a time, starts one child per
request, sends it a ``CallbackSpec``, appends what the child prints to the task's log (a
DAG callback's to ``dag_callbacks.log`` in the run's log folder), and deletes the request
when the child has exited. A child that runs past ``timeout_s`` is killed and its request
deleted too (a callback that hangs would otherwise run again forever). An executor that dies
leaves its claimed requests to the others: at least once. A request that cannot start its
child (out of processes or file descriptors) or fails unexpectedly stays claimed and is
tried again after ``retry_delay_s``; the executor's tasks keep running.

Like a task's process, the child reads connections and variables over a request channel
(``engine.execution.task_channel``) that a ``TaskRequestServer`` answers for its lifetime;
the secrets it hands over are masked in the log the child's output goes to.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import subprocess
import sys
from contextlib import suppress
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Final, Protocol

import anyio

from engine.authoring.callbacks import (
    DAG_FAILURE_REASON,
    DAG_SUCCESS_REASON,
    FAILURE_CALLBACK,
    RETRY_CALLBACK,
    SUCCESS_CALLBACK,
)
from engine.db.queries import callbacks as callbacks_sql
from engine.db.queries import deadlines as deadlines_sql
from engine.db.queries import tasks as tasks_sql
from engine.exceptions import DatabaseError
from engine.execution.protocol import DAG_KIND, TASK, CallbackSpec, TaskSpec
from engine.executor.deadline_callbacks import deadline_callback_spec
from engine.executor.outcomes import Decision, Outcome, outcome_line
from engine.executor.task_logs import TaskLogWriter, log_path, safe_component
from engine.executor.task_requests import TaskRequestServer
from engine.executor.task_specs import build_context, build_spec, with_results
from engine.retry import Backoff
from triggers.serde import dumps

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from anyio.abc import ByteReceiveStream, Process, TaskGroup
    from sqlalchemy.orm import Session

    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.db.queries.tasks import TaskRun

logger = logging.getLogger(__name__)

#: callbacks run at once by one executor (beside its ``parallelism`` task slots)
CALLBACK_CONCURRENCY: Final = 4
#: a callback process still running after this long is killed
CALLBACK_TIMEOUT_S: Final = 300.0
#: a request whose child could not start (or that failed unexpectedly) is tried again after
CALLBACK_RETRY_DELAY_S: Final = 5.0
DAG_CALLBACK_LOG: Final = "dag_callbacks.log"


class ExecutorSettings(Protocol):
    """What callbacks need of the executor's settings (``settings.ExecutorSettings``)."""

    @property
    def dags_folder(self) -> Path: ...
    @property
    def plugins_folder(self) -> Path | None: ...
    @property
    def default_deferrable(self) -> bool: ...
    @property
    def max_xcom_size_bytes(self) -> int | None: ...
    @property
    def task_log_folder(self) -> Path: ...
    @property
    def secrets(self) -> tuple[str, ...]: ...
    @property
    def poll_interval_s(self) -> float: ...
    @property
    def health_check_threshold_s(self) -> float: ...


def dag_callback_log(folder: Path, dag_id: str, run_id: str) -> Path:
    """The log of a run's DAG callbacks, beside its tasks' log folders."""
    return folder / safe_component(dag_id) / safe_component(run_id) / DAG_CALLBACK_LOG


def dag_callback_spec(
    request: callbacks_sql.Request, run: callbacks_sql.CallbackRun, settings: ExecutorSettings
) -> CallbackSpec:
    """The spec of a DAG callback: the context of the task that ended last, plus ``reason``."""
    task_id = str(request.data.get("task_id") or "")
    map_index = int(request.data.get("map_index", -1))
    context = build_context(
        dag_id=request.dag_id,
        run_id=request.run_id,
        task_id=task_id,
        try_number=int(request.data.get("try_number") or 1),
        events=run.events,
        default_deferrable=settings.default_deferrable,
        run=run.run,
        map_index=map_index,
    )
    task_spec = TaskSpec(
        ti_id=0,
        dag_id=request.dag_id,
        run_id=request.run_id,
        task_id=task_id,
        fileloc=run.fileloc,
        try_number=int(request.data.get("try_number") or 1),
        try_started_at=str(run.run.get("start_date") or run.run.get("queued_at") or ""),
        context=dumps(context, where="the DAG callback context"),
        dags_folder=str(settings.dags_folder),
        plugins_folder=None if settings.plugins_folder is None else str(settings.plugins_folder),
    )
    task_spec = with_results(task_spec, run.xcoms, max_bytes=None, mapped=run.mapped_xcoms)
    success = bool(request.data.get("success"))
    return CallbackSpec(
        kind=DAG_KIND,
        callback=SUCCESS_CALLBACK if success else FAILURE_CALLBACK,
        spec=task_spec.to_json(),
        reason=str(
            request.data.get("reason") or (DAG_SUCCESS_REASON if success else DAG_FAILURE_REASON)
        ),
    )


def lost_callback_spec(
    run: TaskRun, outcome: Outcome, settings: ExecutorSettings
) -> CallbackSpec | None:
    """The failure or retry callback of a try whose process reported no result (killed at
    its ``execution_timeout``, crashed), to run in a fresh process; None for other outcomes."""
    if outcome.decision is Decision.FAIL:
        callback = FAILURE_CALLBACK
    elif outcome.decision is Decision.RETRY:
        callback = RETRY_CALLBACK
    else:
        return None
    spec = build_spec(
        run,
        dags_folder=settings.dags_folder,
        plugins_folder=settings.plugins_folder,
        default_deferrable=settings.default_deferrable,
    )
    spec = with_results(
        spec, run.xcoms, max_bytes=settings.max_xcom_size_bytes, mapped=run.mapped_xcoms
    )
    reason = outcome.reason or "the task process ended without reporting an outcome"
    return CallbackSpec(
        kind=TASK,
        callback=callback,
        spec=spec.to_json(),
        error=reason,
        timed_out=reason.startswith("execution_timeout"),
        map_index=run.map_index,
    )


class CallbackRunner:
    """Claims callback requests for executor ``job_id`` and runs each in a child process."""

    def __init__(
        self,
        *,
        db: Database,
        cipher: KwargsCipher,
        settings: ExecutorSettings,
        environment: Mapping[str, str],
        concurrency: int = CALLBACK_CONCURRENCY,
        timeout_s: float = CALLBACK_TIMEOUT_S,
        retry_delay_s: float = CALLBACK_RETRY_DELAY_S,
    ) -> None:
        self._db = db
        self._cipher = cipher
        self.retry_delay_s = retry_delay_s
        self.settings = settings
        self._environment = dict(environment)
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self._running: set[int] = set()
        self._changed = anyio.Event()
        self._claim_backoff = Backoff(self.settings.poll_interval_s)
        self.ran = 0

    def __repr__(self) -> str:
        return f"<CallbackRunner running={sorted(self._running)} ran={self.ran}>"

    def nudge(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def run(self, job_id: int) -> None:
        """Claim and run requests until cancelled (a claimed request still running then is
        claimed again by a live executor once this one stops heartbeating)."""
        async with anyio.create_task_group() as tg:
            while True:
                changed = self._changed
                await self._claim_some(tg, job_id)
                with anyio.move_on_after(self.settings.poll_interval_s):
                    await changed.wait()

    async def _claim_some(self, tg: TaskGroup, job_id: int) -> None:
        free = self.concurrency - len(self._running)
        if free <= 0:
            return
        running = sorted(self._running)
        probe = partial(callbacks_sql.has_callback_requests, running=running)
        claim = partial(
            callbacks_sql.claim_callback_requests,
            job_id=job_id,
            limit=free,
            running=running,
            threshold_s=self.settings.health_check_threshold_s,
        )
        try:
            # A read first: polling an empty table takes no write lock (SQLite's only one).
            if not await self._db.read(probe):
                self._claim_backoff.succeeded()
                return
            requests = await self._db.run(claim)
        except DatabaseError as exc:  # the database is away: try again, backing off
            delay = self._claim_backoff.failed()
            logger.warning(
                "Claiming callback requests failed (%d in a row), retrying in %.2fs: %s",
                self._claim_backoff.failures,
                delay,
                exc,
                extra={"action": "claim_failed", "failures": self._claim_backoff.failures},
            )
            await anyio.sleep(delay)
            return
        self._claim_backoff.succeeded()
        for request in requests:
            self._running.add(request.id)
            tg.start_soon(self._run_request, request, name=f"callback request {request.id}")

    async def _run_request(self, request: callbacks_sql.Request) -> None:
        """Run one request and delete it. A database error leaves it claimed by this
        executor: it is claimed again at a later poll. So does a child that cannot start
        (``OSError``: out of processes, file descriptors) or any other failure of this one
        request, after ``retry_delay_s``: it never takes the executor down."""
        fields = {"request_id": request.id, "dag_id": request.dag_id}
        try:
            await self._run_and_delete(request)
        except DatabaseError as exc:
            logger.warning(
                "Callback request %s: the database failed (%s); it will run again",
                request.id,
                exc,
                extra={"action": "callback_retry", **fields},
            )
        except OSError as exc:
            logger.error(
                "Callback request %s: cannot start its process (%s); trying again in %gs",
                request.id,
                exc,
                self.retry_delay_s,
                extra={"action": "callback_spawn_failed", **fields},
            )
            await anyio.sleep(self.retry_delay_s)  # keeps the request (and its slot) a moment
        except Exception as exc:
            logger.exception(
                "Callback request %s failed unexpectedly (%s); trying again in %gs",
                request.id,
                exc,
                self.retry_delay_s,
                extra={"action": "callback_failed", **fields},
            )
            await anyio.sleep(self.retry_delay_s)
        finally:
            self._running.discard(request.id)
            self.nudge()

    async def _run_and_delete(self, request: callbacks_sql.Request) -> None:
        try:
            prepare = partial(self._prepare, request=request)
            spec, log_file, first_line = await self._db.run(prepare)
        except (KeyError, TypeError, ValueError) as exc:  # written by another version
            spec, log_file, first_line = None, None, ""
            logger.error(
                "Callback request %s cannot be read (%s); dropped",
                request.id,
                exc,
                extra={"action": "callback_dropped", "request_id": request.id},
            )
        if spec is not None and log_file is not None:
            await self._run_child(request, spec, log_file, first_line)
        elif log_file is not None:
            logger.warning(
                "Callback request %s: run %s of DAG %s is gone; dropped",
                request.id,
                request.run_id,
                request.dag_id,
                extra={"action": "callback_dropped", "dag_id": request.dag_id},
            )
        delete = partial(callbacks_sql.delete_callback_request, request_id=request.id)
        await self._db.run(delete)
        self.ran += 1

    def _prepare(
        self, session: Session, request: callbacks_sql.Request
    ) -> tuple[CallbackSpec | None, Path, str]:
        """The request's callback (None: its run or task is gone), the log it writes to, and
        a line to write there first."""
        folder = self.settings.task_log_folder
        if request.kind == DAG_KIND:
            log_file = dag_callback_log(folder, request.dag_id, request.run_id)
            run = callbacks_sql.load_callback_run(session, request.dag_id, request.run_id)
            spec = None if run is None else dag_callback_spec(request, run, self.settings)
            return spec, log_file, ""
        if request.kind == deadlines_sql.DEADLINE_KIND:  # engine.executor.deadline_callbacks
            log_file = dag_callback_log(folder, request.dag_id, request.run_id)
            build = partial(deadline_callback_spec, session, request)
            return build(dags_folder=self.settings.dags_folder, plugins_folder=None), log_file, ""
        if callbacks_sql.LOST_TRY in request.data:
            return self._prepare_lost_try(session, request)
        spec = CallbackSpec(**request.data["callback_spec"])
        task_spec = TaskSpec.from_json(spec.spec)
        path = log_path(
            folder,
            task_spec.dag_id,
            task_spec.run_id,
            task_spec.task_id,
            task_spec.try_number,
            map_index=spec.map_index,
        )
        return spec, path, ""

    def _prepare_lost_try(
        self, session: Session, request: callbacks_sql.Request
    ) -> tuple[CallbackSpec | None, Path, str]:
        """A running try whose executor died, which the scheduler failed
        (``engine.scheduler.orphans``): its failure or retry callback, and the line that says
        why the try ended for its log (its own executor never wrote one)."""
        data = request.data[callbacks_sql.LOST_TRY]
        try_number = int(data["try_number"])
        ended_at = datetime.fromisoformat(data["ended_at"])
        path = log_path(
            self.settings.task_log_folder,
            request.dag_id,
            request.run_id,
            str(data["task_id"]),
            try_number,
            map_index=int(data["map_index"]),
        )
        load = tasks_sql.load_task_run
        run = load(session, int(data["ti_id"]), try_number=try_number, now=ended_at)
        if run is None:
            return None, path, ""
        retry_at = data.get("retry_at")
        outcome = Outcome(
            Decision.FAIL if retry_at is None else Decision.RETRY,
            reason=str(data["reason"]),
            retry_at=None if retry_at is None else datetime.fromisoformat(retry_at),
            retry_wait_s=float(data.get("retry_wait_s") or 0.0),
        )
        spec = lost_callback_spec(run, outcome, self.settings)
        return spec, path, outcome_line(outcome, run, now=ended_at)

    async def _run_child(
        self, request: callbacks_sql.Request, spec: CallbackSpec, path: Path, first_line: str = ""
    ) -> None:
        log = TaskLogWriter(path, secrets=self.settings.secrets)
        try:
            if first_line:
                await log.write(first_line.encode())
            process, channel = await self._spawn(request)  # none: no header in the log
            task_spec = TaskSpec.from_json(spec.spec)
            server = TaskRequestServer(
                db=self._db,
                cipher=self._cipher,
                mask=log.add_secrets,
                log_fields={"request_id": request.id, "dag_id": request.dag_id},
                dag_fileloc=task_spec.fileloc,
                run=(task_spec.dag_id, task_spec.run_id),  # a lost try's events, read lazily
            )
            async with process, anyio.create_task_group() as tg:
                tg.start_soon(server.serve, channel)  # owns the channel: closes it when done
                try:
                    await log.write(
                        f"=== running {spec.callback} in a fresh process (callback request "
                        f"{request.id}) ===\n".encode()
                    )
                    assert process.stdin is not None
                    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                        await process.stdin.send(spec.to_json().encode() + b"\n")
                    await self._wait(process.pid, process.wait, process.stderr, log)
                finally:
                    if process.returncode is None:
                        with suppress(ProcessLookupError, PermissionError):
                            os.killpg(process.pid, signal.SIGKILL)
                    tg.cancel_scope.cancel()  # what the child left holding its channel
            code = process.returncode
            await log.write(f"=== {spec.callback} process exited with code {code} ===\n".encode())
        finally:
            log.close()

    async def _spawn(self, request: callbacks_sql.Request) -> tuple[Process, socket.socket]:
        """The child of ``request`` and the executor's end of its request channel;
        ``OSError`` when it cannot start."""
        ours, theirs = socket.socketpair()
        try:
            process = await anyio.open_process(
                [
                    sys.executable,
                    "-P",
                    "-m",
                    "engine.execution.callback_runner",
                    "--request-id",
                    str(request.id),
                    "--channel-fd",
                    str(theirs.fileno()),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env=self._environment,
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the child has its copy
        return process, ours

    async def _wait(
        self,
        pid: int,
        wait: object,
        stderr: ByteReceiveStream | None,
        log: TaskLogWriter,
    ) -> None:
        async def pump() -> None:
            if stderr is not None:
                async for chunk in stderr:
                    await log.write(chunk)

        limit = self.timeout_s if math.isfinite(self.timeout_s) else None
        with anyio.move_on_after(limit) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pump)
                await wait()  # type: ignore[operator]
        if scope.cancelled_caught:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            await log.write(
                f"=== killed after the {self.timeout_s:g}s callback timeout ===\n".encode()
            )
