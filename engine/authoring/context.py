"""What task code gets when it runs: the task context (a dict), the keys of it that operators
read, and how user code that is an ``async def`` runs.

The executor sends plain data and the task process builds the context a task sees
(``engine.execution.context`` documents every key). ``default_deferrable`` is the
``[operators] default_deferrable`` setting, read by ``resolve_deferrable`` for sensors and
operators built with ``deferrable=None``.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Final, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Mapping

Context: TypeAlias = "dict[str, Any]"

DEFAULT_DEFERRABLE_KEY: Final = "default_deferrable"
TRIGGERING_ASSET_EVENTS_KEY: Final = "triggering_asset_events"


def run_to_completion(value: object, *, what: str) -> Any:
    """What a user callable returned, run to completion first if it was an ``async def``.

    Calling an ``async def`` only creates a coroutine: nothing of its body runs until it is
    awaited. As Airflow 3 does, a task runs it to completion in an event loop of its own
    (``asyncio.run`` in the task process), so its exceptions fail the try and its result is
    the task's. Every place the engine calls user code that may be ``async def``
    (``execute``, a ``@task`` / ``python_callable``, a ``next_method``, a sensor's ``poke``)
    passes the result through here. ``what`` names the callable in errors.
    """
    if inspect.iscoroutine(value):
        import asyncio  # only for an async def: the task runner need not import it

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(value)
        value.close()
        raise RuntimeError(
            f"{what} is an async def called where an event loop is already running; it "
            "was not run. Tasks run in a task process without a loop: run it there"
        )
    if inspect.isasyncgen(value):
        raise TypeError(
            f"{what} is an async generator (its body contains yield): it has no result "
            "and was not run; return the value instead of yielding it"
        )
    return value


def resolve_deferrable(op: object, default: bool) -> bool:
    """Whether ``op`` runs deferrable: its own ``deferrable`` unless None, else ``default``.

    ``default`` is ``[operators] default_deferrable``; the executor passes it in the context
    (``default_deferrable_from(context)``).
    """
    own = getattr(op, "deferrable", None)
    return bool(default) if own is None else bool(own)


def default_deferrable_from(context: Mapping[str, Any]) -> bool:
    """``[operators] default_deferrable`` as the executor put it in the context."""
    value = context.get(DEFAULT_DEFERRABLE_KEY, False)
    if not isinstance(value, bool):
        raise TypeError(f"context[{DEFAULT_DEFERRABLE_KEY!r}] must be a bool, got {value!r}")
    return value
