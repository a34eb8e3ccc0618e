"""The executor's side of the warm runner: pipe streams, the status protocol, and what the
warm runner imports before it forks anything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import anyio
import pytest

from engine.executor.warm_process import (
    ForkedProcess,
    PipeReceiveStream,
    PipeSendStream,
    _read_pid,
)


async def test_pipe_streams_carry_bytes_then_end() -> None:
    read, write = os.pipe()
    receiver, sender = PipeReceiveStream(read), PipeSendStream(write)
    received = bytearray()

    async def send() -> None:
        await sender.send(b"x" * 200_000)  # more than a pipe holds: it waits for the reader
        await sender.aclose()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            while len(received) < 200_000:
                received += await receiver.receive()
        with pytest.raises(anyio.EndOfStream):
            await receiver.receive()
        await receiver.aclose()
    assert received == b"x" * 200_000


async def test_a_pipe_whose_reader_is_gone_is_broken() -> None:
    read, write = os.pipe()
    os.close(read)
    sender = PipeSendStream(write)
    with anyio.fail_after(5), pytest.raises(anyio.BrokenResourceError):
        await sender.send(b"data")
    await sender.aclose()


async def test_the_status_pipe_gives_the_pid_then_the_exit_status() -> None:
    read, write = os.pipe()
    os.write(write, b"pid 4242\nexit -9\n")
    os.close(write)
    status = PipeReceiveStream(read)
    with anyio.fail_after(5):
        started = await _read_pid(status)
        assert started == (4242, b"exit -9\n")
        pipes = [os.pipe() for _ in range(3)]
        process = ForkedProcess(4242, pipes[0][1], pipes[1][0], pipes[2][0], status, started[1])
        assert await process.wait() == -signal.SIGKILL
        assert process.returncode == -signal.SIGKILL
        await process.aclose()  # closes its ends of the pipes
    for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
        os.close(fd)


async def test_a_status_pipe_closed_before_the_fork_is_no_process() -> None:
    read, write = os.pipe()
    os.close(write)
    status = PipeReceiveStream(read)
    with anyio.fail_after(5):
        assert await _read_pid(status) is None
    await status.aclose()


async def test_an_unknown_exit_status_waits_for_the_process_to_be_gone() -> None:
    """The monitor died without reporting: the task process is waited for by pidfd."""
    child = await anyio.open_process([sys.executable, "-c", "import time; time.sleep(0.2)"])
    read, write = os.pipe()
    os.write(write, f"pid {child.pid}\n".encode())
    os.close(write)
    status = PipeReceiveStream(read)
    with anyio.fail_after(10):
        started = await _read_pid(status)
        assert started is not None
        pipes = [os.pipe() for _ in range(3)]
        process = ForkedProcess(child.pid, pipes[0][1], pipes[1][0], pipes[2][0], status)
        assert await process.wait() is None  # unknown, and only once the process exited
        assert await child.wait() == 0
        await process.aclose()
        await child.aclose()
    for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
        os.close(fd)


def test_the_warm_runner_preloads_no_heavy_library_and_stays_single_threaded() -> None:
    probe = (
        "import sys\n"
        "from engine.executor.warm_runner import OPTIONAL_PRELOAD, PRELOAD, preload, "
        "thread_count\n"
        "preload(PRELOAD, OPTIONAL_PRELOAD)\n"
        "heavy = ('sqlalchemy', 'alembic', 'prometheus_client', 'aiokafka', 'click')\n"
        "print(thread_count(), *[m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["1"]
