"""The child process that runs callbacks: ``python -P -m engine.executor.callback_runner``.

The executor (``engine.executor.callbacks``) sends one ``CallbackSpec`` (a JSON line) on the
child's standard input: a DAG's ``on_success_callback`` / ``on_failure_callback`` when the
scheduler ended a run, or a task's outcome callback its own process could not run (killed at
its ``execution_timeout``, crashed). The child imports the DAG file, builds the context the
task (or, for a DAG callback, the task that ended last) would see (``engine.authoring``
hydrates it), adds ``exception`` for a task failure or ``reason`` for a DAG callback, and
calls the callbacks. Everything it prints, its logging and the tracebacks of failing
callbacks go to its standard error, which the executor appends to the task's log (a DAG
callback's to its own log). A failing callback never changes any state: the outcome was
recorded before. Like the task runner it stays light: no database, no engine settings;
connections and variables come from the executor over the request channel
(``engine.executor.task_channel``, a socket passed as ``--channel-fd``), and the secrets
they hold are masked in the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.callbacks import (
    DAG_CALLBACKS,
    TASK_CALLBACKS,
    dag_callbacks,
    run_callbacks,
    task_callbacks,
)
from engine.authoring.runtime_context import hydrate_context
from engine.exceptions import AirflowException, AirflowTaskTimeout
from engine.executor.task_runner import TaskSpec, _open_channel, _raw_context

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.authoring.baseoperator import BaseOperator
    from engine.authoring.dag import DAG

logger = logging.getLogger(__name__)

EXIT_BAD_SPEC: Final = 3
EXIT_NOT_LOADED: Final = 5
EXIT_PARENT_GONE: Final = 4
TASK: Final = "task"
DAG_KIND: Final = "dag"


@dataclass(frozen=True, slots=True)
class CallbackSpec:
    """Which callbacks to run, and the task spec their context is built from."""

    kind: str  # TASK or DAG_KIND
    callback: str  # one of TASK_CALLBACKS / DAG_CALLBACKS
    spec: str  # TaskSpec JSON (a DAG callback: the task whose context it gets, if any)
    error: str | None = None  # a task failure: why it failed
    timed_out: bool = False  # ... at its execution_timeout
    reason: str | None = None  # a DAG callback: "success" or "task_failure"
    map_index: int = -1  # a task callback: the copy of a mapped task (its log), -1 if none

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> CallbackSpec:
        """``ValueError`` when ``text`` is not a callback spec."""
        try:
            spec = cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed callback spec: {exc}") from exc
        known = TASK_CALLBACKS if spec.kind == TASK else DAG_CALLBACKS
        if spec.kind not in (TASK, DAG_KIND) or spec.callback not in known:
            raise ValueError(f"malformed callback spec: {spec.kind} {spec.callback!r}")
        return spec


def _load_dag(task_spec: TaskSpec) -> DAG:
    """The DAG, from its file; from the file's last good version when it is broken now."""
    from engine.authoring.dag import take_registered_dags
    from engine.authoring.dag_files import add_import_paths, collect_dags, import_dag_file
    from engine.authoring.errors import DagDefinitionError
    from engine.executor.last_good import load_or_last_good

    add_import_paths(
        Path(task_spec.dags_folder) if task_spec.dags_folder else None,
        Path(task_spec.plugins_folder) if task_spec.plugins_folder else None,
    )

    def load(source: str | None) -> DAG:
        take_registered_dags()  # nothing a failed import before this one left behind
        module = import_dag_file(Path(task_spec.fileloc), source=source)
        for dag in collect_dags(module, task_spec.fileloc):
            if dag.dag_id == task_spec.dag_id:
                return dag
        raise DagDefinitionError(f"{task_spec.fileloc} defines no DAG {task_spec.dag_id!r}")

    return load_or_last_good(task_spec.fileloc, load)


def _context(
    task_spec: TaskSpec, dag: DAG, task: BaseOperator | None, *, kind: str = TASK
) -> tuple[dict[str, Any], BaseOperator | None]:
    """The callbacks' context, and the task they belong to (a mapped task's copy: the
    operator of its own index, as the task runner builds it). A DAG callback built around a
    mapped task that is no copy (``map_index`` -1: it expanded to nothing) gets the mapped
    task as it is."""
    from engine.authoring.baseoperator import MappedOperator

    raw = _raw_context(task_spec)
    if task is None:
        return {**raw, "dag": dag, "params": dict(dag.params)}, None  # a run without tasks
    context = hydrate_context(raw, task)
    if isinstance(task, MappedOperator):
        if kind == DAG_KIND and int(raw.get("map_index", -1)) < 0:
            return context, task
        task = task.unmap(context)
        context = hydrate_context(raw, task)
    return context, task


def run_callback_spec(spec: CallbackSpec) -> list[str]:
    """Load the DAG and run the callbacks ``spec`` names; returns their errors (logged).

    ``LookupError`` / ``DagDefinitionError`` / the DAG file's own error when the DAG or the
    task cannot be loaded.
    """
    task_spec = TaskSpec.from_json(spec.spec)
    dag = _load_dag(task_spec)
    task = dag.task_dict.get(task_spec.task_id)
    if spec.kind == TASK and task is None:
        raise LookupError(f"DAG {dag.dag_id!r} has no task {task_spec.task_id!r} any more")
    context, task = _context(task_spec, dag, task, kind=spec.kind)
    if spec.kind == TASK:
        assert task is not None
        if spec.error is not None:
            kind = AirflowTaskTimeout if spec.timed_out else AirflowException
            context["exception"] = kind(spec.error)
        what = f"task {task.task_id!r} {spec.callback}"
        return run_callbacks(task_callbacks(task, spec.callback), context, what=what)
    context["reason"] = spec.reason
    what = f"DAG {dag.dag_id!r} {spec.callback}"
    return run_callbacks(dag_callbacks(dag, spec.callback), context, what=what)


def _exit_when_parent_goes(stream: Any) -> None:
    def watch() -> None:
        try:
            while stream.read(65536):
                pass
        except (OSError, ValueError):
            pass
        os._exit(EXIT_PARENT_GONE)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.executor.callback_runner")
    parser.add_argument("--request-id", type=int, required=True, help="the request (for ps)")
    parser.add_argument("--channel-fd", type=int, default=None, help="the request channel")
    args = parser.parse_args(argv)
    if args.channel_fd is not None:
        _open_channel(args.channel_fd)
    os.dup2(2, 1)  # prints go to the log
    from engine.logs import configure_logging

    configure_logging("INFO", "text")
    try:
        spec = CallbackSpec.from_json(sys.stdin.buffer.readline())
    except ValueError as exc:
        print(f"engine.executor.callback_runner: {exc}", file=sys.stderr)
        return EXIT_BAD_SPEC
    _exit_when_parent_goes(sys.stdin.buffer)
    try:
        run_callback_spec(spec)
    except Exception as exc:  # the DAG file or the task cannot be loaded
        logger.exception(
            "Cannot run %s: %s", spec.callback, exc, extra={"action": "callback_not_loaded"}
        )
        return EXIT_NOT_LOADED
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # threads a callback started must not keep the process alive
