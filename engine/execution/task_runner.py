"""The process that runs one step of one task: ``python -P -m engine.execution.task_runner``.

Theory of operation. The executor (``engine.executor``) owns every database write of a task
instance; the child only runs user code. The parent sends one ``TaskSpec`` (a JSON line,
``engine.execution.protocol``) on the child's standard input, after a ``TaskPrelude`` line
when it knows the task at the claim (the child then imports the DAG file while the parent
marks the try running), and keeps that pipe open: when
the parent dies, the pipe closes and the child exits at once, so a task whose executor is
gone never runs twice. The child imports the DAG file (``engine.execution.loading``),
renders the task's ``template_fields`` with its context (``engine.execution.templates``: a
template error fails the try) and either starts the task (``deferral_at_start()`` then
``execute``) or resumes it (``resume_execution``), with the operator's ``pre_execute`` before
and its ``post_execute`` after (each the argument's callable, then the method). Its own
stdout, stderr and Python logging all go to its standard error, which the parent appends
to the task log; the single ``TaskResult`` (success with the return value, failure, or the
deferral to store) goes to the original standard output.
The child needs neither the database URL nor the Fernet key: what it needs from the
database (connections, variables) it asks the parent for over the request channel
(``engine.execution.task_channel``, a socket passed as ``--channel-fd``).

Results. The spec carries the results of the run's finished tasks (``xcoms``: ``{task_id:
{key: tagged JSON}}``); they join the raw context, where ``ti.xcom_pull`` and the task's
``XComArg`` arguments read them. On success the child reports the task's own results: what
it pushed (``ti.xcom_push``), its return value as ``return_value`` unless None (and each
key of a dict result with ``multiple_outputs``). A result that cannot be stored, or whose
JSON is over ``max_xcom_size_bytes``, fails the try with an error naming the task and key.
A branching task's success also carries the tasks of the run it skips (``skip_task_ids``,
``engine.authoring.branching``); the executor skips them with the success.

Mapped tasks. A copy of a mapped task (``map_index`` >= 0 in the context) loads the
``MappedOperator`` and runs the operator ``unmap`` builds for its index (its slice of the
expanded arguments); the spec's ``mapped_xcoms`` carry the results of the run's copies, which
``ti.xcom_pull`` returns as a list by ``map_index``. A task whose result a mapped task maps
over fails unless it returns a list or a dict (``engine.authoring.mapping``).

Callbacks (``engine.execution.callbacks``). ``on_execute_callback`` runs right before the
task starts or resumes (after its templates are rendered and ``pre_execute`` ran, as in
Airflow 3); once the result is written to the parent, the outcome's callback runs
(success, skipped, retry or failure: the same rule as the executor's, from ``max_tries``),
logging to the task log. The parent runs the failure / retry callback of a child that wrote
no result in a fresh ``engine.execution.callback_runner`` process.

``execution_timeout`` counts the whole try, deferrals included (as in Airflow: a task can
time out while deferred or shortly after resuming): the deadline is the try's start plus the
timeout. The child interrupts the task at the deadline with ``TaskExecutionTimeout``
(``engine.execution.deadline``); the parent kills a child that does not stop within a grace
period.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.baseoperator import MappedOperator
from engine.authoring.branching import skipped_task_ids
from engine.authoring.callbacks import FAILURE_CALLBACK, RETRY_CALLBACK
from engine.authoring.context import run_to_completion, running_with
from engine.authoring.deferral import Deferral, TaskDeferred
from engine.authoring.xcom import XCOM_RETURN_KEY
from engine.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
    ParamValidationError,
)
from engine.execution.callbacks import outcome_callback_kind, run_callbacks, task_callbacks
from engine.execution.context import hydrate_context
from engine.execution.deadline import Deadline, TaskExecutionTimeout, remaining_s, timeout_message
from engine.execution.loading import task_for
from engine.execution.map_index import render_map_index
from engine.execution.outlets import collect_outlet_events, is_metadata_result
from engine.execution.process import (
    argument_parser,
    configure_logging,
    exit_when_parent_goes,
    exit_with,
    redirect_output,
    start,
)
from engine.execution.protocol import (
    EXIT_BAD_SPEC,
    TaskPrelude,
    TaskResult,
    TaskSpec,
    raw_context,
)
from engine.execution.results import check_mappable_result, collect_results
from engine.execution.retry_decisions import PolicyVerdict, ask_retry_policy
from engine.execution.templates import render_template_fields
from engine.states import TaskState
from triggers.serde import loads

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.authoring.baseoperator import BaseOperator

logger = logging.getLogger(__name__)


def _on_execute(task: BaseOperator, context: dict[str, Any]) -> None:
    run_callbacks(
        task_callbacks(task, "on_execute_callback"),
        context,
        what=f"task {task.task_id!r} on_execute_callback",
    )


def _call(task: BaseOperator, spec: TaskSpec, context: dict[str, Any]) -> Any:
    """One step, in Airflow 3's order: templates, ``pre_execute``, ``on_execute_callback``,
    ``execute`` (or the method a deferred task resumes at), ``post_execute``."""
    render_template_fields(task, context)  # each step, as Airflow: a resumed task's too
    if spec.next_method is None and (deferral := task.deferral_at_start()) is not None:
        _on_execute(task, context)
        raise deferral
    task.run_pre_execute(context)
    _on_execute(task, context)
    if spec.next_method is not None:
        kwargs = loads(spec.next_kwargs) if spec.next_kwargs else {}
        if not isinstance(kwargs, dict):
            raise TypeError(f"stored next_kwargs of task {spec.task_id!r} are not a mapping")
        result = task.resume_execution(spec.next_method, kwargs, context)
    else:
        result = run_to_completion(task.execute(context), what=f"task {spec.task_id!r}: execute()")
    task.run_post_execute(context, result)
    return result


def _success(results: dict[str, Any], elapsed_s: float) -> TaskResult:
    return TaskResult(
        TaskState.SUCCESS,
        elapsed_s,
        return_value=results.get(XCOM_RETURN_KEY),
        has_return_value=XCOM_RETURN_KEY in results,
        xcoms=results,
    )


def _error_summary(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@dataclass(slots=True)
class StepState:
    """What ``run_task`` got to, for the outcome's callbacks (``run_outcome_callbacks``);
    and the task its ``TaskPrelude`` loaded before the spec came (``preload``)."""

    task: BaseOperator | None = None
    context: dict[str, Any] | None = None
    exception: BaseException | None = None
    #: the copy's ``map_index_template`` rendered after a successful ``execute``
    rendered_map_index: str | None = None
    map_index_rendered: bool = False
    prelude: TaskPrelude | None = None
    preloaded: BaseOperator | None = None
    preload_error: BaseException | None = None

    def preload(self, prelude: TaskPrelude) -> None:
        """Load the prelude's task now; what loading raised is raised again by the step
        that runs it (``load_task``), as loading it then would have."""
        self.prelude = prelude
        try:
            self.preloaded = task_for(prelude)
        except BaseException as exc:  # noqa: BLE001 - the step reports it as it would have
            self.preload_error = exc

    def load_task(self, spec: TaskSpec) -> BaseOperator:
        """The spec's task: the preloaded one (once) when the prelude named it."""
        prelude, preloaded, error = self.prelude, self.preloaded, self.preload_error
        self.prelude = self.preloaded = self.preload_error = None
        if prelude is None or not prelude.names(spec):
            return task_for(spec)
        if error is not None:
            raise error
        assert preloaded is not None
        return preloaded


