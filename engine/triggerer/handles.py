"""What the runner is asked to run (``TriggerSpec``) and what it keeps per task (``TriggerHandle``).

A ``TriggerHandle`` is all the runner keeps of one running trigger: 100,000 idle triggers
hold one each, so it is a class of a few slots, and it is its own task's done callback (no
closure per task). A trigger stopped while it cleans up may be started again at once: the
new handle keeps the stopped one as ``previous``, and its task waits until that one ended,
so there is never more than one live attempt per trigger id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterator, Mapping

    import anyio

    from engine.db.models import TriggerKind
    from triggers.base import BaseTrigger

__all__ = ("TriggerHandle", "TriggerSpec")


@dataclass(frozen=True, slots=True)
class TriggerSpec:
    """A trigger to run: its row id, a built instance, and what it serves."""

    trigger_id: int
    trigger: BaseTrigger
    kind: TriggerKind
    #: What the trigger serves (dag_id/run_id/task_id, or asset/watcher): every line logged
    #: in its task carries these and its trigger_id. None keeps the task's context as is.
    log_fields: Mapping[str, object] | None = None
    #: A watcher's (asset id, watcher name): what its fired events are stored for.
    watcher: tuple[int, str] | None = None


class TriggerHandle:
    """Per-trigger state: one per running task, so kept to a few slots."""

    __slots__ = (
        "cleaning",
        "done",
        "kind",
        "on_end",
        "previous",
        "stopping",
        "task",
        "trigger",
        "trigger_id",
        "watcher",
    )

    def __init__(
        self,
        spec: TriggerSpec,
        previous: TriggerHandle | None,
        on_end: Callable[[TriggerHandle, asyncio.Task[None]], None],
    ) -> None:
        self.trigger_id = spec.trigger_id
        self.watcher = spec.watcher  # (asset id, watcher name) of a watcher trigger
        self.kind = spec.kind
        self.trigger = spec.trigger  # replaced by a fresh instance on a watcher restart
        # Set right after spawning, back to None once the task ended and was accounted for.
        self.task: asyncio.Task[None] | None = None
        self.stopping = False
        self.cleaning = False  # in the shielded end of an attempt: not cancelled there
        # Set when this task ended; only created when a successor has to wait for it.
        self.done: anyio.Event | None = None
        # The stopped task of the same trigger id still cleaning up, if any.
        self.previous = previous
        self.on_end = on_end  # the runner's bookkeeping, one bound method for every handle

    def __call__(self, task: asyncio.Task[None]) -> None:
        """The task's done callback: the handle itself, so no closure per task."""
        self.on_end(self, task)

    def cancel(self) -> None:
        """Stop the task: cancel it now, or (while it cleans up) let it end after that.

        Calling it again cancels again, for a trigger that swallowed the cancellation.
        """
        self.stopping = True
        if not self.cleaning and self.task is not None:
            self.task.cancel()

    def live_chain(self) -> Iterator[TriggerHandle]:
        """This handle and the stopped predecessors it waits for, those not ended yet."""
        handle: TriggerHandle | None = self
        while handle is not None:
            if handle.task is not None:
                yield handle
            handle = handle.previous

    async def wait_for_previous(self) -> None:
        """Wait until every stopped predecessor ended, then forget them."""
        previous = self.previous
        while previous is not None:
            if previous.done is not None:
                await previous.done.wait()
            previous = previous.previous
        self.previous = None

    def __repr__(self) -> str:
        state = "stopping" if self.stopping else "running"
        return f"<TriggerHandle {self.trigger_id} {self.kind.value} {state}>"
