"""The triggerer's periodic upkeep of the metadata DB, beside its heartbeat and its claims.

Two loops, each run until cancelled, as ``engine.jobs.heartbeat.heartbeat_forever`` is: one
deletes trigger rows nothing references and the shared-stream snapshots of triggerers that
died (and shared-stream samples past their retention); one replaces this triggerer's
``shared_stream_snapshot`` rows every heartbeat and adds a ``shared_stream_sample`` of each
group, so that ``sluice streams list`` and the API read them from anywhere. A failed write
is logged and retried next round: neither loop ever stops the triggerer.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

import anyio

from engine.db import models
from engine.db.queries import streams
from engine.db.queries import triggers as trigger_rows
from engine.exceptions import SluiceError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from sqlalchemy.orm import Session

    from engine.db.database import Database
    from shared_stream import GroupStats

__all__ = ("clean_forever", "publish_stream_stats_forever")

# The triggerer's own lines: they keep its logger name, which operators (and tests) filter on.
logger = logging.getLogger("engine.triggerer.triggerer")


async def clean_forever(db: Database, *, threshold_s: float, interval_s: float) -> None:
    """Every ``interval_s``: delete unreferenced trigger rows, dead triggerers' snapshots
    (``threshold_s``: the heartbeat age of a dead triggerer) and stream samples past their
    retention."""

    def dead_snapshots(session: Session) -> int:
        # Rows of triggerers that crashed (a clean stop deletes its own rows).
        return streams.delete_dead_stream_snapshots(
            session, threshold_s=threshold_s, now=models.utcnow()
        )

    def old_samples(session: Session) -> int:
        return streams.delete_old_stream_samples(session, now=models.utcnow())

    while True:
        for what, clean in (
            ("Trigger", trigger_rows.delete_unreferenced_triggers),
            ("Shared-stream snapshot", dead_snapshots),
            ("Shared-stream sample", old_samples),
        ):
            try:
                await db.run(clean)
            except SluiceError as exc:
                logger.warning("%s clean-up failed: %s", what, exc, extra={"action": "cleanup"})
        await anyio.sleep(interval_s)


async def publish_stream_stats_forever(
    db: Database,
    stats: Callable[[], Sequence[GroupStats]],
    *,
    job_id: int,
    interval_s: float,
) -> None:
    """Every ``interval_s``, replace the ``shared_stream_snapshot`` rows of ``job_id`` with
    ``stats()`` (an empty list is written once, not again until groups come back)."""
    written_empty = False
    while True:
        current = stats()
        if current or not written_empty:
            publish = partial(
                streams.publish_stream_stats,
                triggerer_id=job_id,
                stats=current,
                now=models.utcnow(),
            )
            try:
                await db.run(publish)
                written_empty = not current
            except SluiceError as exc:
                logger.warning(
                    "Publishing shared-stream stats failed, retrying: %s",
                    exc,
                    extra={"action": "stream_stats_publish_failed", "job_id": job_id},
                )
        await anyio.sleep(interval_s)
