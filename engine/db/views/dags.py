"""DAGs as shown: the schedule in words (time schedule and/or asset condition), the next
time run or why there is none, paused / active, tags, and the states of the last runs."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from engine.authoring.assets import ASSET_ALIAS_TYPE, ASSET_ALL_TYPE, ASSET_ANY_TYPE, ASSET_TYPE
from engine.authoring.schedules import timetable_from_json
from engine.db.queries import backfills as backfills_sql
from engine.db.queries import browse
from engine.db.views.common import check_page, iso, page

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from engine.db.queries.backfills import DagSchedule

#: Runs whose states the DAG list shows (newest first).
LAST_RUN_STATES: Final = 5

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


def condition_text(data: Any, *, nested: bool = False) -> str:
    """An asset condition's JSON as ``a & (b | alias c)``."""
    kind = data.get("__type") if isinstance(data, dict) else None
    if kind == ASSET_TYPE:
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
    condition."""
    parts = []
    if sched.timetable is not None:
        summary = sched.timetable_summary or "timetable"
        parts.append(summary if description is None else f"{summary} ({description})")
    if sched.asset_condition is not None:
        parts.append(f"assets {condition_text(sched.asset_condition)}")
    return " or ".join(parts) or "None"


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


def schedule_json(sched: DagSchedule) -> dict[str, Any]:
    """The schedule's fields (``SCHEDULE_KEYS``): timetable summary, bounds, limits, tags and
    the next time run."""
    interval = sched.next_dagrun_data_interval
    return {
        "timetable": sched.timetable_summary if sched.timetable is not None else None,
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


def timetable_json(sched: DagSchedule) -> dict[str, Any] | None:
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
) -> dict[str, Any]:
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
    items = [
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
            **runs[dag.dag_id],
        }
        for dag in dags
    ]
    return page(items, total, limit, offset)


def dag_schedule(session: Session, dag_id: str) -> DagSchedule | None:
    """A DAG's schedule columns (what ``dags trigger`` and the date options read)."""
    return backfills_sql.dag_schedules(session, [dag_id]).get(dag_id)


def show_dag(session: Session, dag_id: str) -> dict[str, Any] | None:
    """One DAG as last parsed, None if unknown: file, description, paused / active, when
    parsed, the asset condition (``schedule``) and the assets in it, the schedule's fields
    (``SCHEDULE_KEYS``) with ``timetable`` as {summary, description, serialized},
    ``schedule_text``, its tasks, the watchers of its assets, its last runs, and its runs per
    state."""
    details = browse.dag_details(session, dag_id)
    sched = dag_schedule(session, dag_id)
    if details is None or sched is None:
        return None
    counts = browse.run_summaries(session, [dag_id], last=0)[dag_id]["run_counts"]
    return {
        **details,
        **schedule_json(sched),
        "timetable": timetable_json(sched),
        "schedule_text": schedule_text(sched, description=timetable_description(sched)),
        "run_counts": counts,
    }
