"""DAG runs as shown: type, state, dates, the states of their tasks, and the asset events
that triggered them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, TypedDict

from engine.db.queries import browse, lineage
from engine.db.queries import deadlines as deadlines_sql
from engine.db.queries import runs as runs_sql
from engine.views.common import Page, check_page, duration_s, iso, page
from engine.views.tasks import TaskInstanceItem, task_instance_json

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.db.models import DagRun


#: The keys of ``run_json``: what ``sluice runs list --json`` prints of each run.
RUN_KEYS: Final = (
    "run_id",
    "run_type",
    "state",
    "logical_date",
    "data_interval_start",
    "data_interval_end",
    "run_after",
    "backfill_id",
    "partition_key",
    "queued_at",
    "end_date",
    "asset_events",
    "tasks",
)


class RunRow(TypedDict):
    """``RUN_KEYS``: a run's type, state and dates, the asset events that triggered it and
    its tasks' states (a copy of a mapped task named ``task_id[i]``)."""

    run_id: str
    run_type: str
    state: str
    logical_date: str | None
    data_interval_start: str | None
    data_interval_end: str | None
    run_after: str | None
    backfill_id: int | None
    partition_key: str | None  # the slice of its assets it processes (None: unpartitioned)
    queued_at: str
    end_date: str | None
    asset_events: list[int]
    tasks: dict[str, str]


class _RunTimes(TypedDict):
    dag_id: str
    start_date: str | None
    duration_s: float | None  # so far, while running


class RunItem(RunRow, _RunTimes):
    """A run of ``list_runs``."""


class TriggeringEvent(TypedDict):
    id: int
    asset: str
    source: str | None
    timestamp: str
    partition_key: str | None


class DeadlineShown(TypedDict):
    """A run's deadline (``engine.authoring.deadlines``): None ``deadline_time`` when its
    reference has no value for the run; ``missed`` once its callback was requested."""

    name: str | None
    reference: str
    deadline_time: str | None
    missed: bool
    missed_at: str | None
    callback: str


class RunDetails(RunItem):
    """One run of ``show_run``."""

    conf: Any
    triggering_events: list[TriggeringEvent]
    task_instances: list[TaskInstanceItem]
    deadlines: list[DeadlineShown]


def run_json(run: DagRun, *, events: list[int], tasks: dict[str, str]) -> RunRow:
    """One run's row of a list (``RUN_KEYS``)."""
    return {
        "run_id": run.run_id,
        "run_type": run.run_type,
        "state": run.state,
        "logical_date": iso(run.logical_date),
        "data_interval_start": iso(run.data_interval_start),
        "data_interval_end": iso(run.data_interval_end),
        "run_after": iso(run.run_after),
        "backfill_id": run.backfill_id,
        "partition_key": run.partition_key,
        "queued_at": run.queued_at.isoformat(),
        "end_date": iso(run.end_date),
        "asset_events": events,
        "tasks": tasks,
    }


def _details(run: DagRun, now: datetime) -> _RunTimes:
    return {
        "dag_id": run.dag_id,
        "start_date": iso(run.start_date),
        "duration_s": duration_s(run.start_date, run.end_date, now),
    }


def list_runs(
    session: Session,
    *,
    now: datetime,
    dag_id: str | None = None,
    state: str | None = None,
    run_type: str | None = None,
    since: datetime | None = None,
    partition_key: str | None = None,
    newest_first: bool = True,
    limit: int | None = None,
    offset: int = 0,
) -> Page[RunItem]:
    """A page of runs (newest first by default): ``run_json`` fields plus ``dag_id``,
    ``start_date`` and ``duration_s`` (so far, while running); ``partition_key``: the runs
    of that partition only."""
    check_page(limit, offset)
    runs, total = browse.run_page(
        session,
        dag_id=dag_id,
        state=state,
        run_type=run_type,
        since=since,
        partition_key=partition_key,
        newest_first=newest_first,
        limit=limit,
        offset=offset,
    )
    pks = [r.id for r in runs]
    events = runs_sql.run_asset_events(session, pks)
    tasks = browse.run_task_states(session, pks)
    items: list[RunItem] = [
        {
            **run_json(r, events=events.get(r.id, []), tasks=tasks.get(r.id, {})),
            **_details(r, now),
        }
        for r in runs
    ]
    return page(items, total, limit, offset)


def show_run(session: Session, dag_id: str, run_id: str, *, now: datetime) -> RunDetails | None:
    """One run, None if unknown: its list fields, ``conf``, the asset events that triggered
        it (id, asset, source, time), every task instance (``task_instance_json``) and its
    deadlines."""
    run = browse.find_run(session, dag_id, run_id)
    if run is None:
        return None
    events = lineage.run_events(session, run.id)
    tasks = browse.run_task_states(session, [run.id]).get(run.id, {})
    instances, _ = browse.task_instance_page(session, run.id)
    return {
        **run_json(run, events=[e.id for e, _ in events], tasks=tasks),
        **_details(run, now),
        "conf": run.conf,
        "triggering_events": [
            {
                "id": event.id,
                "asset": asset,
                "source": event.source,
                "timestamp": event.timestamp.isoformat(),
                "partition_key": event.partition_key,
            }
            for event, asset in events
        ],
        "task_instances": [
            task_instance_json(ti, operator=op, run_id=run.run_id, now=now) for ti, op in instances
        ],
        "deadlines": [
            {
                "name": d.name,
                "reference": d.reference,
                "deadline_time": iso(d.deadline_time),
                "missed": d.missed,
                "missed_at": iso(d.missed_at),
                "callback": d.callback,
            }
            for d in deadlines_sql.run_deadlines(session, dag_id, run_id)
        ],
    }
