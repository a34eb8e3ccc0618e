"""The loop of a pre-imported process that forks children (``serve_main``), shared by the
executor's warm task runner (``engine.executor.warm_runner``) and the DAG processor's parse
runner (``engine.dag_processing.parse_runner``).

Theory of operation. A fresh interpreter pays for importing the engine before it does its
work (most of its start-up). Its parent (``engine.warm.service``) starts a runner once: the
runner imports what every child imports (its ``preload``), checks that it is still
single-threaded (a fork copies only the forking thread: a lock held by another thread would
stay locked forever in the child), freezes the garbage collector's view of those objects
(so children do not copy-on-write them) and says ``ready`` on its control socket. It also
imports the installed packages the DAG files of the dags and plugins folders import
(``dag_imports``: read with ``ast``, never run; modules inside those folders are left out,
as they change with the DAG files), one at a time: a package whose import leaves a thread
running or a file descriptor open is reported (``refused``, with its name) and the parent
starts a new runner that skips it. A runner never opens a database connection, starts an
event loop, imports a DAG file or runs user code: the only state a child inherits from it
is imported code.

Ahead of each piece of work the parent asks for a *standby*: one request
(``SOCK_SEQPACKET``: one message, atomic) carrying two file descriptors, the standby's step
socket and a status pipe. The runner forks a *forker*, which forks the standby and exits at
once; the parent is a subreaper while the fork is in flight (``processes.SUBREAPER``), so
the standby is reparented to the parent: its child, as a cold child process is
(``os.getppid()``, exit status by ``waitpid``, reaping), and independent of the runner once
started. The standby waits until it is reparented, starts a new session (its pid is its
process group, which the parent signals to stop it), writes ``pid N ppid M`` on the status
pipe and waits on its step socket. When the work comes, the parent sends it there: one
message with four pipes (stdin, stdout, stderr and a channel the work may use) and, as
JSON, the work's environment, working directory and what the entry point needs; the
standby puts the pipes on fds 0/1/2, takes the environment and working directory, and calls
the runner's ``run_step`` with the request and the channel, exactly as a cold ``python -m``
start would run. Nothing a child does reaches the runner or another child (each is a fresh
copy of the runner, which never ran user code). A standby whose step socket closes without
work (the parent discarded it, or is gone) exits.

The runner ignores SIGCHLD (the kernel reaps the forkers) and exits when its control socket
closes (its parent is gone). Everything here is stdlib: a runner imports its preload only.
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
from typing import TYPE_CHECKING, Any, Final, NoReturn, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

READY: Final = b"ready"
#: at most this many DAG files are read for the packages they import
DAG_FILES_SCANNED_MAX: Final = 2000
#: a standby request: the standby's step socket and its status pipe
STANDBY_FDS: Final = 2
#: a step: stdin, stdout, stderr, the channel
STEP_FDS: Final = 4
REQUEST_MAX_BYTES: Final = 4 * 1024 * 1024


class StepRunner(Protocol):
    """What a standby runs once its work came: the entry point's ``main`` with the request
    (``request["env"]`` and ``["cwd"]`` already applied) and the channel's descriptor."""

    def __call__(self, request: dict[str, Any], channel_fd: int) -> int: ...


#: The broker trigger classes' modules: a DAG file that declares a watcher imports one; none
#: imports its broker client (``producers``), so a runner may preload them all.
BROKER_TRIGGER_MODULES: Final = (
    "producers.message_queue",
    "producers.kafka_trigger",
    "producers.sqs_trigger",
    "producers.rabbitmq_trigger",
    "producers.redis_trigger",
    "producers.nats_trigger",
    "producers.mqtt_trigger",
)


#: What a DAG file imports, for any runner whose children import DAG files (task steps,
#: parses): the authoring surface (``from engine import ...``, ``engine.sensors``), the
#: built-in triggers, the broker trigger classes (no client) and croniter, which a cron
#: schedule reads on first use.
DAG_FILE_MODULES: Final = (
    "engine",
    "engine.sensors",
    "engine.exceptions",
    "triggers",
    "triggers.base",
    "triggers.temporal",
    "triggers.file",
    *BROKER_TRIGGER_MODULES,
    "croniter",
)


