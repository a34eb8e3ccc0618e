"""DAGs as shown: the schedule in words (time schedule and/or asset condition), the next
time run or why there is none, paused / active, tags, and the states of the last runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, TypedDict

from engine.authoring.assets import (
    ASSET_ALIAS_TYPE,
    ASSET_ALL_TYPE,
    ASSET_ANY_TYPE,
    ASSET_NAME_REF_TYPE,
    ASSET_TYPE,
)
from engine.authoring.mapping import describe_mapping
from engine.authoring.partition_timetables import PartitionedAssetTimetable
from engine.authoring.schedules import timetable_from_json
from engine.db.queries import backfills as backfills_sql
from engine.db.queries import browse
from engine.views.common import Page, check_page, iso, page

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from engine.db.models import Dag, DagRun, DagTask, Trigger
    from engine.db.queries.backfills import DagSchedule

#: Runs whose states the DAG list shows (newest first).
LAST_RUN_STATES: Final = 5
#: Runs ``show_dag`` shows (newest first).
LAST_RUNS: Final = 5

#: The keys ``schedule_json`` gives, in order.
SCHEDULE_KEYS: Final = (
    "timetable",
    "timezone",
    "start_date",
    "end_date",
    "catchup",
    "max_active_runs",
    "tags",
    "next_run",
    "next_dagrun",
    "next_dagrun_data_interval",
    "next_dagrun_create_after",
)


class ScheduleBounds(TypedDict):
    """The schedule's fields after its timetable: zone, bounds, limits, tags, next run."""

    timezone: str
    start_date: str | None
    end_date: str | None
    catchup: bool
    max_active_runs: int
    tags: list[str]
    next_run: str  # the next time run's logical date, or why there is none
    next_dagrun: str | None
    next_dagrun_data_interval: list[str | None] | None
    next_dagrun_create_after: str | None


class ScheduleFields(ScheduleBounds):
    """``SCHEDULE_KEYS``: the timetable's summary, then ``ScheduleBounds``."""

    timetable: str | None


class DagItem(ScheduleFields):
    """A DAG of ``list_dags``."""

    dag_id: str
    display_name: str
    description: str | None
    fileloc: str
    paused: bool
    active: bool
    schedule: str  # in words
    asset_condition: Any  # as stored (JSON), None without one
    last_run_states: list[str]  # newest first
    run_counts: dict[str, int]  # runs per state


class TimetableShown(TypedDict):
    summary: str | None
    description: str | None
    serialized: Any


class TaskShown(TypedDict):
    """A task of ``show_dag``."""

    task_id: str
    operator: str
    downstream: list[str]
    retries: int
    start_from_trigger: bool
    outlets: list[str]  # asset names, then ``alias:<name>`` for outlet aliases
    inlets: list[str]
    mapped: str | None  # what it maps over, in words
    role: str | None  # "setup", "teardown" (its failure ignored) or "teardown, fails run"
    edge_labels: dict[str, str]  # downstream task id -> the edge's Label


class WatcherShown(TypedDict):
    """A watcher of an asset the DAG is scheduled on (never its trigger's kwargs)."""

    asset: str
    name: str
    trigger_id: int
    classpath: str
    triggerer_id: int | None
    last_error: str | None


class LastRun(TypedDict):
    run_id: str
    run_type: str
    state: str
    logical_date: str | None
    partition_key: str | None
    queued_at: str
    end_date: str | None


class _Details(TypedDict):
    dag_id: str
    fileloc: str
    description: str | None
    paused: bool
    active: bool
    last_parsed: str | None
    schedule: Any  # the asset condition as stored (JSON), None without one
    assets: list[str]  # the assets the schedule names
    tasks: list[TaskShown]
    watchers: list[WatcherShown]
    last_runs: list[LastRun]  # newest first


class DagDetails(_Details, ScheduleBounds):
    """One DAG of ``show_dag``."""

    timetable: TimetableShown | None
    schedule_text: str
    run_counts: dict[str, int]
    deadline_alerts: list[str]  # ``deadline_text`` of each alert


#: ``DeadlineReference`` names of the stored reference kinds
_REFERENCE_NAMES: Final = {
    "DagRunQueuedAtDeadline": "DAGRUN_QUEUED_AT",
    "DagRunLogicalDateDeadline": "DAGRUN_LOGICAL_DATE",
    "FixedDatetimeDeadline": "FIXED_DATETIME",
    "AverageRuntimeDeadline": "AVERAGE_RUNTIME",
}


