"""The child process that runs one step of one task: ``python -P -m engine.executor.task_runner``.

Theory of operation. The executor (``engine.executor``) owns every database write of a task
instance; the child only runs user code. The parent sends one ``TaskSpec`` (a JSON line) on
the child's standard input and keeps that pipe open: when the parent dies, the pipe closes
and the child exits at once, so a task whose executor is gone never runs twice. The child
imports the DAG file (``engine.authoring.dag_files.load_task``), renders the task's
``template_fields`` with its context (``engine.authoring.templates``: a template error fails
the try) and either starts the task (``deferral_at_start()`` then ``execute``) or resumes it
(``resume_execution``). Its own stdout, stderr and Python logging all go to its standard
error, which the parent appends to the task log; the single ``TaskResult`` (success with
the return value, failure, or the deferral to store) goes to the original standard output.
The child needs neither the database URL nor the Fernet key: what it needs from the
database (connections, variables) it asks the parent for over the request channel
(``engine.executor.task_channel``, a socket passed as ``--channel-fd``).

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

Callbacks (``engine.authoring.callbacks``). ``on_execute_callback`` runs right before the
task starts or resumes; once the result is written to the parent, the outcome's callback runs
(success, skipped, retry or failure: the same rule as the executor's, from ``max_tries``),
logging to the task log. The parent runs the failure / retry callback of a child that wrote
no result in a fresh ``engine.executor.callback_runner`` process.

``execution_timeout`` counts the whole try, deferrals included (as in Airflow: a task can
time out while deferred or shortly after resuming): the deadline is the try's start plus the
timeout. The child interrupts the task at the deadline with ``TaskExecutionTimeout`` (a
SIGALRM timer); the parent kills a child that does not stop within a grace period.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.baseoperator import MappedOperator
from engine.authoring.branching import skipped_task_ids
from engine.authoring.callbacks import (
    FAILURE_CALLBACK,
    RETRY_CALLBACK,
    outcome_callback_kind,
    run_callbacks,
    task_callbacks,
)
from engine.authoring.context import (
    DEFAULT_DEFERRABLE_KEY,
    TRIGGERING_ASSET_EVENTS_KEY,
    run_to_completion,
)
from engine.authoring.deferral import Deferral, TaskDeferred
from engine.authoring.mapping import UnmappableXComTypePushed, XComForMappingNotPushed
from engine.authoring.runtime_context import (
    RuntimeTaskInstance,
    collect_outlet_events,
    encode_result,
    hydrate_context,
    is_metadata_result,
    running_with,
)
from engine.authoring.templates import render_template_fields
from engine.authoring.xcom import XCOM_RETURN_KEY
from engine.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
    AirflowTaskTimeout,
    ParamValidationError,
)
from engine.states import TaskState
from triggers.exceptions import SerializationError
from triggers.serde import deserialize_value, loads

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import FrameType

    from engine.authoring.baseoperator import BaseOperator
    from engine.db.queries.assets import EventRow

logger = logging.getLogger(__name__)

EXIT_BAD_SPEC: Final = 3
EXIT_PARENT_GONE: Final = 4
#: how a step ends (``TaskResult.outcome``): the task state it reports
STEP_OUTCOMES: Final = frozenset(
    {TaskState.SUCCESS, TaskState.FAILED, TaskState.SKIPPED, TaskState.DEFERRED}
)


class TaskExecutionTimeout(AirflowTaskTimeout):
    """Raised inside a task that ran past its ``execution_timeout`` (deferrals included)."""


# --- the protocol: what the parent sends, what the child answers ---------------------------


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What the child runs. ``context`` and ``next_kwargs`` are tagged JSON text."""

    ti_id: int
    dag_id: str
    run_id: str
    task_id: str
    fileloc: str
    try_number: int
    try_started_at: str  # ISO 8601, aware: the try's start (execution_timeout counts from it)
    context: str
    next_method: str | None = None
    next_kwargs: str | None = None
    deferral_count: int = 0
    dags_folder: str | None = None
    plugins_folder: str | None = None
    #: the results of the run's finished tasks: JSON text of {task_id: {key: tagged JSON}}
    xcoms: str | None = None
    #: ``[core] max_xcom_size_bytes``: the largest result (its JSON) the task may store
    max_xcom_size_bytes: int | None = None
    #: the results of the run's copies of mapped tasks: JSON text of {task_id: {map_index:
    #: {key: tagged JSON}}}
    mapped_xcoms: str | None = None
    #: retries of the task: a failed try with ``try_number <= max_tries`` is retried (it
    #: decides between ``on_retry_callback`` and ``on_failure_callback``)
    max_tries: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> TaskSpec:
        """``ValueError`` when ``text`` is not a spec."""
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed task spec: {exc}") from exc


