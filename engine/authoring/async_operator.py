"""``BaseAsyncOperator`` (Airflow 3.2+'s ``airflow.sdk``): an operator whose work is an
``async def aexecute(context)``, run on an event loop in the task process.

Unlike a deferrable operator, which hands its wait to the triggerer and frees its worker
slot, an async operator runs entirely in its task process and holds its slot: it is for
work that is concurrent inside one task (many requests gathered at once), not for long
waits. ``execute`` runs ``aexecute`` to completion on a fresh event loop
(``engine.authoring.context.run_to_completion``): its exceptions fail the try, its result
is the task's, and ``execution_timeout`` interrupts it as it does any task.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from engine.authoring.baseoperator import BaseOperator
from engine.authoring.context import run_to_completion
from engine.authoring.errors import DagDefinitionError

if TYPE_CHECKING:
    from engine.authoring.context import Context

__all__ = ("BaseAsyncOperator",)


class BaseAsyncOperator(BaseOperator):
    """Base of async operators: subclasses implement ``async def aexecute(self, context)``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        aexecute = cls.__dict__.get("aexecute")
        if aexecute is not None and not inspect.iscoroutinefunction(aexecute):
            raise DagDefinitionError(
                f"{cls.__module__}.{cls.__qualname__}.aexecute must be an async def: "
                "BaseAsyncOperator runs it on an event loop"
            )

    @property
    def is_async(self) -> bool:
        return True

    async def aexecute(self, context: Context) -> Any:
        """The task's work, awaited on the task process's event loop."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement async def aexecute(self, context)"
        )

    def execute(self, context: Context) -> Any:
        """Run ``aexecute`` to completion on an event loop of its own."""
        return run_to_completion(self.aexecute(context), what=f"task {self.task_id!r}: aexecute()")
