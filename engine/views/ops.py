"""The engine's parts as shown: jobs (host, pid, heartbeat, alive?, the tries an executor
runs), the Celery queues (tries queued and running, live workers), triggers and their
owners (never their kwargs), and shared-stream groups (lag per lane, oldest unresolved
event, advance rate, a short history).

Liveness uses the configured health thresholds (``liveness``): ``[triggerer]
health_check_threshold_s`` for triggerers, ``[scheduler] health_check_threshold_s`` for
every other part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.db.queries import celery as celery_sql
from engine.db.queries import inspection
from engine.db.queries import streams as streams_sql
from engine.db.queries.jobs import TRIGGERER_JOB
from engine.views.common import check_page, page

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.config import Config
    from engine.db.models import SharedStreamSample


def liveness(config: Config) -> tuple[inspection.Thresholds, float]:
    """(heartbeat age after which a job is dead, per job type; the default for the rest)."""
    return {TRIGGERER_JOB: config.triggerer.health_check_threshold_s}, (
        config.scheduler.health_check_threshold_s
    )


def list_jobs(
    session: Session,
    *,
    now: datetime,
    config: Config,
    include_ended: bool = False,
    ended_since: datetime | None = None,
    job_type: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> dict[str, Any]:
    """A page of jobs (running ones, those ended since ``ended_since``, or all with
    ``include_ended``), by type then id: host, pid, state, heartbeat age, alive?, load
    (triggers or tasks held), capacity, when it started and ended, a Celery worker's
    queues and, for an executor job, the tries it runs now."""
    check_page(limit, offset)
    thresholds, default = liveness(config)
    rows, total = inspection.job_page(
        session,
        now=now,
        thresholds=thresholds,
        default_threshold_s=default,
        include_ended=include_ended,
        ended_since=ended_since,
        job_type=job_type,
        limit=limit,
        offset=offset,
    )
    return page(rows, total, limit, offset)


def list_queues(session: Session, *, now: datetime, config: Config) -> dict[str, Any]:
    """The Celery queues, by name: tries ``queued`` (sent, no worker started them) and
    ``running`` of the tasks routed to each (what ``sluice_celery_queue_tries`` counts),
    and the live workers that consume it (``workers``, job ids); a queue that only a worker
    consumes shows zeros. ``executor_kind`` says whether tries go through Celery at all."""
    _, threshold_s = liveness(config)
    counts = celery_sql.queue_counts(session, default_queue=config.celery.default_queue)
    consumers = inspection.queue_consumers(session, now=now, threshold_s=threshold_s)
    items = [
        {
            "queue": name,
            "queued": counts.get(name, (0, 0))[0],
            "running": counts.get(name, (0, 0))[1],
            "workers": consumers.get(name, []),
        }
        for name in sorted(set(counts) | set(consumers))
    ]
    return {"executor_kind": config.executor.kind, "items": items}


def list_triggers(
    session: Session,
    *,
    now: datetime,
    config: Config,
    kind: str | None = None,
    triggerer_id: int | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> dict[str, Any]:
    """A page of triggers by id: class path, kind, owner triggerer (host, alive?, claimed
    at), age, what it serves, failures and the last error. Never the kwargs."""
    check_page(limit, offset)
    rows, total = inspection.trigger_page(
        session,
        now=now,
        threshold_s=config.triggerer.health_check_threshold_s,
        kind=kind,
        triggerer_id=triggerer_id,
        limit=limit,
        offset=offset,
    )
    return page(rows, total, limit, offset)


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


def _history(samples: list[SharedStreamSample]) -> list[dict[str, Any]]:
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


def list_stream_groups(
    session: Session,
    *,
    now: datetime,
    config: Config,
    key: str | None = None,
    history: bool = True,
    limit: int | None = None,
    offset: int = 0,
) -> dict[str, Any]:
    """A page of the shared-stream groups of live triggerers (by triggerer, then key): the
    snapshot's fields (mode, subscribers, ``outstanding_by_lane``, oldest unresolved age,
    counters), ``outstanding`` (all lanes), ``advance_rate_per_s`` and, with ``history``,
    the last samples oldest first (for a sparkline)."""
    check_page(limit, offset)
    rows, total = streams_sql.stream_snapshot_page(
        session,
        threshold_s=config.triggerer.health_check_threshold_s,
        now=now,
        key=key,
        limit=limit,
        offset=offset,
    )
    groups = [(r["triggerer_id"], r["key"]) for r in rows]
    samples = streams_sql.stream_samples(session, groups)
    items = []
    for row in rows:
        mine = samples.get((row["triggerer_id"], row["key"]), [])
        item = {
            **row,
            "outstanding": sum(row["outstanding_by_lane"].values()),
            "advance_rate_per_s": advance_rate(mine),
        }
        if history:
            item["history"] = _history(mine)
        items.append(item)
    return page(items, total, limit, offset)
