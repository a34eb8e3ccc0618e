"""The executor's side of the warm runner (``engine.executor.warm_runner``): keep one running,
ask it for task processes, replace it when it dies.

``WarmRunner.run`` is a service of the executor's task group: it starts the warm runner,
waits for its ``ready``, and starts a new one (after a backoff) whenever it exits while the
executor is not stopping. ``WarmRunner.spawn`` hands it the pipes of one step and returns a
``ForkedProcess`` (the task process: its pid, its standard streams, its exit status); it
returns None when no warm runner is ready or the request failed, and the caller starts the
step in a cold interpreter instead, so a step never waits for a warm runner to come back.

``ForkedProcess`` offers what ``TaskSupervisor`` uses of an ``anyio`` process. Its exit
status comes from the warm runner over the step's status pipe; if the warm runner died
meanwhile the task process is waited for through a pidfd and its exit status is unknown
(None: a result the task reported still decides the outcome).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from contextlib import suppress
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel
from anyio.abc import ByteReceiveStream, ByteSendStream

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
READ_CHUNK_BYTES: Final = 65536
PID_POLL_S: Final = 0.01


class PipeReceiveStream(ByteReceiveStream):
    """The reading end of a pipe, non-blocking, read when the event loop says so."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd

    async def receive(self, max_bytes: int = READ_CHUNK_BYTES) -> bytes:
        await anyio.lowlevel.checkpoint()
        while True:
            if self._fd < 0:
                raise anyio.ClosedResourceError
            try:
                data = os.read(self._fd, max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._fd)
                continue
            if not data:
                raise anyio.EndOfStream
            return data

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            anyio.notify_closing(fd)
            os.close(fd)

    async def aclose(self) -> None:
        self.close()


class PipeSendStream(ByteSendStream):
    """The writing end of a pipe; ``BrokenResourceError`` once the reader is gone."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        view = memoryview(item)
        while view:
            if self._fd < 0:
                raise anyio.ClosedResourceError
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._fd)
            except BrokenPipeError as exc:
                raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            anyio.notify_closing(fd)
            os.close(fd)


class ForkedProcess:
    """A task process forked by the warm runner and reparented to this process (the subset
    of ``anyio.abc.Process`` the supervisor uses): this process waits for it and reaps it."""

    def __init__(self, pid: int, stdin: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self.stdin: ByteSendStream | None = PipeSendStream(stdin)
        self.stdout: ByteReceiveStream | None = PipeReceiveStream(stdout)
        self.stderr: ByteReceiveStream | None = PipeReceiveStream(stderr)
        self.returncode: int | None = None
        self._exited = anyio.Event()
        self._waiting = False

    def __repr__(self) -> str:
        return f"<ForkedProcess pid={self.pid} rc={self.returncode}>"

    async def wait(self) -> int | None:
        """Until the task process exited; its exit status (None if it was not our child)."""
        if not self._waiting:
            self._waiting = True
            try:
                await _until_gone(self.pid)
            except BaseException:
                self._waiting = False
                raise
            self.returncode = _reap(self.pid)
            self._exited.set()
        await self._exited.wait()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None and not self._exited.is_set():
            with suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            for stream in (self.stdin, self.stdout, self.stderr):
                if stream is not None:
                    await stream.aclose()
        try:
            await self.wait()
        except BaseException:
            self.kill()
            with anyio.CancelScope(shield=True):
                await self.wait()
            raise
        finally:
            _reap_group(self.pid)

    async def __aenter__(self) -> ForkedProcess:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _has_exited(pid: int) -> bool:
    """Whether our child ``pid`` exited (it is not reaped: ``WNOWAIT``)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _reap(pid: int) -> int | None:
    """The exit status of our exited child ``pid`` (reaped now); None if not our child."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status)


def _reap_group(pgid: int) -> None:
    """Reap what of the task's process group ended up our children (orphaned while a spawn
    had this process as subreaper) and exited; never blocks."""
    with suppress(ChildProcessError, OSError):
        while os.waitid(os.P_PGID, pgid, os.WEXITED | os.WNOHANG) is not None:
            pass


class Subreaper:
    """This process as the subreaper of its descendants, while at least one spawn needs it
    (``PR_SET_CHILD_SUBREAPER``: a forked task process is reparented to us, its executor,
    as a cold one is our child; the window is kept short, as every orphan of this process's
    descendants comes to us meanwhile)."""

    PR_SET_CHILD_SUBREAPER: Final = 36

    def __init__(self) -> None:
        self._users = 0
        self._prctl = _prctl()

    @property
    def available(self) -> bool:
        return self._prctl is not None

    def _set(self, on: bool) -> None:
        assert self._prctl is not None
        if self._prctl(self.PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")

    def __enter__(self) -> None:
        if self._users == 0:
            self._set(True)
        self._users += 1

    def __exit__(self, *exc_info: object) -> None:
        self._users -= 1
        if self._users == 0:
            self._set(False)


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


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


async def _until_gone(pid: int) -> None:
    """Until process ``pid`` exited (readable pidfd; without pidfds, polled)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfd_open (Linux < 5.3): poll our child without reaping it
        while not _has_exited(pid):  # noqa: ASYNC110 - nothing to wait on without a pidfd
            await anyio.sleep(PID_POLL_S)
        return
    try:
        await anyio.wait_readable(pidfd)
    finally:
        anyio.notify_closing(pidfd)
        os.close(pidfd)


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
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
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
                await anyio.wait_writable(control)
            except OSError as exc:  # it died meanwhile (run() starts a new one), or too big
                logger.warning("Cannot send a step to the warm task runner: %s", exc)
                return False
