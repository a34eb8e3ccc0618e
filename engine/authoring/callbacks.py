"""Task and DAG callbacks, and the pool arguments of a task (Airflow's).

A task's ``on_execute_callback``, ``on_success_callback``, ``on_failure_callback``,
``on_retry_callback`` and ``on_skipped_callback``, and a DAG's ``on_success_callback`` /
``on_failure_callback``, are each a callable or a list of callables taking the context.
The task process calls them in order (``engine.execution.callbacks``): an exception is logged
with its traceback and the next callback still runs; a callback never changes the state of
its task or run.

Where they run (``engine.executor``): a task's in the task's own process once the outcome of
the try is known (``on_execute_callback`` before the task starts); when that process could
not (killed at its ``execution_timeout``, crashed), in a fresh child process that imports the
DAG file; a DAG's in such a child when the scheduler ends the run, with ``reason`` in the
context (``"success"`` or ``"task_failure"``, as Airflow). The failure callback's context has
the ``exception``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.errors import DagDefinitionError

if TYPE_CHECKING:
    from collections.abc import Sequence

Callback = Callable[[Any], object]

#: The task callbacks, in the order a try can meet them.
TASK_CALLBACKS: Final = (
    "on_execute_callback",
    "on_success_callback",
    "on_failure_callback",
    "on_retry_callback",
    "on_skipped_callback",
)
DAG_CALLBACKS: Final = ("on_success_callback", "on_failure_callback")
SUCCESS_CALLBACK: Final = "on_success_callback"
FAILURE_CALLBACK: Final = "on_failure_callback"
RETRY_CALLBACK: Final = "on_retry_callback"
SKIPPED_CALLBACK: Final = "on_skipped_callback"
#: ``context["reason"]`` of a DAG callback (Airflow's messages)
DAG_SUCCESS_REASON: Final = "success"
DAG_FAILURE_REASON: Final = "task_failure"
#: The pool of a task that names none (Airflow's); the migration creates it, 128 slots.
DEFAULT_POOL: Final = "default_pool"
#: Airflow's pool names are at most this long.
POOL_NAME_MAX_CHARS: Final = 256


def as_callbacks(where: str, name: str, value: object) -> list[Callback]:
    """A callback argument as a list: None is none, a callable one, a list or tuple each of
    its items (each must be callable)."""
    if value is None:
        return []
    items: Sequence[object] = value if isinstance(value, list | tuple) else [value]
    for item in items:
        if not callable(item):
            raise DagDefinitionError(
                f"{where}: {name} must be a callable or a list of callables, got {item!r}"
            )
    return list(items)  # type: ignore[arg-type]  # each item checked callable above


def check_pool(where: str, pool: object) -> str:
    """A pool name: a non-empty string (whether the pool exists is the executor's concern: a
    task in a missing pool waits in ``scheduled``, as in Airflow)."""
    if not isinstance(pool, str) or not pool.strip():
        raise DagDefinitionError(f"{where}: pool must be a non-empty pool name, got {pool!r}")
    if len(pool) > POOL_NAME_MAX_CHARS:
        raise DagDefinitionError(
            f"{where}: pool name {pool[:20]!r}... is longer than {POOL_NAME_MAX_CHARS} characters"
        )
    return pool


def check_pool_slots(where: str, pool_slots: object) -> int:
    """``pool_slots``: an int of at least 1 (Airflow refuses less)."""
    if isinstance(pool_slots, bool) or not isinstance(pool_slots, int) or pool_slots < 1:
        raise DagDefinitionError(f"{where}: pool_slots must be an int >= 1, got {pool_slots!r}")
    return pool_slots
