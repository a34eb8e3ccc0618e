"""What the runner is asked to run (``TriggerSpec``) and what it keeps per task (``TriggerHandle``).

A ``TriggerHandle`` is all the runner keeps of one running trigger: 100,000 idle triggers
hold one each, so it is a class of a few slots, and it is its own task's done callback (no
closure per task). It is also the trigger's log context (``items()``: its trigger id and
what it serves), read only when a line is logged: no dict of fields per trigger. A trigger
that only waits for a moment (``DateTimeTrigger``) has no task while it waits, only a timer
on the loop (``timer``); its task is spawned when the timer is due.

A trigger stopped while it cleans up may be started again at once: the new handle keeps the
stopped one as ``previous``, and its task waits until that one ended, so there is never
more than one live attempt per trigger id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterator, Mapping

    import anyio

    from engine.states import TriggerKind
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
        "log_fields",
        "on_end",
        "previous",
        "stopping",
        "task",
        "timer",
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
        # Set while the trigger waits for its moment without a task (see the runner).
        self.timer: asyncio.TimerHandle | None = None
        self.log_fields = spec.log_fields  # what it serves, for its log lines
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

        Calling it again cancels again, for a trigger that swallowed the cancellation. A
        trigger still waiting on its timer has nothing to cancel but the timer.
        """
        self.stopping = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.cleaning and self.task is not None:
            self.task.cancel()

    @property
    def is_waiting(self) -> bool:
        """Whether it waits on its timer, with no task (stopping it ends it at once)."""
        return self.timer is not None

    def items(self) -> Iterator[tuple[str, object]]:
        """The fields of every line logged in the trigger's task (``engine.logs.LOG_FIELDS``)."""
        yield "trigger_id", self.trigger_id
        if self.log_fields:
            yield from self.log_fields.items()

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
        state = "stopping" if self.stopping else "waiting" if self.timer else "running"
        return f"<TriggerHandle {self.trigger_id} {self.kind.value} {state}>"