@dataclass(frozen=True, slots=True)
class TaskResult:
    """How the step ended. ``return_value`` is tagged JSON (``serialize_value``)."""

    outcome: str  # a TaskState: success, failed, skipped or deferred
    elapsed_s: float
    return_value: Any = None
    has_return_value: bool = False
    error: str | None = None
    timed_out: bool = False
    execution_timeout_s: float | None = None  # the task's own, exact (the DB rounds it up)
    deferral: Deferral | None = field(default=None)
    #: on success, the asset events to record: {"asset", "uri", "extra", "alias"}
    outlet_events: list[dict[str, Any]] = field(default_factory=list)
    #: a failure that must not be retried (``AirflowFailException``)
    no_retry: bool = False
    #: on success, the task's results to store: {key: tagged JSON} (``return_value`` too)
    xcoms: dict[str, Any] = field(default_factory=dict)
    #: on success, the tasks of the run a branch skips (``engine.authoring.branching``)
    skip_task_ids: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> TaskResult:
        """``ValueError`` when ``text`` is not a result."""
        try:
            data = json.loads(text)
            deferral = data.pop("deferral")
            result = cls(**data, deferral=None if deferral is None else Deferral(**deferral))
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"malformed task result: {exc}") from exc
        if result.outcome not in STEP_OUTCOMES:
            raise ValueError(f"malformed task result: unknown outcome {result.outcome!r}")
        if (result.outcome == TaskState.DEFERRED) != (result.deferral is not None):
            raise ValueError("malformed task result: a deferral goes with outcome 'deferred'")
        return result


# --- pure helpers ---------------------------------------------------------------------------


def event_dict(event: EventRow) -> dict[str, Any]:
    """An asset event as the task context carries it (``engine.authoring`` hydrates it)."""
    try:
        payload = deserialize_value(event.payload)
    except SerializationError:
        payload = event.payload  # stored by another program: hand it over as it is
    return {
        "id": event.id,
        "asset": event.asset_name,
        "uri": event.uri or event.asset_name,
        "extra": dict(event.extra or {}),
        "payload": payload,
        "timestamp": event.timestamp,
        "source": event.source,
        "source_watcher": event.source_watcher,
        "source_dag_id": event.source_dag_id,
        "source_run_id": event.source_run_id,
        "source_task_id": event.source_task_id,
        "source_try_number": event.source_try_number,
        "source_alias": event.source_alias,
        "created_by": event.created_by,
    }


def build_context(
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    try_number: int,
    events: Sequence[EventRow],
    default_deferrable: bool,
    run: Mapping[str, Any] | None = None,
    inlet_events: Mapping[str, Sequence[EventRow]] | None = None,
    map_index: int = -1,
) -> dict[str, Any]:
    """The raw task context the executor sends (keys documented in ``engine.authoring``);
    events in id order. The child hydrates it (``hydrate_context``) into what tasks see."""
    triggering: dict[str, list[dict[str, Any]]] = {}
    for event in sorted(events, key=lambda e: e.id):
        triggering.setdefault(event.asset_name, []).append(event_dict(event))
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "task_id": task_id,
        "try_number": try_number,
        "map_index": map_index,
        "run": {"run_id": run_id, **(run or {})},
        TRIGGERING_ASSET_EVENTS_KEY: triggering,
        "inlet_events": {
            name: [event_dict(e) for e in sorted(rows, key=lambda e: e.id)]
            for name, rows in (inlet_events or {}).items()
        },
        DEFAULT_DEFERRABLE_KEY: default_deferrable,
    }


