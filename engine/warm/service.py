"""The parent's side of a runner (``engine.warm.runner``): keep one running, ask it for
forked children, replace it when it dies. The executor drives its warm task runner with it
(``engine.executor.warm_process``), the DAG processor its parse runner
(``engine.dag_processing.parse_runner``).

``WarmRunner.run`` is a service of the parent's task group: it starts the runner
(``python -P -m MODULE``), waits for its ``ready``, and starts a new one (after a backoff)
whenever it exits while the parent is not stopping. While one is ready, it keeps one
*standby* forked ahead (``_keep_standby``), or ``standbys`` of them, each asked for on its
own, for a parent that starts several pieces of work at once (the DAG processor parses
``parsing_processes`` files at a time: one standby made at a time would pace them all): the
forks (runner, forker, standby) and the standby's reparenting happen between pieces of
work, not in them. ``WarmRunner.fork`` takes a standby (or waits for one being forked) and
sends it its work: a ``ForkedProcess`` (its pid, its standard streams, its exit status) in
one message. It returns None when no runner is ready or no standby could be had, and the
caller starts the work in a cold interpreter instead (the work waits at most
``READY_WAIT_S`` for a runner that is starting, never for one to come back). A standby
belongs to the runner that forked it: when that one exits, its standbys are discarded too.

``ForkedProcess`` offers what the parent uses of an ``anyio`` process. The forked process
is this process's child (reparented to it while ``SUBREAPER`` is on), so it is waited for
through a pidfd and reaped with ``waitpid``, as asyncio does for a cold one; the runner
dying does not affect the processes it forked. A standby whose pid was not read in time is
still read (and reaped) later: the status pipe is read until it gives the pid or closes,
and a runner that does not fork within ``FORK_TIMEOUT_S`` is killed (and replaced).
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

from engine.retry import Backoff
from engine.warm.processes import SUBREAPER, PipeReceiveStream, Standby
from engine.warm.runner import READY

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path

    from anyio.abc import Process, TaskStatus

    from engine.warm.processes import ForkedProcess

logger = logging.getLogger(__name__)

START_TIMEOUT_S: Final = 60.0  # imports on a loaded machine
FORK_TIMEOUT_S: Final = 10.0  # standby requested -> its pid known
READY_WAIT_S: Final = 5.0  # how long work waits for a runner that is starting
RESTART_BACKOFF_S: Final = 0.5
FORK_RETRY_BACKOFF_S: Final = 0.25  # a standby that could not be forked, doubling


def _cwd() -> str | None:
    """This process's working directory for the child (None if it was removed: the child
    keeps the runner's, as a cold child would inherit the removed one)."""
    try:
        return os.getcwd()
    except OSError:
        return None


