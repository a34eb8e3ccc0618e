"""The executor's side of the warm runner (``engine.executor.warm_runner``): keep one running,
ask it for task processes, replace it when it dies.

``WarmRunner.run`` is a service of the executor's task group: it starts the warm runner,
waits for its ``ready``, and starts a new one (after a backoff) whenever it exits while the
executor is not stopping. ``WarmRunner.spawn`` hands it the pipes of one step and returns a
``ForkedProcess`` (the task process: its pid, its standard streams, its exit status); it
returns None when no warm runner is ready or the request failed, and the caller starts the
step in a cold interpreter instead (a step waits at most ``READY_WAIT_S`` for a warm runner
that is starting, never for one to come back).

``ForkedProcess`` offers what ``TaskSupervisor`` uses of an ``anyio`` process. The task
process is this process's child (reparented to it while ``Subreaper`` is on), so it is
waited for through a pidfd and reaped with ``waitpid``, as asyncio does for a cold one; the
warm runner dying does not affect the steps it forked.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel

from engine.executor.forked_process import ForkedProcess, PipeReceiveStream, Subreaper
from engine.executor.warm_runner import READY
from engine.retry import Backoff

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path

    from anyio.abc import Process, TaskStatus

logger = logging.getLogger(__name__)

START_TIMEOUT_S: Final = 60.0  # imports on a loaded machine
FORK_TIMEOUT_S: Final = 10.0  # request sent -> task pid known
READY_WAIT_S: Final = 5.0  # how long a step waits for a warm runner that is starting
RESTART_BACKOFF_S: Final = 0.5


def _pipe(fds: set[int]) -> tuple[int, int]:
    read, write = os.pipe()
    fds.update((read, write))
    return read, write


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
        self._subreaper = Subreaper()
        self._subreaper_failed = False
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
        if not self._subreaper.available:
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
                await process.wait()
            finally:
                self._settled.set()
                self._control = None
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

    async def spawn(
        self, *, ti_id: int, env: Mapping[str, str], channel_fd: int
    ) -> ForkedProcess | None:
        """Fork the task process of one step; None when the caller must start it cold."""
        with anyio.move_on_after(READY_WAIT_S):
            await self._settled.wait()  # a warm runner starting now is as quick as a cold start
        control = self._control
        if control is None or self._subreaper_failed:
            self.fallbacks += 1
            return None
        fds: set[int] = set()  # ours to close unless the task process starts
        started = None
        status_r = -1  # a pipe that cannot be made (no descriptors left) raises OSError
        try:
            stdin_r, stdin_w = _pipe(fds)
            out_r, out_w = _pipe(fds)
            err_r, err_w = _pipe(fds)
            status_r, status_w = _pipe(fds)
            message = json.dumps({"ti_id": ti_id, "env": dict(env), "cwd": _cwd()}).encode()
            theirs = [stdin_r, out_w, err_w, channel_fd, status_w]
            with self._subreaper:  # until the task process is reparented to us
                sent = await self._send(control, message, theirs)
                for fd in (stdin_r, out_w, err_w, status_w):  # the task process has its copies
                    fds.discard(fd)
                    os.close(fd)
                if sent:
                    with anyio.move_on_after(FORK_TIMEOUT_S):
                        started = await _read_pid(PipeReceiveStream(status_r))
        finally:
            if started is not None and started[1] != os.getpid():
                logger.error(
                    "A task process forked by the warm task runner is not this executor's "
                    "child (parent %s); the warm runner is not used any more",
                    started[1],
                    extra={"action": "warm_runner_disabled"},
                )
                self._subreaper_failed = True
                started = None  # its stdin closes below: it exits without running anything
            if status_r >= 0:
                fds.discard(status_r)
                os.close(status_r)
            if started is None:
                for fd in fds:
                    os.close(fd)
        if started is None:
            self.fallbacks += 1
            logger.warning(
                "The warm task runner did not fork task instance %s; it starts cold",
                ti_id,
                extra={"action": "warm_fork_failed", "ti_id": ti_id},
            )
            return None
        self.forks += 1
        return ForkedProcess(started[0], stdin_w, out_r, err_r)

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
