"""The warm runner: a pre-imported process that forks task steps (``python -P -m
engine.executor.warm_runner --control-fd N``).

Theory of operation. A cold task step pays for a fresh interpreter and for importing the
engine's authoring API and the task runner (most of its start-up). The executor
(``engine.executor.warm_process``) starts this process once: it imports what every task step
imports (``PRELOAD``), checks that it is still single-threaded (a fork copies only the
forking thread: a lock held by another thread would stay locked forever in the child),
freezes the garbage collector's view of those objects (so children do not copy-on-write
them) and says ``ready`` on its control socket. It never opens a database connection,
starts an event loop, imports a DAG file or runs user code: the only state a step inherits
from it is imported code.

Per step the executor sends one request (``SOCK_SEQPACKET``: one message, atomic) carrying
the step's pipes as file descriptors (stdin, stdout, stderr, the request channel, a status
pipe) and, as JSON, the task instance id, the step's environment and working directory. The
warm runner forks a small *monitor*, which forks the *task process*:

- the task process starts a new session (its pid is its process group, which the executor
  signals on cancel, clear, timeout and shutdown, as for a cold step), puts the pipes on
  fds 0/1/2, takes the step's environment and working directory, and runs
  ``engine.executor.task_runner.main`` exactly as a cold ``python -m`` start would; the DAG
  file is imported there, fresh from disk for every step, so a changed file is never stale;
- the monitor writes ``pid N`` on the status pipe, waits for the task process and writes
  ``exit RC`` (``RC`` as ``Popen.returncode``: negative for a signal). It is not in the
  task's process group, so killing the task's group never loses its exit status, and it is
  not the warm runner, so steps in flight survive the warm runner's death.

The warm runner ignores SIGCHLD (the kernel reaps the monitors) and exits when its control
socket closes (its executor is gone). Everything here is stdlib until ``PRELOAD``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any, Final

#: What every task step imports: the task runner and the whole authoring surface a DAG file
#: uses (``from engine import ...``, ``engine.sensors``, the built-in triggers).
PRELOAD: Final = (
    "engine.executor.task_runner",
    "engine.executor.task_channel",
    "engine.executor.last_good",
    "engine.authoring.dag_files",
    "engine.authoring.connections",
    "engine.logs",
    "engine",
    "engine.sensors",
    "engine.exceptions",
    "triggers",
    "triggers.base",
    "triggers.temporal",
    "triggers.file",
)
#: Imported when installed: a running task's dates are pendulum's when it is (its import was
#: three quarters of a warm step's time: ``engine.authoring.runtime_context.as_moment``).
OPTIONAL_PRELOAD: Final = ("pendulum",)
READY: Final = b"ready"
#: stdin, stdout, stderr, the request channel, the status pipe
STEP_FDS: Final = 5
REQUEST_MAX_BYTES: Final = 4 * 1024 * 1024
EXIT_MONITOR_FAILED: Final = 70


def thread_count() -> int:
    """Threads of this process, native ones included (``/proc``; else Python's count)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def preload(modules: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    for name in modules:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            getattr(module, attr)  # a lazy package's names load now, not in every step
    for name in optional:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _write(fd: int, text: str) -> bool:
    try:
        os.write(fd, text.encode())
    except OSError:  # the executor is gone: the task process sees its stdin close
        return False
    return True


def _run_task(request: dict[str, Any], fds: list[int]) -> int:
    """In the task process: become what a cold ``python -m engine.executor.task_runner``
    would be, then run it."""
    stdin, stdout, stderr, channel, status = fds
    os.setsid()
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.close(status)
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    if request.get("cwd") is not None:
        os.chdir(request["cwd"])
    from engine.executor import task_runner

    argv = ["--ti-id", str(request["ti_id"]), "--channel-fd", str(channel)]
    sys.argv = [task_runner.__file__, *argv]
    try:
        return task_runner.main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _monitor(request: dict[str, Any], fds: list[int]) -> int:
    """In the monitor: fork the task process, report its pid and then its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # wait for our own child
    os.setpgid(0, 0)  # out of the warm runner's group: a signal to it does not reach us
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _run_task(request, fds)
        except BaseException:  # noqa: BLE001 - nothing may return into the warm runner's loop
            traceback.print_exc()
        finally:
            os._exit(code)  # threads the task started must not keep the process alive
    status = fds[4]
    for fd in fds[:4]:
        os.close(fd)
    if not _write(status, f"pid {pid}\n"):
        os.kill(pid, signal.SIGKILL)
    _, wait_status = os.waitpid(pid, 0)
    _write(status, f"exit {os.waitstatus_to_exitcode(wait_status)}\n")
    return 0


def _fork_step(control: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() != 0:
        return
    code = EXIT_MONITOR_FAILED
    try:
        control.close()
        code = _monitor(request, fds)
    except BaseException:  # noqa: BLE001 - nothing may return into the warm runner's loop
        traceback.print_exc()
    finally:
        os._exit(code)


def serve(control: socket.socket) -> int:
    """Fork one step per request until the control socket closes."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the monitors
    while True:
        message, fds, _, _ = socket.recv_fds(
            control, REQUEST_MAX_BYTES, STEP_FDS, socket.MSG_CMSG_CLOEXEC
        )
        if not message:
            return 0
        try:
            request = json.loads(message)
            if len(fds) == STEP_FDS and isinstance(request, dict):
                _fork_step(control, request, fds)
        except ValueError:
            pass  # a malformed request: its status pipe closes, the executor starts it cold
        finally:
            for fd in fds:
                os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.executor.warm_runner")
    parser.add_argument("--control-fd", type=int, required=True)
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.control_fd)
    os.set_inheritable(control.fileno(), False)
    preload(PRELOAD, OPTIONAL_PRELOAD)
    threads = thread_count()
    if threads != 1:
        message = f"{threads} threads after the imports: forking is unsafe"
        control.sendall(b"refused " + message.encode())
        print(f"engine.executor.warm_runner: {message}", file=sys.stderr)
        return 1
    gc.collect()
    gc.freeze()  # the imported objects stay in the permanent generation: fewer page copies
    control.sendall(READY)
    return serve(control)


if __name__ == "__main__":
    sys.exit(main())