def prime_operator_arguments() -> object:
    """Fill, before the forks, the per-class cache each child's DAG file would fill afresh
    (``engine.authoring.default_args.prime_accepted_arguments``), imported only here: until
    its preload a runner imports only the standard library."""
    from engine.authoring.baseoperator import BaseOperator
    from engine.authoring.default_args import prime_accepted_arguments

    return prime_accepted_arguments(BaseOperator)


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
            getattr(module, attr)  # a lazy package's names load now, not in every child
    for name in optional:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


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
    """The installed packages the DAG files in ``folders`` import: what a runner may import
    ahead of its children. Modules in the folders themselves are left out (they change with
    the DAG files: each child imports them fresh)."""
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
    every child would share it), after which forking is unsafe; None if none did."""
    for name in names:
        if name in skip:
            continue
        fds = open_fds()
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - broken or optional: the child imports it itself
            continue
        if thread_count() != 1 or open_fds() > fds:
            return name
    return None


def _write(fd: int, text: str) -> bool:
    try:
        os.write(fd, text.encode())
    except OSError:  # the parent is gone: the child sees its stdin close
        return False
    return True


def _become_standby(status: int, forker: int) -> None:
    """In the standby: become the parent's child in a session of its own, and say so."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the work's own children are its own
    while os.getppid() == forker:  # until the forker's exit made the parent ours
        time.sleep(0.0001)
    os.setsid()
    written = _write(status, f"pid {os.getpid()} ppid {os.getppid()}\n")
    os.close(status)
    if not written:  # the parent stopped waiting for it: nobody will send it work
        os._exit(0)


def _receive_step(step: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The work the parent sends the standby; None when its socket closed first."""
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


def _run_step(request: dict[str, Any], fds: list[int], run_step: StepRunner) -> int:
    """In the standby, once its work came: become what a cold ``python -m`` start of the
    entry point would be (standard streams, environment, working directory), then run it."""
    stdin, stdout, stderr, channel = fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    if request.get("cwd") is not None:
        os.chdir(request["cwd"])
    try:
        return run_step(request, channel)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _standby(fds: list[int], forker: int, run_step: StepRunner) -> int:
    """The standby's life: reparented, then one piece of work (or none, when discarded)."""
    step_fd, status = fds
    _become_standby(status, forker)
    with socket.socket(fileno=step_fd) as step:
        received = _receive_step(step)
    if received is None:
        return 0
    return _run_step(*received, run_step)


def _fork_standby(control: socket.socket, fds: list[int], run_step: StepRunner) -> None:
    """Fork a forker, which forks the standby and exits at once: the standby is reparented
    to the nearest subreaper, the parent (``engine.warm.service``), as its child."""
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
                code = _standby(fds, forker, run_step)
            except BaseException:  # noqa: BLE001 - nothing may return into the runner
                traceback.print_exc()
        else:
            code = 0
    except BaseException:  # noqa: BLE001 - nothing may return into the runner's loop
        traceback.print_exc()
    finally:
        os._exit(code)  # threads the work started must not keep the process alive


def serve(control: socket.socket, run_step: StepRunner) -> int:
    """Fork one standby per request until the control socket closes."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the forkers
    while True:
        message, fds, _, _ = socket.recv_fds(
            control, REQUEST_MAX_BYTES, STANDBY_FDS, socket.MSG_CMSG_CLOEXEC
        )
        if not message:
            return 0  # the parent is gone; the standbys see their step sockets close
        try:
            if len(fds) == STANDBY_FDS:
                _fork_standby(control, fds, run_step)
        finally:
            for fd in fds:
                os.close(fd)


def _refuse(control: socket.socket, why: str, *, skip: str | None = None) -> NoReturn:
    """Tell the parent this process cannot fork safely (and, with ``skip``, which DAG
    import to leave out next time)."""
    answer = {"refused": f"{why}: forking is unsafe", "skip": skip}
    control.sendall(json.dumps(answer).encode())
    sys.stderr.flush()
    os._exit(1)  # not sys.exit: the stray thread would keep the process alive


def serve_main(
    argv: list[str] | None,
    *,
    prog: str,
    modules: tuple[str, ...],
    optional: tuple[str, ...],
    run_step: StepRunner,
    prime: Callable[[], object] | None = None,
) -> int:
    """A runner's ``main``: preload ``modules`` (and ``optional`` ones when installed) and
    the DAG files' installed imports, then ``prime()`` (a cache each child would fill
    afresh, filled once here), say ready, fork standbys running ``run_step``."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--dag-folder", action="append", default=[], type=Path)
    parser.add_argument("--skip", action="append", default=[], help="a package not to import")
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.control_fd)
    os.set_inheritable(control.fileno(), False)
    preload(modules, optional)
    threads = thread_count()
    if threads != 1:
        return _refuse(control, f"{threads} threads after the engine's imports")
    unsafe = preload_dag_imports(dag_imports(args.dag_folder), set(args.skip))
    if unsafe is not None:
        why = f"importing {unsafe} (used by DAG files) started a thread or opened a file"
        return _refuse(control, why, skip=unsafe)
    if prime is not None:
        prime()  # after the DAG files' packages: their operators too
    gc.collect()
    gc.freeze()  # the imported objects stay in the permanent generation: fewer page copies
    control.sendall(READY)
    return serve(control, run_step)
