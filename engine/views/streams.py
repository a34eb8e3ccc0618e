"""Shared-stream groups as shown: what the live triggerers published of each (the broker
it reads, mode, subscribers, outstanding events per lane and in all, the oldest unresolved
event, counters, the snapshot's age), the advance rate, and a short history for a
sparkline."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from engine.db.queries import streams as streams_sql
from engine.db.queries.jobs import age_s
from engine.views.common import Page, check_page, page

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.config import Config
    from engine.db.models import SharedStreamSample, SharedStreamSnapshot


class StreamSnapshot(TypedDict):
    """What one triggerer published of one group (its lag, as its owner sees it)."""

    triggerer_id: int
    key: str
    stream_digest: str | None
    broker: str  # what the group reads: "kafka", "sqs", ... or the trigger class's name
    mode: str  # fast or ack
    subscribers: int
    outstanding_by_lane: dict[str, int]  # events not advanced, per lane (the busiest)
    lanes: int  # lanes with events not advanced (all of them, not only those named)
    oldest_unresolved_age_s: float | None
    queue_high_water: int
    events_polled: int
    deliveries: int
    advances: int
    advanced_events: int
    last_advance_batch: int
    advance_latency_sum_s: float
    overflows: int
    ack_timeouts: int
    rejects: int
    dead_lettered: int  # events advanced with a rejected outcome (the dead-letter way)
    snapshot_age_s: float | None


class StreamSample(TypedDict):
    at: str
    triggerer_id: int
    outstanding: int
    oldest_unresolved_age_s: float | None
    advanced_events: int


class StreamGroup(StreamSnapshot):
    """A group of ``list_stream_groups``."""

    outstanding: int  # events not advanced, all lanes
    advance_rate_per_s: float | None  # events advanced per second lately
    history: list[StreamSample] | None  # the last samples, oldest first (None: not asked)


def list_stream_groups(
    session: Session,
    *,
    now: datetime,
    config: Config,
    key: str | None = None,
    history: bool = True,
    limit: int | None = None,
    offset: int = 0,
) -> Page[StreamGroup]:
    """A page of the shared-stream groups of live triggerers (by triggerer, then key): the
    snapshot's fields (broker, mode, subscribers, lanes, ``outstanding_by_lane``, oldest
    unresolved age, counters, dead-lettered among them), ``outstanding`` (all lanes),
    ``advance_rate_per_s`` and, with ``history``, the last samples oldest first (for a
    sparkline)."""
    check_page(limit, offset)
    rows, total = snapshot_page(
        session,
        threshold_s=config.triggerer.health_check_threshold_s,
        now=now,
        key=key,
        limit=limit,
        offset=offset,
    )
    groups = [(r["triggerer_id"], r["key"]) for r in rows]
    samples = streams_sql.stream_samples(session, groups)
    items: list[StreamGroup] = []
    for row in rows:
        mine = samples.get((row["triggerer_id"], row["key"]), [])
        items.append(
            {
                **row,
                "outstanding": sum(row["outstanding_by_lane"].values()),
                "advance_rate_per_s": advance_rate(mine),
                "history": _history(mine) if history else None,
            }
        )
    return page(items, total, limit, offset)


def snapshot_page(
    session: Session,
    *,
    threshold_s: float,
    now: datetime,
    key: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[StreamSnapshot], int]:
    """A page of the snapshots of triggerers alive within ``threshold_s`` (by triggerer,
    then key; ``key``: only that group's), and their total."""
    found, total = streams_sql.stream_snapshot_page(
        session, threshold_s=threshold_s, now=now, key=key, limit=limit, offset=offset
    )
    return [_snapshot(snap, now) for snap in found], total


def _snapshot(snap: SharedStreamSnapshot, now: datetime) -> StreamSnapshot:
    return {
        "triggerer_id": snap.triggerer_id,
        "key": snap.stream_key,
        "stream_digest": snap.stream_digest,
        "broker": snap.broker,
        "mode": snap.mode,
        "subscribers": snap.subscribers,
        "outstanding_by_lane": snap.outstanding_by_lane,
        "lanes": snap.lanes,
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
        "dead_lettered": snap.dead_lettered,
        "snapshot_age_s": age_s(now, snap.updated_at),
    }


def advance_rate(samples: list[SharedStreamSample]) -> float | None:
    """Events advanced per second over the newest run of samples of one triggerer (the
    counters restart when a group moves); None with fewer than two such samples."""
    if len(samples) < 2:
        return None
    newest = samples[-1]
    first = newest
    for sample in reversed(samples[:-1]):
        if (
            sample.triggerer_id != newest.triggerer_id
            or sample.advanced_events > first.advanced_events
        ):
            break
        first = sample
    elapsed = (newest.sampled_at - first.sampled_at).total_seconds()
    if first is newest or elapsed <= 0:
        return None
    return round((newest.advanced_events - first.advanced_events) / elapsed, 3)


def _history(samples: list[SharedStreamSample]) -> list[StreamSample]:
    return [
        {
            "at": s.sampled_at.isoformat(),
            "triggerer_id": s.triggerer_id,
            "outstanding": s.outstanding,
            "oldest_unresolved_age_s": s.oldest_unresolved_age_s,
            "advanced_events": s.advanced_events,
        }
        for s in samples
    ]
