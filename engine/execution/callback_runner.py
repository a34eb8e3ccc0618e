"""The process that runs callbacks: ``python -P -m engine.execution.callback_runner``.

The executor (``engine.executor.callbacks``) sends one ``CallbackSpec`` (a JSON line,
``engine.execution.protocol``) on the
child's standard input: a DAG's ``on_success_callback`` / ``on_failure_callback`` when the
scheduler ended a run, a missed deadline's callback (``engine.execution.deadline_callbacks``),
or a task's outcome callback its own process could not run (killed at
its ``execution_timeout``, crashed). The child imports the DAG file, builds the context the
task (or, for a DAG callback, the task that ended last) would see (``engine.authoring``
hydrates it), adds ``exception`` for a task failure or ``reason`` for a DAG callback, and
calls the callbacks. Everything it prints, its logging and the tracebacks of failing
callbacks go to its standard error, which the executor appends to the task's log (a DAG
callback's to its own log). A failing callback never changes any state: the outcome was
recorded before. Like the task runner it stays light: no database, no engine settings;
connections and variables come from the executor over the request channel
(``engine.execution.task_channel``, a socket passed as ``--channel-fd``), and the secrets
they hold are masked in the log.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from engine.authoring.baseoperator import MappedOperator
from engine.exceptions import AirflowException, AirflowTaskTimeout
from engine.execution.callbacks import dag_callbacks, run_callbacks, task_callbacks
from engine.execution.context import hydrate_context
from engine.execution.deadline_callbacks import run_deadline_callback
from engine.execution.loading import dag_for
from engine.execution.process import (
    configure_logging,
    exit_when_parent_goes,
    exit_with,
    start,
)
from engine.execution.protocol import (
    DAG_KIND,
    DEADLINE_KIND,
    EXIT_BAD_SPEC,
    EXIT_NOT_LOADED,
    TASK,
    CallbackSpec,
    TaskSpec,
    raw_context,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.authoring.baseoperator import BaseOperator
    from engine.authoring.dag import DAG

logger = logging.getLogger(__name__)


def _context(
    task_spec: TaskSpec, dag: DAG, task: BaseOperator | None, *, kind: str = TASK
) -> tuple[dict[str, Any], BaseOperator | None]:
    """The callbacks' context, and the task they belong to (a mapped task's copy: the
    operator of its own index, as the task runner builds it). A DAG callback built around a
    mapped task that is no copy (``map_index`` -1: it expanded to nothing) gets the mapped
    task as it is."""

    raw = raw_context(task_spec)
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
    if spec.kind == DEADLINE_KIND:
        return run_deadline_callback(spec)
    task_spec = TaskSpec.from_json(spec.spec)
    dag = dag_for(task_spec)
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


def main(argv: Sequence[str] | None = None) -> int:
    start("engine.execution.callback_runner", "request-id", "the request (for ps)", argv)
    os.dup2(2, 1)  # prints go to the log
    configure_logging()
    try:
        spec = CallbackSpec.from_json(sys.stdin.buffer.readline())
    except ValueError as exc:
        print(f"engine.execution.callback_runner: {exc}", file=sys.stderr)
        return EXIT_BAD_SPEC
    exit_when_parent_goes(sys.stdin.buffer)
    try:
        run_callback_spec(spec)
    except Exception as exc:  # the DAG file or the task cannot be loaded
        logger.exception(
            "Cannot run %s: %s", spec.callback, exc, extra={"action": "callback_not_loaded"}
        )
        return EXIT_NOT_LOADED
    return 0


if __name__ == "__main__":
    exit_with(main())
