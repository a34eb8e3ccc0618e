"""The executor's side of the warm runner (``engine.executor.warm_runner``): keep one running,
ask it for task processes, replace it when it dies.

``WarmRunner.run`` is a service of the executor's task group: it starts the warm runner,
waits for its ``ready``, and starts a new one (after a backoff) whenever it exits while the
executor is not stopping. While one is ready, it keeps one *standby* task process forked
ahead (``_keep_standby``): the forks (warm runner, forker, standby) and the standby's
reparenting happen between steps, not in them. ``WarmRunner.spawn`` takes the standby (or
waits for the one being forked) and sends it the step: a ``ForkedProcess`` (the task
process: its pid, its standard streams, its exit status) in one message. It returns None
when no warm runner is ready or no standby could be had, and the caller starts the step in
a cold interpreter instead (a step waits at most ``READY_WAIT_S`` for a warm runner that is
starting, never for one to come back). A standby belongs to the warm runner that forked it:
when that one exits, its standby is discarded too.

``ForkedProcess`` offers what ``TaskSupervisor`` uses of an ``anyio`` process. The task
process is this process's child (reparented to it while ``SUBREAPER`` is on), so it is
waited for through a pidfd and reaped with ``waitpid``, as asyncio does for a cold one; the
warm runner dying does not affect the steps it forked. A standby whose pid was not read in
time is still read (and reaped) later: the status pipe is read until it gives the pid or
closes, and a warm runner that does not fork within ``FORK_TIMEOUT_S`` is killed (and
replaced).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from contextlib import suppress
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel

from engine.executor.forked_process import SUBREAPER, PipeReceiveStream, Standby
from engine.executor.warm_runner import READY
from engine.retry import Backoff

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path

    from anyio.abc import Process, TaskStatus

    from engine.executor.forked_process import ForkedProcess

logger = logging.getLogger(__name__)

START_TIMEOUT_S: Final = 60.0  # imports on a loaded machine
FORK_TIMEOUT_S: Final = 10.0  # standby requested -> its pid known
READY_WAIT_S: Final = 5.0  # how long a step waits for a warm runner that is starting
RESTART_BACKOFF_S: Final = 0.5
FORK_RETRY_BACKOFF_S: Final = 0.25  # a standby that could not be forked, doubling


def _cwd() -> str | None:
    """The executor's working directory for the task (None if it was removed: the task
    process keeps the warm runner's, as a cold child would inherit the removed one)."""
    try:
        return os.getcwd()
    except OSError:
        return None


async def _read_pid(status: PipeReceiveStream) -> tuple[int, int] | None:
    """The task process's pid and parent pid, which it writes once reparented; None when
    the status pipe closed first (the request was not served)."""
    text = bytearray()
    while b"\n" not in text:
        try:
            text += await status.receive()
        except anyio.EndOfStream:
            return None
    words = bytes(text).partition(b"\n")[0].split()
    if len(words) != 4 or words[0] != b"pid" or words[2] != b"ppid":
        return None
    return int(words[1]), int(words[3])


