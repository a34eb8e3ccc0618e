"""Running task and DAG callbacks in the task (or callback) process.

``run_callbacks`` calls each callback of a kind with the context, in order: an exception is
logged with its traceback and the next callback still runs; a callback never changes the
state of its task or run. ``outcome_callback_kind`` is the callback an outcome of a try
calls (the same rule as the executor's retry decision). What the callbacks are is declared
with the task or DAG (``engine.authoring.callbacks``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from engine.authoring.callbacks import (
    FAILURE_CALLBACK,
    RETRY_CALLBACK,
    SKIPPED_CALLBACK,
    SUCCESS_CALLBACK,
)
from engine.states import TaskState

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from engine.authoring.callbacks import Callback

logger = logging.getLogger(__name__)


def callback_name(callback: object) -> str:
    """How a callback is named in logs: its qualified name."""
    module = getattr(callback, "__module__", None)
    name = getattr(callback, "__qualname__", None) or type(callback).__qualname__
    return f"{module}.{name}" if module else str(name)


def run_callbacks(
    callbacks: Sequence[Callback], context: Mapping[str, Any], *, what: str
) -> list[str]:
    """Call each callback with ``context``; returns the errors (logged, never raised).

    ``what`` names the owner and the callback kind in the log (``task 'x'
    on_failure_callback``).
    """
    errors: list[str] = []
    for callback in callbacks:
        name = callback_name(callback)
        logger.info(
            "Running %s %s", what, name, extra={"action": "callback_started", "callback": name}
        )
        try:
            callback(context)
        except Exception as exc:  # the boundary around user code
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            logger.exception(
                "%s %s raised %s; the state stays as it is",
                what,
                name,
                type(exc).__name__,
                extra={"action": "callback_failed", "callback": name},
            )
    return errors


def task_callbacks(task: object, kind: str) -> list[Callback]:
    """The task's callbacks of ``kind`` (one of ``TASK_CALLBACKS``; none for an object that
    has no such attribute)."""
    value = getattr(task, kind, None)
    return list(value) if isinstance(value, list | tuple) else []


def dag_callbacks(dag: object, kind: str) -> list[Callback]:
    """The DAG's callbacks of ``kind`` (``on_success_callback`` or ``on_failure_callback``)."""
    return task_callbacks(dag, kind)


def outcome_callback_kind(
    outcome: str, *, no_retry: bool, try_number: int, max_tries: int | None
) -> str | None:
    """The task callback an outcome of a try calls: ``success`` / ``skipped`` / ``failed``
    (``on_retry_callback`` while tries remain and the failure allows a retry, as the
    executor decides; else ``on_failure_callback``); None for a deferral."""
    if outcome == TaskState.SUCCESS:
        return SUCCESS_CALLBACK
    if outcome == TaskState.SKIPPED:
        return SKIPPED_CALLBACK
    if outcome != TaskState.FAILED:
        return None
    retried = not no_retry and max_tries is not None and try_number <= max_tries
    return RETRY_CALLBACK if retried else FAILURE_CALLBACK
