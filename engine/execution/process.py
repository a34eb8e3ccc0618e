"""What a task (or callback) process does at start, before it runs anything of the user's.

It takes its request channel to the executor (``--channel-fd``: the store of connections and
variables, and the last good version of its DAG file), keeps its real standard output for
the result and sends its prints to standard error (the log), configures logging to
standard error, and exits at once when the executor closes its standard input (the
executor died, or gave up on it): a step whose executor is gone never runs on.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, NoReturn

from engine.authoring.store import install_store
from engine.execution.last_good import use_channel
from engine.execution.protocol import EXIT_PARENT_GONE
from engine.execution.remote_results import use_results_reader
from engine.execution.task_channel import TaskChannel
from engine.execution.triggering_events import use_events_reader

if TYPE_CHECKING:
    from collections.abc import Sequence


def start(
    module: str, id_option: str, id_help: str, argv: Sequence[str] | None
) -> argparse.Namespace:
    """The process's arguments (``--<id_option>``, shown by ``ps``, and ``--channel-fd``),
    its request channel taken."""
    args = argument_parser(module, id_option, id_help).parse_args(argv)
    if args.channel_fd is not None:
        open_channel(args.channel_fd)
    return args


@functools.cache
def argument_parser(module: str, id_option: str, id_help: str) -> argparse.ArgumentParser:
    """``start``'s parser, built once per process: a warm runner builds it before it forks
    (``engine.execution.task_runner.prime``), and a forked step takes it ready (building
    it there cost ~1 ms of the step's start, its pages copied on first write)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument(f"--{id_option}", type=int, required=True, help=id_help)
    parser.add_argument("--channel-fd", type=int, default=None, help="the request channel")
    return parser


def exit_when_parent_goes(stream: Any) -> None:
    """Exit at once when the parent closes our stdin (it died, or gave up on us)."""

    def watch() -> None:
        try:
            while stream.read(65536):
                pass
        except (OSError, ValueError):
            pass
        os._exit(EXIT_PARENT_GONE)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def open_channel(fd: int) -> None:
    """Connections and variables come from the parent, over the request channel."""
    os.set_inheritable(fd, False)  # not for the processes the task starts
    channel = TaskChannel.from_fd(fd)
    install_store(channel)
    use_channel(channel)  # and the last good version of a DAG file that is broken now
    use_results_reader(channel)  # and results of other runs (xcom_pull(dag_id=, run_id=))
    use_events_reader(channel)  # and the run's triggering events, when the task reads them


def configure_logging() -> None:
    from engine.logs import configure_logging as configure

    configure("INFO", "text")


def redirect_output() -> int:
    """Keep the real stdout for the result (returns its fd); prints go to stderr (the log)."""
    result_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    return result_fd


def exit_with(code: int) -> NoReturn:
    """End the process with ``code`` once its output is flushed, at once: threads the task
    (or a callback) started must not keep it alive."""
    sys.stdout.flush()
    sys.stderr.flush()
    # The executor reads both pipes to their end: closing them now tells it the process is
    # done while the kernel still tears its (forked, large) address space down.
    os.closerange(0, 3)
    os._exit(code)
