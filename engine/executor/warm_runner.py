"""The warm runner: a pre-imported process that forks task steps (``python -P -m
engine.executor.warm_runner --control-fd N``).

Theory of operation. A cold task step pays for a fresh interpreter and for importing the
engine's authoring API and the task runner (most of its start-up). The executor
(``engine.executor.warm_process``) starts this process once: it imports what every task step
imports (``PRELOAD``), checks that it is still single-threaded (a fork copies only the
forking thread: a lock held by another thread would stay locked forever in the child),
freezes the garbage collector's view of those objects (so children do not copy-on-write
them) and says ``ready`` on its control socket. It also imports the installed packages
the DAG files of the dags and plugins folders import (``dag_imports``: read with ``ast``,
never run; modules inside those folders are left out, as they change with the DAG files),
one at a time: a package whose import leaves a thread running or a file descriptor open is
reported (``refused``, with its name) and the executor starts a new warm runner that skips
it. Then it fills the per-class cache a DAG file's tasks would each fill afresh (the
arguments every operator class accepts: ``prime_operator_arguments``). The warm runner never
opens a database connection, starts an event loop, imports a DAG file or runs user code: the
only state a step inherits from it is imported code and that cache.

Ahead of each step the executor asks for a *standby* task process: one request
(``SOCK_SEQPACKET``: one message, atomic) carrying two file descriptors, the standby's step
socket and a status pipe. The warm runner forks a *forker*, which forks the standby and
exits at once; the executor is a subreaper while the fork is in flight
(``forked_process.SUBREAPER``), so the standby is reparented to the executor: its child, as
a cold task process is (``os.getppid()``, exit status by ``waitpid``, reaping), and
independent of the warm runner once started. The standby waits until it is reparented,
starts a new session (its pid is its process group, which the executor signals on cancel,
clear, timeout and shutdown), writes ``pid N ppid M`` on the status pipe and waits on its
step socket. When a step comes, the executor sends it there: one message with the step's
pipes (stdin, stdout, stderr, the request channel) and, as JSON, the task instance id, the
step's environment and working directory; the standby puts the pipes on fds 0/1/2, takes
the environment and working directory, and runs ``engine.execution.task_runner.main`` exactly
as a cold ``python -m`` start would. So the forks are off the step's path: a step starts
with one message. The DAG file is imported there, fresh from disk for every step, so a
changed file never runs stale code, and nothing a step does reaches the warm runner or
another step (each is a fresh copy of the warm runner, which never ran a task). A standby
whose step socket closes without a step (the executor discarded it, or is gone) exits.

The warm runner ignores SIGCHLD (the kernel reaps the forkers) and exits when its control
socket closes (its executor is gone). Everything here is stdlib until ``PRELOAD``.
"""

from __future__ import annotations

import argparse
import ast
import gc
import importlib
import importlib.util
import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Final, NoReturn

#: What every task step imports: the task runner (with what it imports: the protocol, the
#: request channel, loading the DAG file, the context, templates ...), what it imports on
#: first use (logging), and the whole authoring surface a DAG file uses (``from engine
#: import ...``, ``engine.sensors``, the built-in triggers, the broker trigger classes).
#: The broker trigger classes import no broker client (``producers``): a DAG file that
#: declares a watcher then imports nothing in its task steps, while the clients stay out of
#: the warm runner and of every step (a client is imported where its trigger runs, in the
#: triggerer). ``producers`` itself is not listed: each of its names would load, producers
#: and their clients included. Jinja2 and croniter, which the task runner and the DAG files
#: import only when a template renders or a cron expression is read (a cold start of a task
#: that needs neither skips them), are imported here once for all steps.
PRELOAD: Final = (
    "engine.execution.task_runner",
    "engine.execution.process",
    "engine.execution.task_channel",
    "engine.execution.last_good",
    "engine.execution.loading",
    "engine.authoring.dag_files",
    "engine.authoring.store",
    "engine.logs",
    "engine",
    "engine.sensors",
    "engine.exceptions",
    "triggers",
    "triggers.base",
    "triggers.temporal",
    "triggers.file",
    "producers.message_queue",
    "producers.kafka_trigger",
    "producers.sqs_trigger",
    "producers.rabbitmq_trigger",
    "producers.redis_trigger",
    "producers.nats_trigger",
    "producers.mqtt_trigger",
    "jinja2.sandbox",
    "jinja2.nativetypes",
    "jinja2.ext",
    "croniter",
)
#: Imported when installed: a running task's dates are pendulum's when it is (its import was
#: three quarters of a warm step's time: ``engine.authoring.context.as_moment``).
OPTIONAL_PRELOAD: Final = ("pendulum",)
READY: Final = b"ready"
#: at most this many DAG files are read for the packages they import
DAG_FILES_SCANNED_MAX: Final = 2000
#: a standby request: the standby's step socket and its status pipe
STANDBY_FDS: Final = 2
#: a step: stdin, stdout, stderr, the request channel
STEP_FDS: Final = 4
REQUEST_MAX_BYTES: Final = 4 * 1024 * 1024


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


