"""What the two executors that claim scheduled task instances share: the local executor
(``local``) and the Celery sender (``celery.sender``). Each claims up to ``parallelism``
tries, counts what it claimed and decided (``ExecutorStats``), can be nudged to claim now
rather than at its next poll, and stops claiming on ``shutdown``.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import anyio

from engine.executor import admission
from engine.executor.settings import ExecutorStats
from engine.metrics.readings import ExecutorReading

if TYPE_CHECKING:
    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.executor.settings import ExecutorSettings
    from engine.metrics.readings import QueueReading


class ClaimingExecutor:
    """The state and controls the local executor and the Celery sender have in common."""

    def __init__(self, *, db: Database, cipher: KwargsCipher, settings: ExecutorSettings) -> None:
        self._db = db
        self._cipher = cipher
        self.settings = settings
        self._pool_warnings = admission.PoolWarnings()
        self.job_id: int | None = None
        self.stats = ExecutorStats()
        self._stopping = anyio.Event()
        self._changed = anyio.Event()  # look for scheduled task instances now

    def nudge(self) -> None:
        """Look for scheduled task instances now rather than at the next poll."""
        self._changed.set()
        self._changed = anyio.Event()

    def shutdown(self) -> None:
        """Stop claiming (what runs or is queued goes on as the executor's docstring says)."""
        self._stopping.set()
        self.nudge()

    def _reading(self, slots_used: int, queues: tuple[QueueReading, ...] = ()) -> ExecutorReading:
        """This executor's figures for the metrics: slots, claims, outcomes, queues."""
        return ExecutorReading(
            job_id=self.job_id,
            slots_used=slots_used,
            slots_total=self.settings.parallelism,
            claimed=self.stats.claimed,
            outcomes=tuple(sorted(self.stats.outcomes.items())),
            queues=queues,
        )


def hostname() -> str:
    """This machine's fully qualified name, as the job rows and task logs show it (blocking:
    call it in a worker thread)."""
    return socket.getfqdn()