def with_results(
    spec: TaskSpec,
    results: Mapping[str, Mapping[str, Any]],
    *,
    max_bytes: int | None,
    mapped: Mapping[str, Mapping[str, Any]] | None = None,
) -> TaskSpec:
    """``spec`` carrying the run's results (``{task_id: {key: tagged JSON}}``; ``mapped``:
    those of mapped tasks' copies, ``{task_id: {map_index: {key: tagged JSON}}}``) and the
    size limit of the task's own."""
    text = json.dumps(results, separators=(",", ":")) if results else None
    mapped_text = json.dumps(mapped, separators=(",", ":")) if mapped else None
    return replace(spec, xcoms=text, max_xcom_size_bytes=max_bytes, mapped_xcoms=mapped_text)


def result_size_error(task_id: str, key: str, size: int, limit: int) -> str:
    """Why a result over ``[core] max_xcom_size_bytes`` fails its task."""
    what = "its return value" if key == XCOM_RETURN_KEY else f"its result {key!r}"
    return (
        f"task {task_id!r}: {what} is {size:,} bytes of JSON, over [core] "
        f"max_xcom_size_bytes = {limit:,}; store the data elsewhere (a file, an object store) "
        "and return a reference to it (a path, a URL, an object key), or raise the limit"
    )


def collect_results(
    context: Mapping[str, Any], task: BaseOperator, value: Any, *, max_bytes: int | None
) -> dict[str, Any]:
    """The results a successful task stores (``{key: tagged JSON}``): what it pushed, then
    each key of a dict return value with ``multiple_outputs``, then ``return_value``.

    ``TypeError`` for a value that cannot be stored or a ``multiple_outputs`` result that is
    not a dict with str keys; ``ValueError`` for one over ``max_bytes``.
    """
    ti = context.get("ti")
    results = dict(ti.pushed) if isinstance(ti, RuntimeTaskInstance) else {}
    task_id = task.task_id
    if value is not None and getattr(task, "do_xcom_push", True):
        if getattr(task, "multiple_outputs", False):
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                raise TypeError(
                    f"task {task_id!r} has multiple_outputs=True: it must return a dict with "
                    f"str keys, got {type(value).__name__}"
                    + (f" with keys {list(value)[:5]!r}" if isinstance(value, dict) else "")
                )
            for key, item in value.items():
                results[key] = encode_result(item, task_id=task_id, key=key)
        results[XCOM_RETURN_KEY] = encode_result(value, task_id=task_id, key=XCOM_RETURN_KEY)
    if max_bytes is not None:
        for key, encoded in results.items():
            size = len(json.dumps(encoded, separators=(",", ":")).encode("utf-8"))
            if size > max_bytes:
                raise ValueError(result_size_error(task_id, key, size, max_bytes))
    return results


def check_mappable_result(task: BaseOperator, value: Any) -> None:
    """Raise when a mapped task maps over ``task``'s return value and ``value`` cannot be
    mapped over (the task runner calls it before storing the result, as Airflow does)."""
    dag = task.dag
    if dag is None or isinstance(task, MappedOperator):
        return
    for child_id in task.downstream_task_ids:
        child = dag.task_dict.get(child_id)
        if not isinstance(child, MappedOperator):
            continue
        if not any(s.operator.task_id == task.task_id for s in child.iter_mapped_sources()):
            continue
        if value is None or not getattr(task, "do_xcom_push", True):
            raise XComForMappingNotPushed(task.task_id, for_task=child.task_id)
        if not isinstance(value, list | tuple | dict):
            raise UnmappableXComTypePushed(task.task_id, value, for_task=child.task_id)


def format_seconds(seconds: float) -> str:
    return f"{seconds:.0f}" if float(seconds).is_integer() else f"{seconds:.1f}"


def timeout_message(timeout_s: float, elapsed_s: float, deferrals: int) -> str:
    """The failure reason of a try that ran past its ``execution_timeout``."""
    return (
        f"execution_timeout ({format_seconds(timeout_s)}s) exceeded after {elapsed_s:.1f}s "
        f"across {deferrals} deferral{'' if deferrals == 1 else 's'}"
    )


