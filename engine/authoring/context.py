"""What task code gets when it runs: the task context, as operators and DAG files read it.

The task process builds the context a task sees (``engine.execution.context`` documents
every key); this module is the authoring side of it, what a DAG file and an operator may
use without building on the task process:

- the ``Context`` type and the keys operators read (``default_deferrable``, the
  ``[operators] default_deferrable`` setting read by ``resolve_deferrable`` for sensors and
  operators built with ``deferrable=None``; ``triggering_asset_events``);
- ``get_current_context()``: the task process makes a context current while the task code
  runs (``running_with``), Airflow's way to reach it deep inside a task;
- what operators call on the context's values: ``context["outlet_events"]``
  (``OutletEvents``, for ``Metadata`` a task yields) and ``context["ti"]``
  (``RendersTemplates``, for an operator that renders a template at run time);
- ``as_moment`` (the context's datetimes) and ``run_to_completion`` (user code that is an
  ``async def``).
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from types import ModuleType

    from engine.authoring.assets import Metadata

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


@functools.cache
def _pendulum() -> ModuleType | None:
    try:
        import pendulum  # optional; only a running task pays for it
    except ImportError:  # pragma: no cover - pendulum is an optional extra
        return None
    return pendulum


def as_moment(value: object) -> datetime | None:
    """An aware UTC datetime (pendulum's when installed); naive values are read as UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"expected a datetime, got {value!r}")
    moment = value.replace(tzinfo=UTC) if value.utcoffset() is None else value.astimezone(UTC)
    pendulum = _pendulum()
    if pendulum is None:
        return moment
    converted: datetime = pendulum.instance(moment, tz="UTC")
    return converted


#: the contexts of the task code running now, innermost last (``get_current_context``)
_running: list[dict[str, Any]] = []


@contextmanager
def running_with(context: dict[str, Any]) -> Iterator[None]:
    """Make ``context`` what ``get_current_context()`` returns while the task code runs."""
    _running.append(context)
    try:
        yield
    finally:
        _running.pop()


def get_current_context() -> dict[str, Any]:
    """The running task's context, as Airflow's ``get_current_context()``: for code deep
    inside a task that was not handed the context. Outside a running task it raises."""
    if not _running:
        raise RuntimeError(
            "get_current_context() was called outside a running task: the context exists "
            "only while a task's execute (or a @task function) runs"
        )
    return _running[-1]


class OutletEvents(Protocol):
    """``context["outlet_events"]`` as operator code uses it: apply yielded ``Metadata``."""

    def apply(self, metadata: Metadata) -> None: ...


class RendersTemplates(Protocol):
    """``context["ti"]`` as an operator that renders at run time uses it."""

    def render_template(
        self, value: Any, context: Mapping[str, Any], *, template_ext: Sequence[str] = ()
    ) -> Any: ...


def outlet_events(context: Mapping[str, Any]) -> OutletEvents:
    """The context's ``outlet_events``; a clear error for a context the task process did not
    build (a plain dict)."""
    accessors: OutletEvents | None = context.get("outlet_events")
    if accessors is None:
        raise RuntimeError(
            "the context has no outlet_events: Metadata is applied to the outlets of a task "
            "running in its task process"
        )
    return accessors