async def _read_pid(status: PipeReceiveStream) -> tuple[int, int] | None:
    """The standby's pid and parent pid, which it writes once reparented; None when
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
    """Starts and restarts a runner (``python -P -m module``); forks processes from it.

    ``label`` names it in logs ("warm task runner", "parse runner")."""

    def __init__(
        self,
        *,
        module: str,
        label: str,
        environment: Callable[[], Mapping[str, str]],
        dag_folders: Sequence[Path] = (),
        standbys: int = 1,
    ) -> None:
        self._module = module
        self.label = label
        #: the runner's own environment (its children's, without the engine's secrets)
        self._environment = environment
        #: the installed packages the DAG files there import are imported ahead too
        self._dag_folders = tuple(dag_folders)
        #: DAG imports a runner refused (they start a thread or open a file)
        self.skipped: list[str] = []
        self._subreaper_failed = False
        #: standbys that could not be forked (out of descriptors) and wait to retry: while
        #: one does and none is ready, work starts cold
        self._fork_failing = 0
        #: how many processes are kept forked ahead, each asked for on its own (a standby's
        #: fork and reparenting take milliseconds: several in flight overlap them)
        self._slots = max(1, standbys)
        #: the processes forked ahead for the next work, and a wake-up for their changes
        self._standbys: list[Standby] = []
        self._changed = anyio.Event()
        self._control: socket.socket | None = None
        self._process: Process | None = None
        self._stopping = False
        #: set when the current start attempt is over (ready, or failed): work waits for
        #: a runner that is starting, which costs no more than a cold start would
        self._settled = anyio.Event()
        self._settled.set()
        self.starts = 0  # runners started (a restart counts)
        self.forks = 0  # processes forked
        self.fallbacks = 0  # work started cold because no runner could fork it

    def __repr__(self) -> str:
        pid = None if self._process is None else self._process.pid
        return (
            f"<WarmRunner {self._module} pid={pid} ready={self.ready} starts={self.starts} "
            f"forks={self.forks} "
            f"fallbacks={self.fallbacks}>"
        )

    @property
    def ready(self) -> bool:
        return self._control is not None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep a runner until cancelled; readiness is signalled at once (the first work
        waits for the first runner's start, work starts cold while it is down)."""
        if not SUBREAPER.available:
            logger.info(
                "No %s: this system cannot make the processes it forks this process's "
                "children (PR_SET_CHILD_SUBREAPER); each starts cold",
                self.label,
                extra={"action": "warm_runner_unavailable"},
            )
            task_status.started()
            return
        self._settled = anyio.Event()  # the first work waits for the first start
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
        """Start one runner and wait for it to exit; True if it became ready."""
        if self._settled.is_set():
            self._settled = anyio.Event()
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:  # out of file descriptors: back off and try again
            self._settled.set()
            logger.warning("Cannot start the %s: %s", self.label, exc)
            return False
        try:
            command = [sys.executable, "-P", "-m", self._module]
            command += ["--control-fd", str(theirs.fileno())]
            for folder in self._dag_folders:
                command += ["--dag-folder", str(folder)]
            for name in self.skipped:
                command += ["--skip", name]
            process = await anyio.open_process(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None,  # its own errors go to this process's stderr
                start_new_session=True,  # no terminal signals; children get their own sessions
                env=dict(self._environment()),
                pass_fds=(theirs.fileno(),),
            )
        except OSError as exc:
            self._settled.set()
            ours.close()
            logger.warning("Cannot start the %s: %s", self.label, exc)
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
                "The %s (pid %s) exited with code %s; work starts cold until a new one is ready",
                self.label,
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
                        "%s ready (pid %s)",
                        self.label.capitalize(),
                        self.pid,
                        extra={"action": "warm_runner_ready"},
                    )
                    return True
                self._refused(answer)
                return False
        logger.warning("The %s did not get ready in %gs", self.label, START_TIMEOUT_S)
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
            "The %s cannot serve: %s; work starts cold%s",
            self.label,
            why,
            f" until a new one, without {skip}, is ready" if skip else "",
            extra={"action": "warm_runner_refused", "skip": skip},
        )

    def _notify(self) -> None:
        """Wake whoever waits for a change of the standby or of the runner."""
        self._changed.set()
        self._changed = anyio.Event()

    @property
    def _standby(self) -> Standby | None:
        """The next standby work takes (None: none is ready); set by tests."""
        return self._standbys[0] if self._standbys else None

    @_standby.setter
    def _standby(self, standby: Standby | None) -> None:
        self._standbys = [] if standby is None else [standby]

    async def _keep_standby(self, control: socket.socket, process: Process) -> None:
        """While this runner serves: ``standbys`` processes forked ahead, each replaced as
        soon as work took it; discarded when the runner exits."""
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(self._slots):
                    tg.start_soon(self._keep_one_standby, control, process)
        finally:
            standbys, self._standbys = self._standbys, []
            self._notify()
            for standby in standbys:
                await standby.discard()

    async def _keep_one_standby(self, control: socket.socket, process: Process) -> None:
        """One standby forked ahead, a new one as soon as work took it. A runner that
        cannot fork one is killed (``run`` replaces it)."""
        backoff = Backoff(FORK_RETRY_BACKOFF_S)
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
            self._standbys.append(standby)
            self._notify()
            while standby in self._standbys:
                await self._changed.wait()

    async def _fork_failed(self, exc: OSError, backoff: Backoff) -> None:
        """No standby could be forked: work starts cold (which may fail the same way; the
        caller then deals with it) until a retry after a backoff forks one."""
        delay = backoff.failed()
        logger.warning(
            "Cannot fork a standby from the %s: %s; work starts cold, retrying in %.2fs",
            self.label,
            exc,
            delay,
            extra={"action": "warm_standby_failed", "failures": backoff.failures},
        )
        self._fork_failing += 1
        self._notify()  # work waiting for the standby starts cold now
        try:
            await anyio.sleep(delay)
        finally:
            self._fork_failing -= 1

    async def _fork_standby(self, control: socket.socket, process: Process) -> Standby | None:
        """Ask the runner for a standby; it is ours once reparented to us (None if the
        runner did not fork one)."""
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
                    theirs.close()  # the runner has its copies
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
                "A process forked by the %s is not this process's child (parent %s); the "
                "runner is not used any more",
                self.label,
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
        unread would be a child never reaped. A runner that takes longer than
        ``FORK_TIMEOUT_S`` is killed, after which the pipe closes or the pid comes soon."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(FORK_TIMEOUT_S):
                return await _read_pid(status)
            logger.warning(
                "The %s (pid %s) did not fork in %gs; it is replaced",
                self.label,
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
        runner is serving."""
        with anyio.move_on_after(FORK_TIMEOUT_S):
            while True:
                changed = self._changed
                if self._standbys:
                    standby = self._standbys.pop(0)
                    self._notify()  # the next one is forked now
                    return standby
                if self._control is None or self._subreaper_failed or self._fork_failing:
                    return None
                await changed.wait()
        return None

    async def fork(self, request: dict[str, object], channel_fd: int) -> ForkedProcess | None:
        """Start ``request`` (``env`` and ``cwd`` filled in when missing) in a standby, with
        ``channel_fd`` as its channel (the caller closes it); None when the caller must
        start it cold. OSError when no pipe could be made."""
        with anyio.move_on_after(READY_WAIT_S):
            await self._settled.wait()  # a runner starting now is as quick as a cold start
        standby = await self._take_standby()
        if standby is None:
            self.fallbacks += 1
            return None
        if "env" not in request:
            request = {**request, "env": dict(self._environment())}
        request = {"cwd": _cwd(), **request}
        try:
            process = standby.start(request, channel_fd)
        except OSError:
            await standby.discard()
            raise
        if process is None:
            await standby.discard()
            self.fallbacks += 1
            logger.warning(
                "The standby forked by the %s (pid %s) is gone; the work starts cold",
                self.label,
                standby.pid,
                extra={"action": "warm_fork_failed"},
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
                    logger.warning("The %s exited while work was being sent", self.label)
                    return False
            except OSError as exc:  # it died meanwhile (run() starts a new one), or too big
                logger.warning("Cannot send work to the %s: %s", self.label, exc)
                return False