def remaining_s(try_started_at: datetime, timeout: timedelta | None, now: datetime) -> float:
    """Seconds left before the try's execution deadline (``inf`` without a timeout)."""
    if timeout is None:
        return math.inf
    return (try_started_at + timeout - now).total_seconds()


# --- running the task (child side) -------------------------------------------------------


class _Deadline:
    """Interrupts the main thread with ``TaskExecutionTimeout`` after ``seconds``."""

    def __init__(self, seconds: float, message: Callable[[], str]) -> None:
        self._seconds = seconds
        self._message = message
        self._previous: Any = None
        self.fired = False

    @property
    def expired(self) -> bool:
        return self._seconds <= 0

    def __enter__(self) -> _Deadline:
        if math.isfinite(self._seconds):
            self._previous = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, max(self._seconds, 0.001))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if math.isfinite(self._seconds):
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous or signal.SIG_DFL)

    def _fire(self, _signum: int, _frame: FrameType | None) -> None:
        self.fired = True
        raise TaskExecutionTimeout(self._message())


def _call(task: BaseOperator, spec: TaskSpec, context: dict[str, Any]) -> Any:
    render_template_fields(task, context)  # each step, as Airflow: a resumed task's too
    if spec.next_method is not None:
        kwargs = loads(spec.next_kwargs) if spec.next_kwargs else {}
        if not isinstance(kwargs, dict):
            raise TypeError(f"stored next_kwargs of task {spec.task_id!r} are not a mapping")
        return task.resume_execution(spec.next_method, kwargs, context)
    deferral = task.deferral_at_start()
    if deferral is not None:
        raise deferral
    return run_to_completion(task.execute(context), what=f"task {spec.task_id!r}: execute()")


def _success(results: dict[str, Any], elapsed_s: float) -> TaskResult:
    return TaskResult(
        TaskState.SUCCESS,
        elapsed_s,
        return_value=results.get(XCOM_RETURN_KEY),
        has_return_value=XCOM_RETURN_KEY in results,
        xcoms=results,
    )


def _raw_context(spec: TaskSpec) -> dict[str, Any]:
    raw = loads(spec.context)
    if not isinstance(raw, dict):
        raise TypeError("the task context sent by the executor is not a mapping")
    if spec.xcoms is not None:
        raw["xcoms"] = json.loads(spec.xcoms)
    if spec.mapped_xcoms is not None:
        raw["mapped_xcoms"] = json.loads(spec.mapped_xcoms)
    return raw


