"""SQL of shared-stream snapshots: what each triggerer publishes of its groups (one row per
key and triggerer), read back for ``sluice streams list`` (``engine.views.streams``),
removed with their triggerer; and their samples, a short history per key (the last
``SAMPLES_KEPT``, none older than ``SAMPLE_RETENTION_S``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import delete, func, insert, select

from engine.db.models import (
    Job,
    SharedStreamSample,
    SharedStreamSnapshot,
)
from engine.db.queries.browse import fetch_page
from engine.db.queries.jobs import alive_clause
from shared_stream.stats import busiest_lanes, key_label

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session

    from shared_stream import GroupStats


#: Samples kept per shared-stream key (one per triggerer heartbeat: minutes of history).
SAMPLES_KEPT: Final = 60

#: Samples older than this go whatever their number (keys that no longer exist).
SAMPLE_RETENTION_S: Final = 3600.0


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
    "dead_lettered",
    "broker",
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
            "lanes": len(group.outstanding_by_lane),
            "stream_digest": group.digest,
            "triggerer_id": triggerer_id,
            "updated_at": now,
        }
        for group in stats
    ]
    session.execute(insert(SharedStreamSnapshot), rows)
    add_stream_samples(session, rows)


def add_stream_samples(session: Session, snapshots: Sequence[dict[str, Any]]) -> None:
    """Add a sample of each published snapshot row and keep the last ``SAMPLES_KEPT`` of
    each group (triggerer and key)."""
    samples = [
        {
            "triggerer_id": row["triggerer_id"],
            "stream_key": row["stream_key"],
            "sampled_at": row["updated_at"],
            "outstanding": sum(row["outstanding_by_lane"].values()),
            "oldest_unresolved_age_s": row["oldest_unresolved_age_s"],
            "events_polled": row["events_polled"],
            "advances": row["advances"],
            "advanced_events": row["advanced_events"],
        }
        for row in snapshots
    ]
    session.execute(insert(SharedStreamSample), samples)
    groups: dict[int, set[str]] = {}
    for sample in samples:
        groups.setdefault(sample["triggerer_id"], set()).add(sample["stream_key"])
    for triggerer_id, keys in groups.items():
        rank = (
            func.row_number()
            .over(
                partition_by=(SharedStreamSample.triggerer_id, SharedStreamSample.stream_key),
                order_by=SharedStreamSample.id.desc(),
            )
            .label("rank")
        )
        ranked = (
            select(SharedStreamSample.id, rank)
            .where(
                SharedStreamSample.triggerer_id == triggerer_id,
                SharedStreamSample.stream_key.in_(sorted(keys)),
            )
            .subquery()
        )
        old = select(ranked.c.id).where(ranked.c.rank > SAMPLES_KEPT)
        session.execute(delete(SharedStreamSample).where(SharedStreamSample.id.in_(old)))


def delete_old_stream_samples(session: Session, *, now: datetime) -> int:
    """Delete samples older than ``SAMPLE_RETENTION_S``; returns how many."""
    cutoff = now - timedelta(seconds=SAMPLE_RETENTION_S)
    result = session.execute(
        delete(SharedStreamSample).where(SharedStreamSample.sampled_at < cutoff)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def stream_samples(
    session: Session, groups: Iterable[tuple[int, str]]
) -> dict[tuple[int, str], list[SharedStreamSample]]:
    """(triggerer id, key) -> the samples of that group, oldest first."""
    wanted = set(groups)
    if not wanted:
        return {}
    rows = session.execute(
        select(SharedStreamSample)
        .where(
            SharedStreamSample.triggerer_id.in_(sorted({t for t, _ in wanted})),
            SharedStreamSample.stream_key.in_(sorted({k for _, k in wanted})),
        )
        .order_by(SharedStreamSample.id)
    ).scalars()
    out: dict[tuple[int, str], list[SharedStreamSample]] = {}
    for sample in rows:
        group = (sample.triggerer_id, sample.stream_key)
        if group in wanted:
            out.setdefault(group, []).append(sample)
    return out


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


def stream_snapshot_page(
    session: Session,
    *,
    threshold_s: float,
    now: datetime,
    key: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[SharedStreamSnapshot], int]:
    """A page of the snapshots of live triggerers only (a dead one's rows describe nothing
    running), by triggerer then key, and their total; ``key``: only that group's."""
    query = (
        select(SharedStreamSnapshot)
        .join(Job, Job.id == SharedStreamSnapshot.triggerer_id)
        .where(alive_clause(now, threshold_s))
        .order_by(SharedStreamSnapshot.triggerer_id, SharedStreamSnapshot.stream_key)
    )
    if key is not None:
        query = query.where(SharedStreamSnapshot.stream_key == key)
    rows, total = fetch_page(session, query, limit=limit, offset=offset)
    return [row[0] for row in rows], total
