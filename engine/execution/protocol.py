"""The wire protocol between the executor and a task (or callback) process.

The executor starts ``python -P -m engine.execution.task_runner`` (or ``callback_runner``)
and sends one JSON line on its standard input: a ``TaskSpec`` (a ``CallbackSpec`` holding
one). The task process answers with one ``TaskResult`` on its original standard output;
its prints and logging go to standard error, the task log. A process that cannot run what
it was sent exits with one of the ``EXIT_*`` codes (the executor names them in the log).
Connections, variables and the last good version of a DAG file come over a second channel
(``engine.execution.task_channel``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from engine.authoring.callbacks import DAG_CALLBACKS, TASK_CALLBACKS
from engine.authoring.deferral import Deferral
from engine.states import TaskState
from triggers.serde import loads

#: the spec on standard input could not be read
EXIT_BAD_SPEC: Final = 3
#: the executor closed the process's standard input: it is gone, or gave up on the step
EXIT_PARENT_GONE: Final = 4
#: a callback process could not load the DAG file or the task its callbacks belong to
EXIT_NOT_LOADED: Final = 5
#: how a step ends (``TaskResult.outcome``): the task state it reports
STEP_OUTCOMES: Final = frozenset(
    {TaskState.SUCCESS, TaskState.FAILED, TaskState.SKIPPED, TaskState.DEFERRED}
)
#: ``CallbackSpec.kind``: a task's callbacks, or a DAG's
TASK: Final = "task"
DAG_KIND: Final = "dag"
#: ``CallbackSpec.kind`` of a missed deadline's callback (``engine.authoring.deadlines``)
DEADLINE_KIND: Final = "deadline"
DEADLINE_CALLBACK: Final = "deadline_callback"


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
class TaskPrelude:
    """Sent on the child's standard input before its ``TaskSpec``, as soon as the process
    exists: the DAG file and task it will run, so that it imports them while the executor
    marks the try running and reads its context (two cores do both at once). The spec
    follows; the task is loaded afresh when the spec names another one."""

    ti_id: int
    dag_id: str
    task_id: str
    fileloc: str
    dags_folder: str | None = None
    plugins_folder: str | None = None

    def to_json(self) -> str:
        return json.dumps({"prelude": asdict(self)}, separators=(",", ":"))

    @classmethod
    def from_line(cls, text: str | bytes) -> TaskPrelude | None:
        """The prelude ``text`` holds; None when it is something else (the spec itself)."""
        try:
            data = json.loads(text)
            return cls(**data["prelude"])
        except (TypeError, ValueError, KeyError):
            return None

    def names(self, spec: TaskSpec) -> bool:
        """Whether ``spec`` runs the task this prelude loads."""
        return (self.ti_id, self.dag_id, self.task_id, self.fileloc) == (
            spec.ti_id,
            spec.dag_id,
            spec.task_id,
            spec.fileloc,
        ) and (self.dags_folder, self.plugins_folder) == (spec.dags_folder, spec.plugins_folder)


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
    #: on success, the asset events to record: {"asset", "uri", "extra", "alias",
    #: "partition_key"}
    outlet_events: list[dict[str, Any]] = field(default_factory=list)
    #: a failure that must not be retried (``AirflowFailException``, a retry policy's FAIL)
    no_retry: bool = False
    #: a failure the task's retry policy retries after this wait (its ``RETRY`` delay)
    retry_delay_s: float | None = None
    #: why the retry policy decided as it did (``engine.execution.retry_decisions``)
    retry_reason: str | None = None
    #: on success, the task's results to store: {key: tagged JSON} (``return_value`` too)
    xcoms: dict[str, Any] = field(default_factory=dict)
    #: on success, the tasks of the run a branch skips (``engine.authoring.branching``)
    skip_task_ids: list[str] = field(default_factory=list)
    #: a copy of a mapped task that ended: its ``map_index_template`` rendered (None: none)
    rendered_map_index: str | None = None

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


def raw_context(spec: TaskSpec) -> dict[str, Any]:
    """The plain context the executor sent, with the run's results (``hydrate_context``
    turns it into what the task sees)."""
    raw = loads(spec.context)
    if not isinstance(raw, dict):
        raise TypeError("the task context sent by the executor is not a mapping")
    if spec.xcoms is not None:
        raw["xcoms"] = json.loads(spec.xcoms)
    if spec.mapped_xcoms is not None:
        raw["mapped_xcoms"] = json.loads(spec.mapped_xcoms)
    return raw


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
    #: a deadline callback: ``alert_index``, the ``alert`` as stored, and the ``context`` it
    #: is called with (``engine.execution.deadline_callbacks``)
    deadline: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> CallbackSpec:
        """``ValueError`` when ``text`` is not a callback spec."""
        try:
            spec = cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed callback spec: {exc}") from exc
        known = {TASK: TASK_CALLBACKS, DAG_KIND: DAG_CALLBACKS, DEADLINE_KIND: (DEADLINE_CALLBACK,)}
        if spec.callback not in known.get(spec.kind, ()):
            raise ValueError(f"malformed callback spec: {spec.kind} {spec.callback!r}")
        return spec
