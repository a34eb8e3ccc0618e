"""A missed deadline's callback, in a callback process (``engine.execution.callback_runner``).

The scheduler marked the deadline missed (``engine.scheduler.deadlines``); the executor sent
a ``CallbackSpec`` of kind ``deadline`` holding the alert as stored and the ``context``
Airflow gives a deadline callback: ``{"dag_run": the run's details (dates as ISO 8601
text), "deadline": {"id", "deadline_time"}}``. The callable is the one the DAG file's alert
holds (the DAG file is imported, so a function defined in it is found as it is), else the
one its dotted path imports; it is called with the alert's ``kwargs`` and ``context``, and
an ``async def`` is awaited to completion on an event loop of the process (an
``AsyncCallback`` runs here, not in the triggerer as in Airflow: Sluice runs every callback
in an executor's callback process). Its error is logged; nothing else changes.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from engine.authoring.context import run_to_completion
from engine.execution.loading import dag_for
from engine.execution.protocol import TaskSpec

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.authoring.dag import DAG
    from engine.execution.protocol import CallbackSpec

logger = logging.getLogger(__name__)


def deadline_callable(dag: DAG, index: int, path: str) -> Callable[..., Any]:
    """The callable of the DAG's alert ``index`` when it is still the one ``path`` names (a
    function defined in the DAG file), else what ``path`` imports (``LookupError`` when it
    does not)."""
    alerts = dag.deadline
    if index < len(alerts):
        held = alerts[index].callback.callable
        # the same function, though the module a DAG file is imported as may be named
        # differently here than where the DAG processor parsed it
        if held is not None and path.endswith(f".{held.__qualname__}"):
            return held
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise LookupError(f"deadline callback {path} does not import: {exc}") from exc
    if not callable(found):
        raise LookupError(f"deadline callback {path} is not callable")
    function: Callable[..., Any] = found
    return function


def run_deadline_callback(spec: CallbackSpec) -> list[str]:
    """Call the missed deadline's callback; returns its error (logged), if any.
    ``LookupError`` (or the DAG file's own error) when it cannot be loaded."""
    assert spec.deadline is not None
    dag = dag_for(TaskSpec.from_json(spec.spec))
    alert = spec.deadline["alert"]
    path = str(alert["callback"]["path"])
    function = deadline_callable(dag, int(spec.deadline["alert_index"]), path)
    kwargs = dict(alert["callback"].get("kwargs") or {})
    what = f"DAG {dag.dag_id!r} deadline callback {path}"
    logger.info("Running %s", what, extra={"action": "callback_started", "callback": path})
    try:
        run_to_completion(function(**kwargs, context=spec.deadline["context"]), what=what)
    except Exception as exc:  # the boundary around user code
        logger.exception(
            "%s raised %s", what, type(exc).__name__, extra={"action": "callback_failed"}
        )
        return [f"{path}: {type(exc).__name__}: {exc}"]
    return []
