"""A task process as the executor holds it: started cold (a fresh interpreter running
``python -P -m engine.execution.task_runner``) or forked by the warm runner, its environment
(the executor's, without the engine's secrets), and the pumps that read its output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import suppress
from typing import TYPE_CHECKING, Protocol

import anyio

if TYPE_CHECKING:
    import socket

    from anyio.abc import ByteReceiveStream, ByteSendStream

    from engine.executor.task_logs import TaskLogWriter


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


async def drain(stream: ByteReceiveStream | None, sink: bytearray, limit: int) -> None:
    if stream is None:
        return
    async for chunk in stream:
        if len(sink) < limit:
            sink.extend(chunk[: limit - len(sink)])


#: Engine settings a task's process must not inherit (it needs neither: it gets its spec on
async def start_cold(ti_id: int, env: dict[str, str], channel_fd: int) -> StepProcess:
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


async def pump(stream: ByteReceiveStream | None, log: TaskLogWriter) -> None:
    if stream is None:
        return
    async for chunk in stream:
        await log.write(chunk)
