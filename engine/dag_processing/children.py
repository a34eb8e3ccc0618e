"""One DAG file parsed in a child process, bounded in time (``parse_in_child``).

The child is a fork of the parse runner when one is ready (``engine.dag_processing.
parse_runner``: the engine already imported, a few milliseconds to start), else a fresh
``python -P -m engine.dag_processing.parsing``; either way it runs the same ``main`` with
the same arguments, in a session of its own, with the engine's secrets kept out of its
environment. A child that runs longer than ``[core] dag_file_processor_timeout`` is killed
with its whole process group; a little before that it dumps its stack, so the stored error
points at the line that hung. With a parse-request server, the file's top-level
``Variable.get`` / ``Connection.get`` are answered on a socket, and what they served is
masked in the stored error.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from typing import TYPE_CHECKING, Final

import anyio

from engine.dag_processing.parsing import FileParseResult, ParseError
from engine.logs import child_environment

if TYPE_CHECKING:
    from pathlib import Path

    from anyio.abc import ByteReceiveStream, Process

    from engine.dag_processing.parse_requests import ParseRequestServer
    from engine.dag_processing.settings import DagProcessorSettings
    from engine.warm.processes import ForkedProcess
    from engine.warm.service import WarmRunner

STDOUT_MAX_BYTES: Final = 64 * 1024 * 1024
STDERR_TAIL_BYTES: Final = 64 * 1024
STACK_DUMP_FRACTION: Final = 0.8  # of the timeout, when the child dumps its stack
TIMEOUT_ERROR: Final = "DagFileTimeout"
CRASH_ERROR: Final = "DagFileProcessError"


def child_args(path: Path, settings: DagProcessorSettings) -> list[str]:
    """The arguments of ``engine.dag_processing.parsing.main`` for ``path`` (the moment to
    dump its stack counts from now: a child's start-up is part of its time)."""
    args = ["--dags-folder", str(settings.dags_folder)]
    if settings.plugins_folder is not None:
        args += ["--plugins-folder", str(settings.plugins_folder)]
    dump_at = time.time() + settings.file_timeout_s * STACK_DUMP_FRACTION
    args += ["--dump-stack-at", f"{dump_at:.3f}"]
    return [*args, str(path)]


def _cold_command(args: list[str], request_fd: int | None) -> list[str]:
    command = [sys.executable, "-P", "-m", "engine.dag_processing.parsing"]
    if request_fd is not None:
        command += ["--request-fd", str(request_fd)]
    return [*command, *args]


async def _drain(stream: ByteReceiveStream | None, sink: bytearray, limit: int) -> None:
    """Read ``stream`` to the end, keeping at most ``limit`` bytes (the last ones)."""
    if stream is None:
        return
    async for chunk in stream:
        sink.extend(chunk)
        if len(sink) > limit:
            del sink[: len(sink) - limit]


def _kill_group(process: Process | ForkedProcess) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _hung_line(stderr: str, fileloc: str) -> int | None:
    """The innermost line of ``fileloc`` in the stack the child dumped before its timeout."""
    lines = re.findall(rf'File "{re.escape(fileloc)}", line (\d+)', stderr)
    return int(lines[0]) if lines else None  # faulthandler prints the innermost frame first


async def parse_in_child(
    path: Path,
    settings: DagProcessorSettings,
    server: ParseRequestServer | None = None,
    runner: WarmRunner | None = None,
) -> FileParseResult:
    """Parse one file in a child process (forked from ``runner`` when it can, else cold),
    bounded by ``settings.file_timeout_s``; with a ``server``, the file's top-level
    ``Variable.get`` / ``Connection.get`` are answered by it, and the secrets it served are
    masked in the stored error."""
    result = await _parse_in_child(path, settings, server, runner)
    return result if server is None else server.mask_error(result)


async def _start(
    path: Path,
    settings: DagProcessorSettings,
    channel: socket.socket | None,
    runner: WarmRunner | None,
) -> Process | ForkedProcess:
    """The child: forked from ``runner`` when it has one ready, else a fresh interpreter."""
    args = child_args(path, settings)
    env = child_environment(os.environ, settings.secrets)
    if runner is not None:
        spare = None
        if channel is None:  # a fork is always sent a channel: an unused one
            spare, channel = socket.socketpair()
        try:
            request = {"argv": args, "serve": spare is None, "env": dict(env)}
            forked = await runner.fork(request, channel.fileno())
        finally:
            if spare is not None:
                spare.close()
                channel.close()
        if forked is not None:
            if forked.stdin is not None:
                await forked.stdin.aclose()  # as a cold child's /dev/null: nothing to read
            return forked
    request_fd = None if channel is None else channel.fileno()
    return await anyio.open_process(
        _cold_command(args, request_fd),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
        pass_fds=() if request_fd is None else (request_fd,),
    )


async def _parse_in_child(
    path: Path,
    settings: DagProcessorSettings,
    server: ParseRequestServer | None,
    runner: WarmRunner | None,
) -> FileParseResult:
    fileloc = str(path)
    out, err = bytearray(), bytearray()
    ours, theirs = socket.socketpair() if server is not None else (None, None)
    try:
        process = await _start(path, settings, theirs, runner)
    except BaseException:
        if ours is not None:
            ours.close()
        raise
    finally:
        if theirs is not None:
            theirs.close()  # the child has its copy
    async with process:
        try:
            with anyio.move_on_after(settings.file_timeout_s) as scope:
                async with anyio.create_task_group() as tg:
                    if server is not None and ours is not None:
                        tg.start_soon(server.serve, ours)
                    async with anyio.create_task_group() as pipes:
                        pipes.start_soon(_drain, process.stdout, out, STDOUT_MAX_BYTES)
                        pipes.start_soon(_drain, process.stderr, err, STDERR_TAIL_BYTES)
                    await process.wait()
                    tg.cancel_scope.cancel()  # the server, if a grandchild holds its end
        finally:
            if process.returncode is None:
                _kill_group(process)
    stderr = err.decode("utf-8", "replace")
    if scope.cancelled_caught:
        message = (
            f"importing the file took longer than {settings.file_timeout_s:g} s ([core] "
            "dag_file_processor_timeout) and was stopped; move slow or blocking work out of "
            "module level"
        )
        error = ParseError(TIMEOUT_ERROR, message, _hung_line(stderr, fileloc), stderr or None)
        return FileParseResult(fileloc=fileloc, error=error)
    return _read_result(fileloc, process.returncode, bytes(out), stderr)


def _read_result(fileloc: str, returncode: int | None, out: bytes, stderr: str) -> FileParseResult:
    problem = f"exited with code {returncode}"
    if returncode == 0:
        try:
            result = FileParseResult.from_json(out.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            problem = f"returned an unreadable result ({exc})"
        else:
            if result.fileloc == fileloc:
                return result
            problem = f"returned the result of another file ({result.fileloc})"
    message = f"the parsing process {problem}; its output ends with: {stderr[-2000:]}"
    return FileParseResult(fileloc=fileloc, error=ParseError(CRASH_ERROR, message, None, stderr))
