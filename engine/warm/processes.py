"""Processes forked by a runner (``engine.warm.runner``), as their parent sees them: pipe
streams, a standby waiting for its work (``Standby``), the process handle of the work
(``ForkedProcess``: a task step, a DAG file's parse), and this process as their subreaper
while they start (``SUBREAPER``).

A forked process is reparented to its parent (the executor, the DAG processor), so, like a
child started by asyncio, it is waited for through a pidfd (polled without one) and reaped
with ``waitpid``; its exit status is exact and does not depend on the runner.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
from contextlib import suppress
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel
from anyio.abc import ByteReceiveStream, ByteSendStream

if TYPE_CHECKING:
    from collections.abc import Callable

READ_CHUNK_BYTES: Final = 65536
PID_POLL_S: Final = 0.01
#: a discarded standby exits when its step socket closes; after this it is killed
DISCARD_WAIT_S: Final = 5.0


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


class Standby:
    """A process forked ahead of its work, this process's child in a session of its own,
    waiting on its step socket (``engine.warm.runner``): ``start`` hands it its work,
    ``discard`` lets it exit unused and reaps it."""

    def __init__(self, pid: int, step: socket.socket) -> None:
        self.pid = pid
        self._step = step

    def __repr__(self) -> str:
        return f"<Standby pid={self.pid}>"

    def start(self, request: dict[str, object], channel_fd: int) -> ForkedProcess | None:
        """Send it its work (``request``, the pipes of its standard streams and the
        channel ``channel_fd``, which the caller closes); None if it is gone, OSError when no
        pipe can be made (either way, discard it)."""
        made: list[int] = []
        try:
            for _ in range(3):
                made.extend(os.pipe())
        except OSError:
            for fd in made:
                os.close(fd)
            raise
        stdin_r, stdin_w, out_r, out_w, err_r, err_w = made
        ours, theirs = [stdin_w, out_r, err_r], [stdin_r, out_w, err_w]
        try:
            message = json.dumps(request).encode()
            socket.send_fds(self._step, [message], [*theirs, channel_fd])
        except OSError:  # it died (its socket is closed), or no room: never blocks
            for fd in ours:
                os.close(fd)
            return None
        finally:
            for fd in theirs:
                os.close(fd)
        self._step.close()  # it reads one step only
        return ForkedProcess(self.pid, *ours)

    async def discard(self) -> None:
        """Close its step socket (it exits), wait for it (killed after ``DISCARD_WAIT_S``)
        and reap it."""
        self._step.close()
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(DISCARD_WAIT_S):
                await _until_gone(self.pid)
            if not _has_exited(self.pid):
                with suppress(ProcessLookupError, PermissionError):
                    os.kill(self.pid, signal.SIGKILL)
                await _until_gone(self.pid)
            _reap(self.pid)


class ForkedProcess:
    """A process forked by a runner and reparented to this process (the subset of
    ``anyio.abc.Process`` its users need): this process waits for it and reaps it."""

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
        """Until the process exited; its exit status (None if it was not our child)."""
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
    """This process as the subreaper of its descendants, while at least one fork needs it
    (``PR_SET_CHILD_SUBREAPER``: a forked task process is reparented to us, its executor,
    as a cold one is our child; the window is kept short, as every orphan of this process's
    descendants comes to us meanwhile). The setting is the process's: use ``SUBREAPER``,
    shared by every warm runner of the process, so that one never turns it off while
    another's fork needs it."""

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


#: This process's subreaper setting, shared by all its runners (warm task runner, parse
#: runner).
SUBREAPER: Final = Subreaper()
