"""Pure decisions of the executor: what a finished task step means for its task instance.

No I/O and no clock (``now`` is an argument): the executor (``engine.executor``) feeds in
what happened to the child process, writes what comes out; and the header / closing lines
of the task log. (The ``TaskSpec`` sent to the child is built by
``engine.executor.task_specs``.)

A failed try with tries left is ``up_for_retry`` until ``retry_at`` (the rule of
``engine.task_retries``, which the scheduler shares for a try whose executor died:
Airflow's ``retry_delay`` / ``retry_exponential_backoff`` / ``max_retry_delay``); it holds
no executor slot meanwhile, and the scheduler makes it ``scheduled`` again once that time
has passed (``engine.db.queries.runs.release_due_retries``). The task's ``retry_policy``
answered in the task process (``engine.execution.retry_decisions``): its ``FAIL`` arrives
as ``no_retry``, its ``RETRY`` delay as ``retry_delay_s``, the wait before that retry in
place of the task's rule; tries are still counted by ``retries``.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.deferral import FAIL_METHOD
from engine.db.queries.deferrals import deferral_deadline
from engine.execution.deadline import timeout_message
from engine.execution.protocol import TaskResult
from engine.states import TaskState
from engine.task_retries import next_try_at
from triggers.exceptions import SerializationError
from triggers.serde import loads

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.authoring.deferral import Deferral
    from engine.db.queries.tasks import TaskRun


ERROR_IN_HEADER_MAX_CHARS: Final = 500


class Decision(enum.StrEnum):
    SUCCEED = "succeeded"
    SKIP = "skipped"  # the task raised AirflowSkipException
    FAIL = "failed"
    RETRY = "up_for_retry"
    DEFER = "deferred"
    REQUEUE = "requeued"  # interrupted by the shutdown: the same step runs again


@dataclass(frozen=True, slots=True)
class Outcome:
    decision: Decision
    elapsed_s: float = 0.0
    reason: str | None = None
    xcoms: dict[str, Any] | None = None
    deferral: Deferral | None = None
    trigger_timeout: datetime | None = None
    outlet_events: tuple[dict[str, Any], ...] = ()
    retry_at: datetime | None = None  # RETRY: when the next try may start
    retry_wait_s: float = 0.0  # RETRY: how long after the failure that is
    skip_task_ids: tuple[str, ...] = ()  # SUCCEED: tasks of the run a branch skips
    #: a copy of a mapped task: its ``map_index_template`` rendered (stored with the copy)
    rendered_map_index: str | None = None

    def redacted(self, redact: Callable[[str], str]) -> Outcome:
        """This outcome with its ``reason`` (the task's error text) passed through
        ``redact``: the reason leaves the task log (the engine's log, callback requests)."""
        if self.reason is None:
            return self
        return replace(self, reason=redact(self.reason))

    def describe(self) -> str:
        if self.decision is Decision.SUCCEED:
            text = "task succeeded"
            if self.outlet_events:
                names = sorted({str(e["asset"]) for e in self.outlet_events})
                text += f"; asset events for {', '.join(names)}"
            if self.skip_task_ids:
                text += f"; skipping {', '.join(self.skip_task_ids)}"
            return text
        if self.decision is Decision.SKIP:
            return f"task skipped: {self.reason}"
        if self.decision is Decision.FAIL:
            return f"task failed: {self.reason}"
        if self.decision is Decision.RETRY:
            assert self.retry_at is not None
            return (
                f"task failed: {self.reason}; it will be retried at {_stamp(self.retry_at)} "
                f"(in {_duration(self.retry_wait_s)})"
            )
        if self.decision is Decision.DEFER:
            assert self.deferral is not None
            until = (
                "" if self.trigger_timeout is None else f" (times out at {self.trigger_timeout})"
            )
            return (
                f"task deferred to {self.deferral.described}, resuming at "
                f"{self.deferral.method_name}(){until}"
            )
        return "task interrupted by the executor shutting down; it will run again"


def exit_reason(returncode: int | None) -> str:
    """Why a child that reported no outcome is considered failed."""
    if returncode is None:
        return "task process did not report an outcome"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"task process exited with code {returncode} (signal {name})"
    return f"task process exited with code {returncode} without reporting an outcome"


def read_result(out: bytes) -> tuple[TaskResult | None, str | None]:
    """The child's result, or None with the problem (None too when it wrote nothing)."""
    if not out.strip():
        return None, None
    try:
        return TaskResult.from_json(out), None
    except ValueError as exc:
        return None, f"unreadable task result: {exc}"


def _retry_or_fail(
    run: TaskRun,
    elapsed_s: float,
    reason: str | None,
    now: datetime,
    *,
    delay_override_s: float | None = None,
) -> Outcome:
    """A failed try: retried after its delay while tries remain, else failed. A retry
    policy's delay (``delay_override_s``) replaces the task's rule for this retry."""
    retry = next_try_at(
        dag_id=run.dag_id,
        task_id=run.task_id,
        run_id=run.run_id,
        try_number=run.try_number,
        max_tries=run.max_tries,
        delay_s=run.retry_delay_s if delay_override_s is None else delay_override_s,
        exponential_backoff=run.retry_exponential_backoff and delay_override_s is None,
        max_delay_s=run.max_retry_delay_s if delay_override_s is None else None,
        now=now,
    )
    if retry is None:
        return Outcome(Decision.FAIL, elapsed_s, reason=reason)
    retry_at, wait_s = retry
    return Outcome(Decision.RETRY, elapsed_s, reason=reason, retry_at=retry_at, retry_wait_s=wait_s)


def decide_outcome(
    result: TaskResult | None,
    run: TaskRun,
    *,
    returncode: int | None,
    interrupted: bool,
    killed_for_timeout: bool,
    wall_s: float,
    now: datetime,
) -> Outcome:
    """What the step's end means: a reported result wins over how the process ended."""
    if result is not None:
        outcome = _reported_outcome(result, run, now)
        if result.rendered_map_index is None:
            return outcome
        return replace(outcome, rendered_map_index=result.rendered_map_index)
    if interrupted:
        return Outcome(Decision.REQUEUE, wall_s)
    if killed_for_timeout and run.execution_timeout_s is not None:
        elapsed = (now - run.try_started_at).total_seconds()
        reason = (
            f"{timeout_message(run.execution_timeout_s, elapsed, run.deferral_count)}; the task "
            "did not stop when interrupted and its process was killed"
        )
        return _retry_or_fail(run, wall_s, reason, now)
    return _retry_or_fail(run, wall_s, exit_reason(returncode), now)


def _reported_outcome(result: TaskResult, run: TaskRun, now: datetime) -> Outcome:
    """What the result the task reported means."""
    if result.outcome == TaskState.SUCCESS:
        xcoms = {"return_value": result.return_value} if result.has_return_value else None
        return Outcome(
            Decision.SUCCEED,
            result.elapsed_s,
            xcoms=xcoms,
            outlet_events=tuple(result.outlet_events),
            skip_task_ids=tuple(result.skip_task_ids),
        )
    if result.outcome == TaskState.SKIPPED:
        return Outcome(Decision.SKIP, result.elapsed_s, reason=result.error)
    if result.outcome == TaskState.DEFERRED:
        assert result.deferral is not None
        timeout_s = result.execution_timeout_s
        if timeout_s is None:
            timeout_s = run.execution_timeout_s
        deadline = deferral_deadline(now, result.deferral.timeout_s, run.try_started_at, timeout_s)
        return Outcome(
            Decision.DEFER, result.elapsed_s, deferral=result.deferral, trigger_timeout=deadline
        )
    reason = _with_policy_reason(result.error, result.retry_reason)
    if result.no_retry:  # AirflowFailException, a retry policy's FAIL: fail now
        return Outcome(Decision.FAIL, result.elapsed_s, reason=reason)
    return _retry_or_fail(run, result.elapsed_s, reason, now, delay_override_s=result.retry_delay_s)


def _with_policy_reason(error: str | None, policy_reason: str | None) -> str | None:
    """The try's error, followed by what its retry policy said about it."""
    if policy_reason is None:
        return error
    return f"{error or 'failed'} (retry policy: {policy_reason})"


def kill_after_s(run: TaskRun, *, now: datetime, grace_s: float) -> float | None:
    """Seconds until the executor kills the child: ``grace_s`` past the execution deadline
    (never sooner than ``grace_s`` from now, so a late child can still report its timeout)."""
    if run.execution_timeout_s is None:
        return None
    elapsed = (now - run.try_started_at).total_seconds()
    return max(run.execution_timeout_s - elapsed + grace_s, grace_s)


def _stamp(now: datetime) -> str:
    return now.isoformat(timespec="milliseconds")


def _duration(seconds: float) -> str:
    """``30s``, ``0.5s``; a minute or more as ``0:05:00``, ``1 day, 0:00:00``."""
    if seconds < 60:
        return f"{seconds:g}s"
    return str(timedelta(seconds=round(seconds)))


def _deferral_error(next_kwargs: str | None) -> str:
    """The ``error`` a failed deferral left in ``next_kwargs`` (e.g. "trigger timeout")."""
    try:
        kwargs = loads(next_kwargs) if next_kwargs else {}
    except SerializationError:
        kwargs = {}
    error = kwargs.get("error") if isinstance(kwargs, dict) else None
    return str(error or "unknown error")[:ERROR_IN_HEADER_MAX_CHARS]


def header_line(run: TaskRun, *, pid: int, hostname: str, now: datetime) -> str:
    """The log line written each time a step of the try starts."""
    if run.next_method is None:
        step = "starting"
    elif run.next_method == FAIL_METHOD:
        step = f"resuming to fail: its deferral ended with {_deferral_error(run.next_kwargs)!r}"
    else:
        step = f"resuming at {run.next_method}() after {run.deferral_count} deferral(s)"
    return (
        f"=== {_stamp(now)} {run.dag_id}.{run.task_id}{_copy(run.map_index)} run {run.run_id} try "
        f"{run.try_number} of {run.max_tries + 1}: {step} on {hostname} (pid {pid}) ===\n"
    )


def _copy(map_index: int) -> str:
    """`` [map_index 3]`` for a copy of a mapped task, nothing otherwise."""
    return f" [map_index {map_index}]" if map_index >= 0 else ""


def outcome_line(outcome: Outcome, run: TaskRun, *, now: datetime) -> str:
    """The log line written when a step ends."""
    return f"=== {_stamp(now)} try {run.try_number}: {outcome.describe()} ===\n"