class WarmRunner:
    """Starts and restarts the executor's warm runner; forks task processes from it."""

    def __init__(
        self,
        *,
        environment: Callable[[], Mapping[str, str]],
        dag_folders: Sequence[Path] = (),
    ) -> None:
        #: the warm runner's own environment (the tasks' one, without the engine's secrets)
        self._environment = environment
        #: the installed packages the DAG files there import are imported ahead too
        self._dag_folders = tuple(dag_folders)
        #: DAG imports a warm runner refused (they start a thread or open a file)
        self.skipped: list[str] = []
        self._subreaper_failed = False
        #: set while a standby could not be forked (out of descriptors): steps start cold
        self._fork_failing = False
        #: the task process forked ahead for the next step, and a wake-up for its changes
        self._standby: Standby | None = None
        self._changed = anyio.Event()
        self._control: socket.socket | None = None
        self._process: Process | None = None
        self._stopping = False
        #: set when the current start attempt is over (ready, or failed): a step waits for
        #: a warm runner that is starting, which costs no more than a cold start would
        self._settled = anyio.Event()
        self._settled.set()
        self.starts = 0  # warm runners started (a restart counts)
        self.forks = 0  # task processes forked
        self.fallbacks = 0  # steps started cold because no warm runner could fork them

    def __repr__(self) -> str:
        pid = None if self._process is None else self._process.pid
        return (
            f"<WarmRunner pid={pid} ready={self.ready} starts={self.starts} forks={self.forks} "
            f"fallbacks={self.fallbacks}>"
        )

    @property
    def ready(self) -> bool:
        return self._control is not None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep a warm runner until cancelled; readiness is signalled at once (the first
        steps wait for the first warm runner's start, steps start cold while it is down)."""
        if not SUBREAPER.available:
            logger.info(
                "No warm task runner: this system cannot make its task processes the "
                "executor's children (PR_SET_CHILD_SUBREAPER); each step starts cold",
                extra={"action": "warm_runner_unavailable"},
            )
            task_status.started()
            return
        self._settled = anyio.Event()  # the first steps wait for the first start
        task_status.started()
        backoff = Backoff(RESTART_BACKOFF_S)
        try:
            while True:
                if await self._run_one():
                    backoff.succeeded()
                await anyio.sleep(backoff.failed())
        finally:
            self._stopping = True
            self._settled.set()

    async def _run_one(self) -> bool:
        """Start one warm runner and wait for it to exit; True if it became ready."""
        if self._settled.is_set():
            self._settled = anyio.Event()
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:  # out of file descriptors: back off and try again
            self._settled.set()
            logger.warning("Cannot start the warm task runner: %s", exc)
            return False
        try:
            command = [sys.executable, "-P", "-m", "engine.executor.warm_runner"]
            command += ["--control-fd", str(theirs.fileno())]
            for folder in self._dag_folders:
                command += ["--dag-folder", str(folder)]
            for name in self.skipped:
                command += ["--skip", name]
            process = await anyio.open_process(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None,  # its own errors go to the executor's stderr
                start_new_session=True,  # no terminal signals; tasks get their own sessions
                env=dict(self._environment()),
                pass_fds=(theirs.fileno(),),
            )
        except OSError as exc:
            self._settled.set()
            ours.close()
            logger.warning("Cannot start the warm task runner: %s", exc)
            return False
        finally:
            theirs.close()
        self.starts += 1
        ready = False
        async with process:
            try:
                self._process = process
                ready = await self._until_ready(ours)
                if ready:
                    self._control = ours
                self._settled.set()
                async with anyio.create_task_group() as tg:
                    if ready:
                        tg.start_soon(self._keep_standby, ours, process)
                    await process.wait()
                    tg.cancel_scope.cancel()
            finally:
                self._settled.set()
                self._control = None
                self._notify()
                anyio.notify_closing(ours)
                ours.close()
                if process.returncode is None:
                    process.kill()
                    with anyio.CancelScope(shield=True):
                        await process.wait()
        if not self._stopping:
            logger.warning(
                "The warm task runner (pid %s) exited with code %s; steps start cold until a "
                "new one is ready",
                process.pid,
                process.returncode,
                extra={"action": "warm_runner_exited", "returncode": process.returncode},
            )
        return ready

    async def _until_ready(self, control: socket.socket) -> bool:
        control.setblocking(False)
        with anyio.move_on_after(START_TIMEOUT_S):
            while True:
                try:
                    answer = control.recv(4096)
                except BlockingIOError:
                    await anyio.wait_readable(control)
                    continue
                if answer == READY:
                    logger.info(
                        "Warm task runner ready (pid %s)",
                        self.pid,
                        extra={"action": "warm_runner_ready"},
                    )
                    return True
                self._refused(answer)
                return False
        logger.warning("The warm task runner did not get ready in %gs", START_TIMEOUT_S)
        return False

    def _refused(self, answer: bytes) -> None:
        try:
            refusal = json.loads(answer)
            why, skip = str(refusal["refused"]), refusal.get("skip")
        except (ValueError, TypeError, KeyError):
            why, skip = answer.decode(errors="replace") or "it exited", None
        if isinstance(skip, str) and skip not in self.skipped:
            self.skipped.append(skip)  # the next one imports the rest
        logger.warning(
            "The warm task runner cannot serve: %s; steps start cold%s",
            why,
            f" until a new one, without {skip}, is ready" if skip else "",
            extra={"action": "warm_runner_refused", "skip": skip},
        )

    def _notify(self) -> None:
        """Wake whoever waits for a change of the standby or of the warm runner."""
        self._changed.set()
        self._changed = anyio.Event()

    async def _keep_standby(self, control: socket.socket, process: Process) -> None:
        """While this warm runner serves: one standby forked ahead, a new one as soon as a
        step took it; discarded when the warm runner exits. A warm runner that cannot fork
        one is killed (``run`` replaces it)."""
        backoff = Backoff(FORK_RETRY_BACKOFF_S)
        try:
            while True:
                try:
                    standby = await self._fork_standby(control, process)
                except OSError as exc:  # no descriptor for its socket or pipe, say
                    await self._fork_failed(exc, backoff)
                    continue
                backoff.succeeded()
                if standby is None:
                    if process.returncode is None and not self._subreaper_failed:
                        with suppress(ProcessLookupError):
                            process.kill()
                    return
                self._standby = standby
                self._notify()
                while self._standby is not None:
                    await self._changed.wait()
        finally:
            standby, self._standby = self._standby, None
            self._notify()
            if standby is not None:
                await standby.discard()

    async def _fork_failed(self, exc: OSError, backoff: Backoff) -> None:
        """No standby could be forked: steps start cold (which may fail the same way; the
        supervisor then requeues them) until a retry after a backoff forks one."""
        delay = backoff.failed()
        logger.warning(
            "Cannot fork a standby task process: %s; steps start cold, retrying in %.2fs",
            exc,
            delay,
            extra={"action": "warm_standby_failed", "failures": backoff.failures},
        )
        self._fork_failing = True
        self._notify()  # a step waiting for the standby starts cold now
        try:
            await anyio.sleep(delay)
        finally:
            self._fork_failing = False

    async def _fork_standby(self, control: socket.socket, process: Process) -> Standby | None:
        """Ask the warm runner for a standby; it is ours once reparented to us (None if
        the warm runner did not fork one)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            status_r, status_w = os.pipe()
        except OSError:
            ours.close()
            theirs.close()
            raise
        status = PipeReceiveStream(status_r)
        started = None
        try:
            with SUBREAPER:  # until the standby is reparented to us
                try:
                    sent = await self._send(control, b"standby", [theirs.fileno(), status_w])
                finally:
                    theirs.close()  # the warm runner has its copies
                    os.close(status_w)
                if sent:
                    started = await self._standby_pid(status, process)
        finally:
            status.close()
            if started is None:
                ours.close()
        if started is None:
            return None
        standby = Standby(started[0], ours)
        if started[1] != os.getpid():
            logger.error(
                "A task process forked by the warm task runner is not this executor's "
                "child (parent %s); the warm runner is not used any more",
                started[1],
                extra={"action": "warm_runner_disabled"},
            )
            self._subreaper_failed = True
            await standby.discard()  # it exits; its parent reaps it
            return None
        return standby

    async def _standby_pid(
        self, status: PipeReceiveStream, process: Process
    ) -> tuple[int, int] | None:
        """The standby's pid and parent pid. The status pipe is read until it gives them or
        closes (no forked process holds it any more), even when cancelled: a standby left
        unread would be a child never reaped. A warm runner that takes longer than
        ``FORK_TIMEOUT_S`` is killed, after which the pipe closes or the pid comes soon."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(FORK_TIMEOUT_S):
                return await _read_pid(status)
            logger.warning(
                "The warm task runner (pid %s) did not fork in %gs; it is replaced",
                process.pid,
                FORK_TIMEOUT_S,
                extra={"action": "warm_fork_timeout"},
            )
            if process.returncode is None:
                with suppress(ProcessLookupError):
                    process.kill()
            with anyio.move_on_after(FORK_TIMEOUT_S):
                return await _read_pid(status)
        return None

    async def _take_standby(self) -> Standby | None:
        """The standby, or the one being forked (at most ``FORK_TIMEOUT_S``); None when no
        warm runner is serving."""
        with anyio.move_on_after(FORK_TIMEOUT_S):
            while True:
                changed = self._changed
                standby = self._standby
                if standby is not None:
                    self._standby = None
                    self._notify()  # the next one is forked now
                    return standby
                if self._control is None or self._subreaper_failed or self._fork_failing:
                    return None
                await changed.wait()
        return None

    async def spawn(
        self, *, ti_id: int, env: Mapping[str, str], channel_fd: int
    ) -> ForkedProcess | None:
        """Start the task process of one step in a standby; None when the caller must start
        it cold."""
        with anyio.move_on_after(READY_WAIT_S):
            await self._settled.wait()  # a warm runner starting now is as quick as a cold start
        standby = await self._take_standby()
        if standby is None:
            self.fallbacks += 1
            return None
        request = {"ti_id": ti_id, "env": dict(env), "cwd": _cwd()}
        try:
            process = standby.start(request, channel_fd)
        except OSError:  # no pipe could be made: the supervisor requeues the step
            await standby.discard()
            raise
        if process is None:
            await standby.discard()
            self.fallbacks += 1
            logger.warning(
                "The standby task process (pid %s) is gone; task instance %s starts cold",
                standby.pid,
                ti_id,
                extra={"action": "warm_fork_failed", "ti_id": ti_id},
            )
            return None
        self.forks += 1
        return process

    async def _send(self, control: socket.socket, message: bytes, fds: list[int]) -> bool:
        while True:
            try:
                socket.send_fds(control, [message], fds)
                return True
            except BlockingIOError:
                try:
                    await anyio.wait_writable(control)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    logger.warning("The warm task runner exited while a step was being sent")
                    return False
            except OSError as exc:  # it died meanwhile (run() starts a new one), or too big
                logger.warning("Cannot send a step to the warm task runner: %s", exc)
                return False
