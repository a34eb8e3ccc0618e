"""SQL of "why did this DAG not run?" behind its assets (``engine.views.why``): the
watchers of the assets (trigger row without its kwargs, the owner's job row, the last event
by watcher name), the shared-stream groups of their triggers (members, holders, the live
holders' snapshots: the group lag), and which schedulers and triggerers are alive.

Reads only; returns plain dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from engine.db.models import AssetEvent, AssetWatcher, Job, SharedStreamSnapshot, Trigger
from engine.db.queries.jobs import SCHEDULER_JOB, TRIGGERER_JOB, alive_clause

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    from sqlalchemy.orm import Session


@dataclass(frozen=True, slots=True)
class OwnerFacts:
    id: int
    hostname: str | None
    pid: int | None
    state: str
    latest_heartbeat: datetime


@dataclass(frozen=True, slots=True)
class WatcherFacts:
    asset_id: int
    name: str
    trigger_id: int
    classpath: str
    triggerer_id: int | None
    failure_count: int
    last_error: str | None
    last_failure_at: datetime | None
    stream_digest: str | None
    owner: OwnerFacts | None  # the job row of ``triggerer_id``
    last_event_at: datetime | None = None  # its latest event (by watcher name)
    #: its last failure was an upstream it could not reach: what (``broker_kind``), where
    unreachable_broker: str | None = None
    unreachable_address: str | None = None


def watchers_of(session: Session, asset_ids: Iterable[int]) -> list[WatcherFacts]:
    """The watchers of the assets: trigger row (never its kwargs), owner job, last event."""
    wanted = sorted(set(asset_ids))
    if not wanted:
        return []
    rows = session.execute(
        select(
            AssetWatcher.asset_id,
            AssetWatcher.name,
            Trigger.id,
            Trigger.classpath,
            Trigger.triggerer_id,
            Trigger.failure_count,
            Trigger.last_error,
            Trigger.last_failure_date,
            Trigger.stream_digest,
            Job.id,
            Job.hostname,
            Job.pid,
            Job.state,
            Job.latest_heartbeat,
            Trigger.unreachable_broker,
            Trigger.unreachable_address,
        )
        .join(Trigger, Trigger.id == AssetWatcher.trigger_id)
        .outerjoin(Job, Job.id == Trigger.triggerer_id)
        .where(AssetWatcher.asset_id.in_(wanted))
        .order_by(AssetWatcher.asset_id, AssetWatcher.name)
    ).all()
    out = []
    for row in rows:
        owner = None
        if row[9] is not None:
            owner = OwnerFacts(int(row[9]), row[10] or None, row[11], str(row[12]), row[13])
        out.append(
            WatcherFacts(
                asset_id=int(row[0]),
                name=str(row[1]),
                trigger_id=int(row[2]),
                classpath=str(row[3]),
                triggerer_id=row[4],
                failure_count=int(row[5] or 0),
                last_error=row[6],
                last_failure_at=row[7],
                stream_digest=row[8],
                owner=owner,
                last_event_at=_last_event(session, int(row[0]), str(row[1])),
                unreachable_broker=row[14],
                unreachable_address=row[15],
            )
        )
    return out


def _last_event(session: Session, asset_id: int, watcher: str) -> datetime | None:
    """The time of the watcher's latest event, by its name (events keep it when the
    watcher's trigger row is replaced): newest first on the (asset_id, source_watcher,
    id) index, so a long-silent watcher costs no scan of its asset's other events."""
    return session.execute(
        select(AssetEvent.timestamp)
        .where(AssetEvent.asset_id == asset_id, AssetEvent.source_watcher == watcher)
        .order_by(AssetEvent.id.desc())
        .limit(1)
    ).scalar()


@dataclass(frozen=True, slots=True)
class StreamGroupFacts:
    """The trigger rows of one shared-stream key, and what its owners published of it."""

    digest: str
    trigger_ids: list[int]
    holders: list[int]  # triggerer ids holding rows of the group
    snapshots: list[SharedStreamSnapshot]  # of live holders, by triggerer


def stream_groups(
    session: Session, digests: Iterable[str], *, now: datetime, threshold_s: float
) -> dict[str, StreamGroupFacts]:
    wanted = sorted(set(digests))
    if not wanted:
        return {}
    members: dict[str, list[tuple[int, int | None]]] = {d: [] for d in wanted}
    rows = session.execute(
        select(Trigger.stream_digest, Trigger.id, Trigger.triggerer_id)
        .where(Trigger.stream_digest.in_(wanted))
        .order_by(Trigger.id)
    )
    for digest, trigger_id, owner in rows:
        members[str(digest)].append((int(trigger_id), owner))
    snaps: dict[str, list[SharedStreamSnapshot]] = {d: [] for d in wanted}
    query = (
        select(SharedStreamSnapshot)
        .join(Job, Job.id == SharedStreamSnapshot.triggerer_id)
        .where(SharedStreamSnapshot.stream_digest.in_(wanted), alive_clause(now, threshold_s))
        .order_by(SharedStreamSnapshot.triggerer_id)
    )
    for snap in session.execute(query).scalars():
        snaps[str(snap.stream_digest)].append(snap)
    return {
        d: StreamGroupFacts(
            digest=d,
            trigger_ids=[t for t, _ in members[d]],
            holders=sorted({o for _, o in members[d] if o is not None}),
            snapshots=snaps[d],
        )
        for d in wanted
    }


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """How many schedulers and triggerers are alive, and the live triggerers' room."""

    schedulers_alive: int
    triggerers_alive: int
    triggerer_capacity: int | None  # summed capacity of the live triggerers (None: unknown)
    triggers_held: int  # trigger rows the live triggerers hold


def engine_facts(
    session: Session, *, now: datetime, triggerer_threshold_s: float, scheduler_threshold_s: float
) -> EngineFacts:
    def alive(job_type: str, threshold_s: float) -> list[tuple[int, int | None]]:
        rows = session.execute(
            select(Job.id, Job.capacity).where(
                Job.job_type == job_type, alive_clause(now, threshold_s)
            )
        )
        return [(int(i), c) for i, c in rows]

    schedulers = alive(SCHEDULER_JOB, scheduler_threshold_s)
    triggerers = alive(TRIGGERER_JOB, triggerer_threshold_s)
    capacities = [c for _, c in triggerers]
    held = 0
    if triggerers:
        held = int(
            session.execute(
                select(func.count())
                .select_from(Trigger)
                .where(Trigger.triggerer_id.in_([i for i, _ in triggerers]))
            ).scalar_one()
        )
    return EngineFacts(
        schedulers_alive=len(schedulers),
        triggerers_alive=len(triggerers),
        triggerer_capacity=None if None in capacities else sum(c or 0 for c in capacities),
        triggers_held=held,
    )