def run_task(
    spec: TaskSpec, *, now: datetime | None = None, step: StepState | None = None
) -> TaskResult:
    """Load and run the task described by ``spec``; never raises for the task's errors.

    ``step`` receives the task, its context and the exception that failed it (for the
    callbacks run once the result is reported). ``on_execute_callback`` runs here, before
    the task starts or resumes. A copy of a mapped task that ended (not deferred) reports
    its ``map_index_template`` rendered with its context (``engine.execution.map_index``:
    strictly once it succeeded, a template error failing the try; leniently once it failed
    or was skipped).
    """
    step = StepState() if step is None else step
    result = _run_step(spec, now, step)
    if result.outcome == TaskState.DEFERRED:
        return result
    rendered = step.rendered_map_index
    if not step.map_index_rendered:
        rendered = render_map_index(step.task, step.context)
    return result if rendered is None else replace(result, rendered_map_index=rendered)


def _run_step(spec: TaskSpec, now: datetime | None, step: StepState) -> TaskResult:
    started = time.monotonic()
    try_started = datetime.fromisoformat(spec.try_started_at)
    timeout: timedelta | None = None

    def message() -> str:
        assert timeout is not None
        elapsed = (datetime.now(UTC) - try_started).total_seconds()
        return timeout_message(timeout.total_seconds(), elapsed, spec.deferral_count)

    deadline = Deadline(math.inf, message)
    try:
        task = step.task = step.load_task(spec)
        timeout = task.execution_timeout
        deadline = Deadline(remaining_s(try_started, timeout, now or datetime.now(UTC)), message)
        raw = raw_context(spec)
        context = hydrate_context(raw, task)
        is_copy = isinstance(task, MappedOperator)
        if isinstance(task, MappedOperator):  # this copy's operator, its own arguments
            task = step.task = task.unmap(context)
            context = hydrate_context(raw, task)
        step.context = context
        if deadline.expired:  # e.g. a slow start: it still fails with its callbacks
            step.exception = TaskExecutionTimeout(message())
            return TaskResult(TaskState.FAILED, 0.0, error=message(), timed_out=True)
        with deadline:
            with running_with(context):
                value = _call(task, spec, context)
        step.map_index_rendered = True  # a template error fails the try, as in Airflow
        step.rendered_map_index = render_map_index(task, context, strict=True)
        outlet_events = collect_outlet_events(context, task, value)
        if is_metadata_result(value):
            value = None
        if not is_copy:  # a copy's result is one item of what a task below maps over
            check_mappable_result(task, value)
        results = collect_results(context, task, value, max_bytes=spec.max_xcom_size_bytes)
    except TaskDeferred as deferred:
        return _deferred(step, spec, deferred, timeout, time.monotonic() - started)
    except AirflowSkipException as exc:
        step.exception = exc
        logger.info("Task skipped: %s", exc or "AirflowSkipException", extra={"action": "skip"})
        return TaskResult(TaskState.SKIPPED, time.monotonic() - started, error=_error_summary(exc))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the boundary around user code
        traceback.print_exc()
        step.exception = exc
        error = message() if deadline.fired else _error_summary(exc)
        # AirflowFailException, or params the run's conf made invalid: a retry would fail
        # the same way, and the retry policy is not asked
        no_retry = isinstance(exc, AirflowFailException | ParamValidationError)
        verdict = PolicyVerdict()
        if not no_retry:
            verdict = ask_retry_policy(
                step.task,
                exc,
                try_number=spec.try_number,
                max_tries=spec.max_tries,
                context=step.context,
            )
        return TaskResult(
            TaskState.FAILED,
            time.monotonic() - started,
            error=error,
            timed_out=deadline.fired,
            no_retry=no_retry or verdict.fail_now,
            retry_delay_s=verdict.retry_delay_s,
            retry_reason=verdict.reason,
        )
    result = _success(results, time.monotonic() - started)
    result.outlet_events.extend(outlet_events)
    result.skip_task_ids.extend(skipped_task_ids(context))
    return result