def prime_operator_arguments() -> int:
    """Work each step would otherwise redo when its DAG file builds a task: the argument
    names every operator class defined so far accepts (``default_args``:
    ``inspect.signature`` over each ``__init__`` of its MRO, cached per class, the dearest
    part of a small DAG file's import in a step). Returns how many classes."""
    from engine.authoring.baseoperator import BaseOperator
    from engine.authoring.default_args import accepted_arguments

    pending: list[type[BaseOperator]] = [BaseOperator]
    seen: set[type[BaseOperator]] = set()
    while pending:
        cls = pending.pop()
        if cls not in seen:
            seen.add(cls)
            pending.extend(cls.__subclasses__())
            try:
                accepted_arguments(cls)
            except Exception:  # noqa: BLE001 - an odd operator: its steps work it out (and fail) alone
                continue
    return len(seen)


def _imported_names(path: Path) -> set[str]:
    """The top-level names of the absolute imports in a Python file (none if unreadable)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def dag_imports(folders: list[Path]) -> list[str]:
    """The installed packages the DAG files in ``folders`` import: what a warm runner may
    import ahead of their tasks. Modules in the folders themselves are left out (they
    change with the DAG files: the task process imports them fresh)."""
    folders = [folder for folder in folders if folder.is_dir()]
    roots = [str(folder.resolve()) for folder in folders]
    files = (path for folder in folders for path in sorted(folder.rglob("*.py")))
    names: set[str] = set()
    for count, path in enumerate(files):
        if count >= DAG_FILES_SCANNED_MAX:
            break
        names |= _imported_names(path)
    found = []
    for name in sorted(names - set(sys.modules)):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = None if spec is None else (spec.origin or "")
        if origin is not None and not any(origin.startswith(root) for root in roots):
            found.append(name)
    return found


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def preload_dag_imports(names: list[str], skip: set[str]) -> str | None:
    """Import ``names`` (installed packages DAG files use) but ``skip``. Returns the first
    one whose import left a thread running or a file descriptor open (a socket, a file:
    every task process would share it), after which forking is unsafe; None if none did."""
    for name in names:
        if name in skip:
            continue
        fds = open_fds()
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - broken or optional: the task imports it itself
            continue
        if thread_count() != 1 or open_fds() > fds:
            return name
    return None


def _write(fd: int, text: str) -> bool:
    try:
        os.write(fd, text.encode())
    except OSError:  # the executor is gone: the task process sees its stdin close
        return False
    return True


def _become_standby(status: int, forker: int) -> None:
    """In the standby: become the executor's child in a session of its own, and say so."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the task's own children are its own
    while os.getppid() == forker:  # until the forker's exit made the executor our parent
        time.sleep(0.0001)
    os.setsid()
    written = _write(status, f"pid {os.getpid()} ppid {os.getppid()}\n")
    os.close(status)
    if not written:  # the executor stopped waiting for it: nobody will send it a step
        os._exit(0)