def deadline_text(alert: Any) -> str:
    """A stored deadline alert in one line: ``DAGRUN_QUEUED_AT + 0:10:00 -> mod.notify
    (async)``, with its name first when it has one."""
    reference = alert.get("reference") or {}
    kind = str(reference.get("reference_type", "?"))
    where = _REFERENCE_NAMES.get(kind, kind)
    if kind == "FixedDatetimeDeadline":
        where += f"({datetime.fromtimestamp(float(reference['datetime']), tz=UTC).isoformat()})"
    elif kind == "AverageRuntimeDeadline":
        where += f"(max_runs={reference.get('max_runs')}, min_runs={reference.get('min_runs')})"
    seconds = float(alert.get("interval_s") or 0)
    interval = (
        f"+ {timedelta(seconds=seconds)}" if seconds >= 0 else f"- {timedelta(seconds=-seconds)}"
    )
    callback = alert.get("callback") or {}
    name = f"{alert['name']}: " if alert.get("name") else ""
    return f"{name}{where} {interval} -> {callback.get('path')} ({callback.get('kind')})"


def condition_text(data: Any, *, nested: bool = False) -> str:
    """An asset condition's JSON as ``a & (b | alias c)``."""
    kind = data.get("__type") if isinstance(data, dict) else None
    if kind in (ASSET_TYPE, ASSET_NAME_REF_TYPE):
        return str(data["name"])
    if kind == ASSET_ALIAS_TYPE:
        return f"alias {data['name']}"
    if kind in (ASSET_ALL_TYPE, ASSET_ANY_TYPE):
        sep = " & " if kind == ASSET_ALL_TYPE else " | "
        text = sep.join(condition_text(o, nested=True) for o in data.get("objects") or [])
        return f"({text})" if nested else text
    return json.dumps(data, default=str)


def schedule_text(sched: DagSchedule, *, description: str | None = None) -> str:
    """The schedule in one line: the timetable's summary (and description) and/or the asset
    condition ("assets a & b, per partition key" for a PartitionedAssetTimetable: its
    condition, evaluated per key, is the whole schedule)."""
    if _per_partition_key(sched) and sched.asset_condition is not None:
        return f"assets {condition_text(sched.asset_condition)}, per partition key"
    parts = []
    if sched.timetable is not None:
        summary = sched.timetable_summary or "timetable"
        parts.append(summary if description is None else f"{summary} ({description})")
    if sched.asset_condition is not None:
        parts.append(f"assets {condition_text(sched.asset_condition)}")
    return " or ".join(parts) or "None"


def _per_partition_key(sched: DagSchedule) -> bool:
    stored = sched.timetable
    return isinstance(stored, dict) and stored.get("__type") == PartitionedAssetTimetable.json_type


def next_run_text(sched: DagSchedule) -> str:
    """The next time run's logical date, or why there is none."""
    if sched.timetable is None:
        return "none"
    if sched.is_paused:
        return "paused"
    if not sched.next_dagrun_computed:
        return "not computed yet"
    if sched.next_dagrun is None:
        return "none"
    return sched.next_dagrun.isoformat()


def schedule_json(sched: DagSchedule) -> ScheduleFields:
    """The schedule's fields (``SCHEDULE_KEYS``): timetable summary, bounds, limits, tags and
    the next time run."""
    summary = sched.timetable_summary if sched.timetable is not None else None
    return {"timetable": summary, **_schedule_bounds(sched)}


def _schedule_bounds(sched: DagSchedule) -> ScheduleBounds:
    interval = sched.next_dagrun_data_interval
    return {
        "timezone": sched.timezone,
        "start_date": iso(sched.start_date),
        "end_date": iso(sched.end_date),
        "catchup": sched.catchup,
        "max_active_runs": sched.max_active_runs,
        "tags": sched.tags,
        "next_run": next_run_text(sched),
        "next_dagrun": iso(sched.next_dagrun),
        "next_dagrun_data_interval": None if interval is None else [iso(d) for d in interval],
        "next_dagrun_create_after": iso(sched.next_dagrun_create_after),
    }


def timetable_description(sched: DagSchedule) -> str | None:
    """The timetable's sentence; a stored timetable this version cannot read says so (the
    rest of the DAG is still worth showing)."""
    if sched.timetable is None:
        return None
    try:
        return timetable_from_json(sched.timetable).description
    except ValueError as exc:
        return f"unreadable stored timetable: {exc}"


def timetable_json(sched: DagSchedule) -> TimetableShown | None:
    if sched.timetable is None:
        return None
    return {
        "summary": sched.timetable_summary,
        "description": timetable_description(sched),
        "serialized": sched.timetable,
    }