def _deferred(
    step: StepState,
    spec: TaskSpec,
    deferred: TaskDeferred,
    timeout: timedelta | None,
    elapsed_s: float,
) -> TaskResult:
    """A deferral, with what the try pushed so far (stored now, as Airflow stores a push:
    the resumed try reads it); a push that cannot be stored fails the try."""
    pushed: dict[str, Any] = {}
    if step.task is not None and step.context is not None:
        try:
            pushed = collect_results(
                step.context, step.task, None, max_bytes=spec.max_xcom_size_bytes
            )
        except (TypeError, ValueError) as exc:
            return TaskResult(TaskState.FAILED, elapsed_s, error=_error_summary(exc))
    return TaskResult(
        TaskState.DEFERRED,
        elapsed_s,
        execution_timeout_s=None if timeout is None else timeout.total_seconds(),
        deferral=Deferral.from_exception(deferred),
        xcoms=pushed,
    )


def run_outcome_callbacks(spec: TaskSpec, result: TaskResult, step: StepState) -> None:
    """Run the callbacks of the step's outcome (success, skip, retry or failure; none for a
    deferral) with the task's context; failures get ``context["exception"]``. Their errors
    are logged, never change the result (it is already reported)."""
    if step.task is None or step.context is None:
        return  # the task could not be loaded or its context built: nothing to call
    kind = outcome_callback_kind(
        result.outcome,
        no_retry=result.no_retry,
        try_number=spec.try_number,
        max_tries=spec.max_tries,
    )
    if kind is None:
        return
    context = step.context
    if kind in (FAILURE_CALLBACK, RETRY_CALLBACK):
        context["exception"] = step.exception or AirflowException(result.error or "failed")
    run_callbacks(task_callbacks(step.task, kind), context, what=f"task {spec.task_id!r} {kind}")


# --- the process ---------------------------------------------------------------------------


def _read_spec(ti_id: int, step: StepState) -> TaskSpec | None:
    """The spec on standard input; a ``TaskPrelude`` before it is loaded first."""
    line = sys.stdin.buffer.readline()
    prelude = TaskPrelude.from_line(line)
    if prelude is not None and prelude.ti_id == ti_id:
        step.preload(prelude)
        line = sys.stdin.buffer.readline()
    try:
        spec = TaskSpec.from_json(line)
    except ValueError as exc:
        print(f"engine.execution.task_runner: {exc}", file=sys.stderr)
        return None
    if spec.ti_id != ti_id:
        print(
            f"engine.execution.task_runner: the spec is for task instance {spec.ti_id}",
            file=sys.stderr,
        )
        return None
    return spec


#: ``start``'s arguments for a task process: its module, the option naming the task instance
ARGUMENTS: Final = ("engine.execution.task_runner", "ti-id", "the task instance (for ps)")


def prime() -> None:
    """Build (and use once) the argument parser every task process needs, in a warm runner
    before it forks (``engine.executor.warm_runner``)."""
    argument_parser(*ARGUMENTS).parse_args(["--ti-id", "0"])


def main(argv: Sequence[str] | None = None) -> int:
    args = start(*ARGUMENTS, argv)
    result_fd = redirect_output()
    configure_logging()
    step = StepState()
    spec = _read_spec(args.ti_id, step)
    if spec is None:
        return EXIT_BAD_SPEC
    exit_when_parent_goes(sys.stdin.buffer)
    result = run_task(spec, step=step)
    sys.stdout.flush()
    sys.stderr.flush()
    with os.fdopen(result_fd, "w", encoding="utf-8") as out:
        out.write(result.to_json())  # reported before the callbacks: they cannot change it
    run_outcome_callbacks(spec, result, step)
    return 0


if __name__ == "__main__":
    exit_with(main())
