"""Keeping a job row alive: heartbeat every ``interval_s`` until cancelled; a failed
heartbeat is logged and retried, never fatal.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import anyio

from engine.db.queries import jobs
from engine.exceptions import DatabaseError

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.db.database import Database

logger = logging.getLogger(__name__)


async def heartbeat_forever(
    db: Database,
    job_id: int,
    *,
    interval_s: float,
    part: str,
    on_beat: Callable[[float], None] | None = None,
    on_lost: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Refresh ``job_id``'s heartbeat every ``interval_s`` until cancelled.

    A failed write is logged and retried at the next beat; a job row that is no longer
    ``running`` (ended by an operator, or considered dead) is reported: others may take
    over this part's work. ``on_beat(sent_at)``: a beat sent at ``sent_at`` (read from
    ``clock``) found the row running; ``on_lost()``: a beat found it no longer running.
    """
    while True:
        await anyio.sleep(interval_s)
        sent_at = clock()
        try:
            alive = await db.run(lambda s: jobs.heartbeat(s, job_id))
        except DatabaseError as exc:
            logger.warning(
                "%s heartbeat failed: %s",
                part,
                exc,
                extra={"action": "heartbeat_failed", "part": part},
            )
            continue
        if alive:
            if on_beat is not None:
                on_beat(sent_at)
            continue
        logger.error(
            "%s job %s is no longer marked running; another process may take over its work",
            part,
            job_id,
            extra={"action": "heartbeat_lost", "job_id": job_id},
        )
        if on_lost is not None:
            on_lost()
