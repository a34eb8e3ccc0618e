"""The executor's side of the warm runner: pipe streams, the status protocol, and what the
warm runner imports before it forks anything."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys

import anyio
import pytest

import producers
from engine.authoring import default_args
from engine.executor.warm_process import WarmRunner
from engine.executor.warm_runner import PRELOAD
from engine.warm import processes as forked_process
from engine.warm.processes import (
    ForkedProcess,
    PipeReceiveStream,
    PipeSendStream,
    Standby,
    Subreaper,
)
from engine.warm.runner import prime_operator_arguments
from engine.warm.service import _read_pid
from triggers.extras import EXTRA_OF


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


async def test_the_status_pipe_gives_the_pid_and_parent_of_the_task_process() -> None:
    read, write = os.pipe()
    os.write(write, b"pid 4242 ppid 17\n")
    os.close(write)
    status = PipeReceiveStream(read)
    with anyio.fail_after(5):
        assert await _read_pid(status) == (4242, 17)
    await status.aclose()


async def test_a_status_pipe_closed_before_the_fork_is_no_process() -> None:
    read, write = os.pipe()
    os.close(write)
    status = PipeReceiveStream(read)
    with anyio.fail_after(5):
        assert await _read_pid(status) is None
    await status.aclose()


@pytest.mark.parametrize(
    ("code", "returncode"),
    [("raise SystemExit(7)", 7), ("import os, signal; os.kill(os.getpid(), 9)", -9)],
)
async def test_a_forked_process_is_waited_for_and_reaped_by_its_parent(
    code: str, returncode: int
) -> None:
    """Not an asyncio child: the exit status comes from a pidfd and ``waitpid``."""
    pid = os.posix_spawn(sys.executable, [sys.executable, "-c", code], os.environ)  # noqa: ASYNC221
    pipes = [os.pipe() for _ in range(3)]
    process = ForkedProcess(pid, pipes[0][1], pipes[1][0], pipes[2][0])
    with anyio.fail_after(30):
        assert await process.wait() == returncode
        assert await process.wait() == returncode  # again: the same, once reaped
        await process.aclose()  # closes its ends of the pipes
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - reaped
    for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
        os.close(fd)


def test_this_process_can_be_a_subreaper_for_a_while() -> None:
    subreaper = Subreaper()
    assert subreaper.available
    with subreaper, subreaper:  # nested: on until the last user leaves
        pass


def test_the_warm_runner_preloads_no_heavy_library_and_stays_single_threaded() -> None:
    """But what a task step imports only on first use (Jinja2 for a template, croniter for a
    cron schedule) is imported once, there."""
    heavy = ("sqlalchemy", "alembic", "prometheus_client", "click", *EXTRA_OF)
    on_first_use = ("jinja2.sandbox", "jinja2.nativetypes", "croniter")
    probe = (
        "import sys\n"
        "from engine.executor.warm_runner import OPTIONAL_PRELOAD, PRELOAD, preload, "
        "thread_count\n"
        "preload(PRELOAD, OPTIONAL_PRELOAD)\n"
        f"print(thread_count(), *[m for m in {heavy!r} if m in sys.modules])\n"
        f"print(*[m for m in {on_first_use!r} if m not in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.splitlines() == ["1", ""]


def test_the_warm_runner_primes_the_arguments_each_operator_class_accepts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step's DAG file then builds its tasks without one ``inspect.signature``."""
    from engine import DAG, BashOperator, task

    monkeypatch.setattr(default_args, "_accepted", {})
    assert prime_operator_arguments() == len(default_args._accepted) > 2  # those imported

    def recomputed(cls: type) -> frozenset[str]:
        raise AssertionError(f"{cls.__name__}: not primed")

    monkeypatch.setattr(default_args, "_accepted_by", recomputed)
    with DAG("primed", schedule=None, default_args={"retries": 2}):

        @task
        def step() -> None:
            pass

        built = [step(), BashOperator(task_id="shell", bash_command="true")]
    assert [task.retries for task in built] == [2, 2]


def test_the_warm_runner_preloads_every_broker_trigger_class() -> None:
    """A step of a DAG file that declares a broker watcher then imports none of ``producers``
    (the clients stay out: the test above)."""
    trigger_modules = {
        getattr(producers, name).__module__
        for name in producers.__all__
        if name.endswith("Trigger")
    }
    assert trigger_modules <= set(PRELOAD)


async def test_no_descriptor_left_for_a_pipe_raises_os_error_and_leaks_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step is then requeued by the supervisor (it catches OSError), as a cold start is;
    the standby it had taken is discarded and reaped."""
    monkeypatch.setattr(forked_process, "DISCARD_WAIT_S", 0.05)  # it is killed at once
    runner = WarmRunner(environment=dict)
    control, warm_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    step, standby_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.posix_spawn("/bin/sleep", ["sleep", "60"], os.environ)  # noqa: ASYNC221
    runner._control = control
    runner._standby = Standby(pid, step)
    runner._settled.set()
    real_pipe, made = os.pipe, []

    def pipe() -> tuple[int, int]:
        if len(made) == 2:  # the standby's stderr
            raise OSError(errno.EMFILE, "Too many open files")
        made.append(real_pipe())
        return made[-1]

    monkeypatch.setattr(os, "pipe", pipe)
    try:
        with anyio.fail_after(10), pytest.raises(OSError, match="Too many open files"):
            await runner.spawn(ti_id=1, env={}, channel_fd=standby_end.fileno())
        for fd in (fd for pair in made for fd in pair):
            with pytest.raises(OSError):
                os.fstat(fd)  # closed again
        assert runner._standby is None
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - killed and reaped
    finally:
        control.close()
        warm_end.close()
        standby_end.close()