def _error_summary(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _load(spec: TaskSpec) -> BaseOperator:
    """The task, from its DAG file; from the file's last good version when it is broken now
    (``engine.executor.last_good``)."""
    from engine.authoring.dag_files import load_task
    from engine.executor.last_good import load_or_last_good

    def load(source: str | None) -> BaseOperator:
        return load_task(
            Path(spec.fileloc),
            spec.dag_id,
            spec.task_id,
            dags_folder=Path(spec.dags_folder) if spec.dags_folder else None,
            plugins_folder=Path(spec.plugins_folder) if spec.plugins_folder else None,
            source=source,
        )

    return load_or_last_good(spec.fileloc, load)


@dataclass(slots=True)
class StepState:
    """What ``run_task`` got to, for the outcome's callbacks (``run_outcome_callbacks``)."""

    task: BaseOperator | None = None
    context: dict[str, Any] | None = None
    exception: BaseException | None = None


def run_task(
    spec: TaskSpec, *, now: datetime | None = None, step: StepState | None = None
) -> TaskResult:
    """Load and run the task described by ``spec``; never raises for the task's errors.

    ``step`` receives the task, its context and the exception that failed it (for the
    callbacks run once the result is reported). ``on_execute_callback`` runs here, before
    the task starts or resumes.
    """
    step = StepState() if step is None else step
    started = time.monotonic()
    try_started = datetime.fromisoformat(spec.try_started_at)
    timeout: timedelta | None = None

    def message() -> str:
        assert timeout is not None
        elapsed = (datetime.now(UTC) - try_started).total_seconds()
        return timeout_message(timeout.total_seconds(), elapsed, spec.deferral_count)

    deadline = _Deadline(math.inf, message)
    try:
        task = step.task = _load(spec)
        timeout = task.execution_timeout
        deadline = _Deadline(remaining_s(try_started, timeout, now or datetime.now(UTC)), message)
        raw = _raw_context(spec)
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
            run_callbacks(
                task_callbacks(task, "on_execute_callback"),
                context,
                what=f"task {task.task_id!r} on_execute_callback",
            )
            with running_with(context):
                value = _call(task, spec, context)
        outlet_events = collect_outlet_events(context, task, value)
        if is_metadata_result(value):
            value = None
        if not is_copy:  # a copy's result is one item of what a task below maps over
            check_mappable_result(task, value)
        results = collect_results(context, task, value, max_bytes=spec.max_xcom_size_bytes)
    except TaskDeferred as deferred:
        return TaskResult(
            TaskState.DEFERRED,
            time.monotonic() - started,
            execution_timeout_s=None if timeout is None else timeout.total_seconds(),
            deferral=Deferral.from_exception(deferred),
        )
    except AirflowSkipException as exc:
        step.exception = exc
        logger.info("Task skipped: %s", exc or "AirflowSkipException", extra={"action": "skip"})
        return TaskResult(TaskState.SKIPPED, time.monotonic() - started, error=_error_summary(exc))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the boundary around user code
        traceback.print_exc()
        step.exception = exc
        error = message() if deadline.fired else _error_summary(exc)
        return TaskResult(
            TaskState.FAILED,
            time.monotonic() - started,
            error=error,
            timed_out=deadline.fired,
            # AirflowFailException, or params the run's conf made invalid: a retry would fail
            # the same way
            no_retry=isinstance(exc, AirflowFailException | ParamValidationError),
        )
    result = _success(results, time.monotonic() - started)
    result.outlet_events.extend(outlet_events)
    result.skip_task_ids.extend(skipped_task_ids(context))
    return result


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


def _exit_when_parent_goes(stream: Any) -> None:
    """Exit at once when the parent closes our stdin (it died, or gave up on us)."""

    def watch() -> None:
        try:
            while stream.read(65536):
                pass
        except (OSError, ValueError):
            pass
        os._exit(EXIT_PARENT_GONE)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _open_channel(fd: int) -> None:
    """Connections and variables come from the parent, over the request channel."""
    from engine.authoring.connections import install_store
    from engine.executor.last_good import use_channel
    from engine.executor.task_channel import TaskChannel

    os.set_inheritable(fd, False)  # not for the processes the task starts
    channel = TaskChannel.from_fd(fd)
    install_store(channel)
    use_channel(channel)  # and the last good version of a DAG file that is broken now


def _configure_logging() -> None:
    from engine.logs import configure_logging

    configure_logging("INFO", "text")


def _redirect_output() -> int:
    """Keep the real stdout for the result (returns its fd); prints go to stderr (the log)."""
    result_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    return result_fd


def _read_spec(ti_id: int) -> TaskSpec | None:
    try:
        spec = TaskSpec.from_json(sys.stdin.buffer.readline())
    except ValueError as exc:
        print(f"engine.executor.task_runner: {exc}", file=sys.stderr)
        return None
    if spec.ti_id != ti_id:
        print(
            f"engine.executor.task_runner: the spec is for task instance {spec.ti_id}",
            file=sys.stderr,
        )
        return None
    return spec


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.executor.task_runner")
    parser.add_argument("--ti-id", type=int, required=True, help="the task instance (for ps)")
    parser.add_argument("--channel-fd", type=int, default=None, help="the request channel")
    args = parser.parse_args(argv)
    if args.channel_fd is not None:
        _open_channel(args.channel_fd)
    result_fd = _redirect_output()
    _configure_logging()
    spec = _read_spec(args.ti_id)
    if spec is None:
        return EXIT_BAD_SPEC
    _exit_when_parent_goes(sys.stdin.buffer)
    step = StepState()
    result = run_task(spec, step=step)
    sys.stdout.flush()
    sys.stderr.flush()
    with os.fdopen(result_fd, "w", encoding="utf-8") as out:
        out.write(result.to_json())  # reported before the callbacks: they cannot change it
    run_outcome_callbacks(spec, result, step)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # threads the task started must not keep the process alive