def list_dags(
    session: Session,
    *,
    paused: bool | None = None,
    active: bool | None = None,
    tag: str | None = None,
    search: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> Page[DagItem]:
    """A page of DAGs by id: file, paused / active, ``schedule`` (text) and its fields
    (``SCHEDULE_KEYS``), the ``asset_condition`` JSON, the states of the last runs (newest
    first) and the number of runs per state."""
    check_page(limit, offset)
    dags, total = browse.dag_page(
        session, paused=paused, active=active, tag=tag, search=search, limit=limit, offset=offset
    )
    ids = [d.dag_id for d in dags]
    schedules = backfills_sql.dag_schedules(session, ids)
    runs = browse.run_summaries(session, ids, last=LAST_RUN_STATES)
    items: list[DagItem] = [
        {
            "dag_id": dag.dag_id,
            "display_name": dag.display_name or dag.dag_id,
            "description": dag.description,
            "fileloc": dag.fileloc,
            "paused": dag.is_paused,
            "active": dag.is_active,
            "schedule": schedule_text(schedules[dag.dag_id]),
            "asset_condition": dag.schedule,
            **schedule_json(schedules[dag.dag_id]),
            "last_run_states": runs[dag.dag_id].last_run_states,
            "run_counts": runs[dag.dag_id].run_counts,
        }
        for dag in dags
    ]
    return page(items, total, limit, offset)


def dag_schedule(session: Session, dag_id: str) -> DagSchedule | None:
    """A DAG's schedule columns (what ``dags trigger`` and the date options read)."""
    return backfills_sql.dag_schedules(session, [dag_id]).get(dag_id)


def show_dag(session: Session, dag_id: str) -> DagDetails | None:
    """One DAG as last parsed, None if unknown: file, description, paused / active, when
    parsed, the asset condition (``schedule``) and the assets in it, its tasks, the watchers
    of its assets, its last runs, the schedule's fields (``SCHEDULE_KEYS``) with
    ``timetable`` as {summary, description, serialized}, ``schedule_text``, and its runs
    per state."""
    dag = browse.get_dag(session, dag_id)
    sched = dag_schedule(session, dag_id)
    if dag is None or sched is None:
        return None
    return {
        **_details(session, dag),
        "timetable": timetable_json(sched),
        **_schedule_bounds(sched),
        "schedule_text": schedule_text(sched, description=timetable_description(sched)),
        "run_counts": browse.run_summaries(session, [dag_id], last=0)[dag_id].run_counts,
        "deadline_alerts": [deadline_text(alert) for alert in dag.deadline_alerts or ()],
    }


def _details(session: Session, dag: Dag) -> _Details:
    """One DAG as last parsed: file, schedule, tasks, the watchers of its assets, runs."""
    dag_id = dag.dag_id
    return {
        "dag_id": dag_id,
        "fileloc": dag.fileloc,
        "description": dag.description,
        "paused": dag.is_paused,
        "active": dag.is_active,
        "last_parsed": iso(dag.last_parsed_time),
        "schedule": dag.schedule,
        "assets": browse.schedule_assets(session, dag_id),
        "tasks": [_task(t) for t in browse.dag_tasks(session, dag_id)],
        "watchers": [_watcher(*row) for row in browse.dag_watchers(session, dag_id)],
        "last_runs": [_last_run(r) for r in browse.last_runs(session, dag_id, last=LAST_RUNS)],
    }


def _task(t: DagTask) -> TaskShown:
    return {
        "task_id": t.task_id,
        "operator": t.operator,
        "downstream": list(t.downstream_task_ids or []),
        "retries": t.retries,
        "start_from_trigger": t.start_from_trigger,
        "outlets": [*(t.outlets or []), *(f"alias:{a}" for a in t.outlet_aliases or [])],
        "inlets": list(t.inlets or []),
        "mapped": describe_mapping(t.mapping) if t.mapping else None,
        "role": _role(t),
        "edge_labels": dict(t.edge_labels or {}),
    }


def _role(t: DagTask) -> str | None:
    if t.is_setup:
        return "setup"
    if t.is_teardown:
        return "teardown, fails run" if t.on_failure_fail_dagrun else "teardown"
    return None


def _watcher(asset: str, name: str, trig: Trigger) -> WatcherShown:
    return {
        "asset": asset,
        "name": name,
        "trigger_id": trig.id,
        "classpath": trig.classpath,
        "triggerer_id": trig.triggerer_id,
        "last_error": trig.last_error,
    }


def _last_run(run: DagRun) -> LastRun:
    return {
        "run_id": run.run_id,
        "run_type": run.run_type,
        "state": run.state,
        "logical_date": iso(run.logical_date),
        "partition_key": run.partition_key,
        "queued_at": run.queued_at.isoformat(),
        "end_date": iso(run.end_date),
    }
