"""SQL of shared-stream snapshots: what each triggerer publishes of its groups (one row per
key and triggerer), read back by ``sluice streams list``, removed with their triggerer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import delete, insert, select

from engine.db.models import (
    Job,
    SharedStreamSnapshot,
)
from engine.db.queries.jobs import age_s, alive_clause
from shared_stream.stats import busiest_lanes, key_label

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session

    from shared_stream import GroupStats


#: The ``GroupStats`` fields stored as they are (``key`` and the lanes are converted).
_SNAPSHOT_FIELDS: Final = (
    "mode",
    "subscribers",
    "queue_high_water",
    "oldest_unresolved_age_s",
    "events_polled",
    "deliveries",
    "advances",
    "advanced_events",
    "last_advance_batch",
    "advance_latency_sum_s",
    "overflows",
    "ack_timeouts",
    "rejects",
)


def publish_stream_stats(
    session: Session, *, triggerer_id: int, stats: Sequence[GroupStats], now: datetime
) -> None:
    """Make this triggerer's rows exactly ``stats``: groups that are gone lose their row.

    Only this triggerer writes its rows, so replacing them in one transaction is an upsert
    that readers never see half done. ``stats`` has one entry per key, as
    ``SharedStreamManager.stats()`` returns it (a draining group and its successor merged).
    """
    delete_stream_snapshots(session, triggerer_id=triggerer_id)
    if not stats:
        return
    rows = [
        {
            **{name: getattr(group, name) for name in _SNAPSHOT_FIELDS},
            "stream_key": key_label(group.key),
            "outstanding_by_lane": lanes_column(group.outstanding_by_lane),
            "stream_digest": group.digest,
            "triggerer_id": triggerer_id,
            "updated_at": now,
        }
        for group in stats
    ]
    session.execute(insert(SharedStreamSnapshot), rows)


def lanes_column(outstanding: dict[str, int]) -> dict[str, int]:
    """The busiest lanes as stored (bounded, as the metric labels are); the other lanes'
    events are summed under one ``"(N other lanes)"`` entry, so the backlog stays whole."""
    busiest = dict(busiest_lanes(outstanding))
    others = len(outstanding) - len(busiest)
    if others:
        rest = sum(outstanding.values()) - sum(busiest.values())
        busiest[f"({others} other lanes)"] = rest
    return busiest


def delete_stream_snapshots(session: Session, *, triggerer_id: int) -> int:
    result = session.execute(
        delete(SharedStreamSnapshot).where(SharedStreamSnapshot.triggerer_id == triggerer_id)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def delete_dead_stream_snapshots(session: Session, *, threshold_s: float, now: datetime) -> int:
    """Delete the rows of triggerers that stopped without deleting them (crashed, killed):
    job not running, or its heartbeat ``threshold_s`` old or more. Returns the rows deleted.

    A triggerer deletes its own rows only on a clean stop, and only ``sluice db clean``
    deletes job rows (long after they died): the triggerers' periodic clean-up calls this.
    """
    live = select(Job.id).where(alive_clause(now, threshold_s))
    result = session.execute(
        delete(SharedStreamSnapshot).where(SharedStreamSnapshot.triggerer_id.not_in(live))
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def list_stream_snapshots(
    session: Session, *, threshold_s: float, now: datetime
) -> list[dict[str, Any]]:
    """Snapshots of live triggerers only (a dead one's rows describe nothing running)."""
    query = (
        select(SharedStreamSnapshot)
        .join(Job, Job.id == SharedStreamSnapshot.triggerer_id)
        .where(alive_clause(now, threshold_s))
        .order_by(SharedStreamSnapshot.triggerer_id, SharedStreamSnapshot.stream_key)
    )
    return [
        {
            "triggerer_id": snap.triggerer_id,
            "key": snap.stream_key,
            "stream_digest": snap.stream_digest,
            "mode": snap.mode,
            "subscribers": snap.subscribers,
            "outstanding_by_lane": snap.outstanding_by_lane,
            "oldest_unresolved_age_s": snap.oldest_unresolved_age_s,
            "queue_high_water": snap.queue_high_water,
            "events_polled": snap.events_polled,
            "deliveries": snap.deliveries,
            "advances": snap.advances,
            "advanced_events": snap.advanced_events,
            "last_advance_batch": snap.last_advance_batch,
            "advance_latency_sum_s": snap.advance_latency_sum_s,
            "overflows": snap.overflows,
            "ack_timeouts": snap.ack_timeouts,
            "rejects": snap.rejects,
            "snapshot_age_s": age_s(now, snap.updated_at),
        }
        for snap in session.execute(query).scalars()
    ]
