"""The runs of a DAG on a ``PartitionedAssetTimetable``: one per downstream partition key whose
asset condition is met, from the DAG's queued asset events (the decision is the pure
``engine.authoring.partition_planning.plan_partitioned_runs``; this module carries it out on
``engine.db.queries.runs``' statements, in the scheduler's transaction that holds the DAG).

- each planned run is an asset-triggered run with its ``partition_key``, consuming exactly
  the events mapped to its key. An event is consumed once per key: one that a fan-out maps
  to several keys stays queued while another of its keys waits (an ``&`` waiting for its
  other asset), and a key that already ran on it makes no run while it stays queued (no
  run twice on one event);
- an event the DAG cannot use (no partition key, a key its mapper refuses) is logged once,
  with the reason, and dropped from the DAG's queue: it would never make a run;
- the events of keys not ready yet (a rollup waiting for more of its upstream keys, an
  ``&`` waiting for another asset) stay queued, and are planned again at the next pass.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.authoring.partition_planning import QueuedPartitionEvent, plan_partitioned_runs
from engine.authoring.partition_timetables import PartitionedAssetTimetable
from engine.authoring.schedules import timetable_from_json
from engine.db.queries import asset_queue, runs

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

logger = logging.getLogger(__name__)


def partitioned_timetable(queued: asset_queue.QueuedDag) -> PartitionedAssetTimetable | None:
    """The DAG's ``PartitionedAssetTimetable``, or None for any other schedule (one that
    cannot be read is left to the time-run path, which reports it)."""
    stored = queued.timetable
    if not isinstance(stored, dict) or stored.get("__type") != PartitionedAssetTimetable.json_type:
        return None
    try:
        timetable = timetable_from_json(stored)
    except ValueError as exc:
        logger.error(
            "DAG %s: cannot read its stored partitioned schedule, no runs until its file "
            "changes: %s",
            queued.dag_id,
            exc,
            extra={"action": "timetable_unreadable", "dag_id": queued.dag_id},
        )
        return None
    return timetable if isinstance(timetable, PartitionedAssetTimetable) else None


def create_partitioned_runs(
    session: Session,
    queued: asset_queue.QueuedDag,
    timetable: PartitionedAssetTimetable,
    *,
    now: datetime,
) -> list[int]:
    """Create the runs the DAG's queued events make ready; returns their ids."""
    queue = asset_queue.queued_events(session, queued.dag_id)
    names = dict(queue.events)
    events = [
        QueuedPartitionEvent(event_id, name, queue.partition_keys.get(event_id))
        for event_id, name in queue.events
    ]
    plan = plan_partitioned_runs(timetable, events)
    for refused in plan.refused:
        logger.warning(
            "DAG %s: asset event %d of %s cannot make a partitioned run and is dropped for it: %s",
            queued.dag_id,
            refused.event_id,
            names.get(refused.event_id, "?"),
            refused.reason,
            extra={
                "action": "partition_event_refused",
                "dag_id": queued.dag_id,
                "asset_event_id": refused.event_id,
            },
        )
    asset_queue.dequeue_asset_events(session, queued.dag_id, [r.event_id for r in plan.refused])
    waited_for = {event_id for wait in plan.waiting for event_id in wait.event_ids}
    planned = {event_id for run in plan.runs for event_id in run.event_ids}
    consumed = asset_queue.consumed_by_key(session, queued.dag_id, planned & waited_for)
    created: list[int] = []
    for planned_run in plan.runs:
        key = planned_run.partition_key
        if any((e, key) in consumed for e in planned_run.event_ids):
            # An event kept queued for other keys, which this key has already run on.
            continue
        run_pk = runs.create_run(
            session,
            queued.dag_id,
            run_type=runs.ASSET_TRIGGERED,
            now=now,
            run_after=now,
            asset_event_ids=planned_run.event_ids,
            partition_key=key,
            keep_queued=waited_for,
        )
        if run_pk is not None:
            created.append(run_pk)
    return created