def _receive_step(step: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The step the executor sends the standby; None when its socket closed first."""
    try:
        message, fds, _, _ = socket.recv_fds(
            step, REQUEST_MAX_BYTES, STEP_FDS, socket.MSG_CMSG_CLOEXEC
        )
    except OSError:
        return None
    try:
        request = json.loads(message) if message else None
    except ValueError:
        request = None
    if not isinstance(request, dict) or len(fds) != STEP_FDS:
        for fd in fds:
            os.close(fd)
        return None
    return request, fds


def _run_task(request: dict[str, Any], fds: list[int]) -> int:
    """In the standby, once its step came: become what a cold ``python -m
    engine.execution.task_runner`` would be, then run it."""
    stdin, stdout, stderr, channel = fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    if request.get("cwd") is not None:
        os.chdir(request["cwd"])
    from engine.execution import task_runner

    argv = ["--ti-id", str(request["ti_id"]), "--channel-fd", str(channel)]
    sys.argv = [task_runner.__file__, *argv]
    try:
        return task_runner.main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _standby(fds: list[int], forker: int) -> int:
    """The standby's life: reparented, then one step (or none, when discarded)."""
    step_fd, status = fds
    _become_standby(status, forker)
    with socket.socket(fileno=step_fd) as step:
        received = _receive_step(step)
    if received is None:
        return 0
    return _run_task(*received)


def _fork_standby(control: socket.socket, fds: list[int]) -> None:
    """Fork a forker, which forks the standby and exits at once: the standby is reparented
    to the nearest subreaper, the executor (``warm_process``), as its child."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() != 0:
        return
    code = 1
    try:
        control.close()
        forker = os.getpid()
        if os.fork() == 0:
            try:
                code = _standby(fds, forker)
            except BaseException:  # noqa: BLE001 - nothing may return into the warm runner
                traceback.print_exc()
        else:
            code = 0
    except BaseException:  # noqa: BLE001 - nothing may return into the warm runner's loop
        traceback.print_exc()
    finally:
        os._exit(code)  # threads the task started must not keep the process alive


def serve(control: socket.socket) -> int:
    """Fork one standby per request until the control socket closes."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the forkers
    while True:
        message, fds, _, _ = socket.recv_fds(
            control, REQUEST_MAX_BYTES, STANDBY_FDS, socket.MSG_CMSG_CLOEXEC
        )
        if not message:
            return 0  # the executor is gone; the standbys see their step sockets close
        try:
            if len(fds) == STANDBY_FDS:
                _fork_standby(control, fds)
        finally:
            for fd in fds:
                os.close(fd)


def _refuse(control: socket.socket, why: str, *, skip: str | None = None) -> NoReturn:
    """Tell the executor this process cannot fork safely (and, with ``skip``, which DAG
    import to leave out next time)."""
    answer = {"refused": f"{why}: forking is unsafe", "skip": skip}
    control.sendall(json.dumps(answer).encode())
    sys.stderr.flush()
    os._exit(1)  # not sys.exit: the stray thread would keep the process alive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.executor.warm_runner")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--dag-folder", action="append", default=[], type=Path)
    parser.add_argument("--skip", action="append", default=[], help="a package not to import")
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.control_fd)
    os.set_inheritable(control.fileno(), False)
    preload(PRELOAD, OPTIONAL_PRELOAD)
    threads = thread_count()
    if threads != 1:
        return _refuse(control, f"{threads} threads after the engine's imports")
    unsafe = preload_dag_imports(dag_imports(args.dag_folder), set(args.skip))
    if unsafe is not None:
        why = f"importing {unsafe} (used by DAG files) started a thread or opened a file"
        return _refuse(control, why, skip=unsafe)
    prime_operator_arguments()  # after the DAG files' packages: their operators too
    gc.collect()
    gc.freeze()  # the imported objects stay in the permanent generation: fewer page copies
    control.sendall(READY)
    return serve(control)


if __name__ == "__main__":
    sys.exit(main())
