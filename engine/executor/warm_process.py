"""The executor's side of its warm task runner (``engine.executor.warm_runner``), on the
shared machinery of ``engine.warm.service``: keep one running, fork task processes from it,
replace it when it dies.

``WarmRunner.spawn`` sends one step to a standby task process forked ahead: a
``ForkedProcess`` (the task process: its pid, its standard streams, its exit status), or
None when no warm runner is ready or no standby could be had, and the supervisor starts the
step in a cold interpreter instead. The task process is the executor's child, reparented to
it while the fork is in flight, so the warm runner dying does not affect the steps it forked.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from engine.warm import service

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path

    from engine.warm.processes import ForkedProcess

logger = logging.getLogger(__name__)

MODULE: Final = "engine.executor.warm_runner"
LABEL: Final = "warm task runner"


class WarmRunner(service.WarmRunner):
    """Starts and restarts the executor's warm runner; forks task processes from it."""

    def __init__(
        self,
        *,
        environment: Callable[[], Mapping[str, str]],
        dag_folders: Sequence[Path] = (),
    ) -> None:
        super().__init__(
            module=MODULE, label=LABEL, environment=environment, dag_folders=dag_folders
        )

    async def spawn(
        self, *, ti_id: int, env: Mapping[str, str], channel_fd: int
    ) -> ForkedProcess | None:
        """Start the task process of one step in a standby; None when the caller must start
        it cold. OSError when no pipe could be made: the supervisor requeues the step."""
        process = await self.fork({"ti_id": ti_id, "env": dict(env)}, channel_fd)
        if process is None:
            logger.debug("Task instance %s starts cold", ti_id, extra={"action": "warm_fallback"})
        return process
