"""SQL of what a task's (or callback's) context reads of its run: the run as the context shows
it (``dag_run``), the asset events that triggered it, the results of its succeeded tasks;
and the results one task instance stored, as ``sluice tasks result`` shows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import bindparam, select

from engine.db.database import read_rows
from engine.db.models import Asset, AssetEvent, DagRun, DagRunAssetEvent, TaskInstance
from engine.db.queries.assets import EventRow
from engine.states import TaskState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def context_run(dag_run: DagRun) -> dict[str, Any]:
    """The run as a task's context shows it (``dag_run``): ids, type, dates, conf, partition
    key."""
    return {
        "run_id": dag_run.run_id,
        "run_type": dag_run.run_type,
        "logical_date": dag_run.logical_date,
        "data_interval_start": dag_run.data_interval_start,
        "data_interval_end": dag_run.data_interval_end,
        "run_after": dag_run.run_after,
        "conf": dag_run.conf,
        "queued_at": dag_run.queued_at,
        "start_date": dag_run.start_date,
        "partition_key": dag_run.partition_key,
    }


def event_row(event: AssetEvent, asset_name: str, uri: str | None = None) -> EventRow:
    """An asset event as a task's context shows it."""
    return EventRow(
        id=event.id,
        asset_name=asset_name,
        payload=event.payload,
        timestamp=event.timestamp,
        source_watcher=event.source_watcher,
        uri=uri,
        extra=event.extra,
        source=event.source,
        source_dag_id=event.source_dag_id,
        source_run_id=event.source_run_id,
        source_task_id=event.source_task_id,
        source_try_number=event.source_try_number,
        source_alias=event.source_alias,
        created_by=event.created_by,
        partition_key=event.partition_key,
    )


#: The columns of an ``EventRow``, in its field order: read as plain rows, not ORM objects (a
#: run of a busy watcher has thousands of events; an identity-mapped instance apiece cost
#: more than reading them).
_EVENT_ROW_COLUMNS: Final = (
    AssetEvent.id,
    Asset.name,
    AssetEvent.payload,
    AssetEvent.timestamp,
    AssetEvent.source_watcher,
    Asset.uri,
    AssetEvent.extra,
    AssetEvent.source,
    AssetEvent.source_dag_id,
    AssetEvent.source_run_id,
    AssetEvent.source_task_id,
    AssetEvent.source_try_number,
    AssetEvent.source_alias,
    AssetEvent.created_by,
    AssetEvent.partition_key,
)


def triggering_events(session: Session, dag_run_id: int) -> list[EventRow]:
    """The asset events that triggered the run, in id order."""
    rows = session.execute(
        select(*_EVENT_ROW_COLUMNS)
        .join_from(DagRunAssetEvent, AssetEvent, DagRunAssetEvent.asset_event_id == AssetEvent.id)
        .join(Asset, Asset.id == AssetEvent.asset_id)
        .where(DagRunAssetEvent.dag_run_id == dag_run_id)
        .order_by(AssetEvent.id)
    )
    return [EventRow(*row) for row in rows]


def triggering_events_page(
    session: Session, *, dag_id: str, run_id: str, after_id: int | None, limit: int
) -> list[EventRow] | None:
    """Up to ``limit`` of the asset events that triggered run ``run_id`` of ``dag_id``, those
    with an id over ``after_id`` (None: from the first), in id order; None when the run does
    not exist. A task's process reads its run's events page by page
    (``engine.executor.event_requests``), and only when it looks at them."""
    dag_run_id = session.execute(
        select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
    ).scalar()
    if dag_run_id is None:
        return None
    query = (
        select(*_EVENT_ROW_COLUMNS)
        .join_from(DagRunAssetEvent, AssetEvent, DagRunAssetEvent.asset_event_id == AssetEvent.id)
        .join(Asset, Asset.id == AssetEvent.asset_id)
        .where(DagRunAssetEvent.dag_run_id == dag_run_id)
    )
    if after_id is not None:
        query = query.where(DagRunAssetEvent.asset_event_id > after_id)
    rows = session.execute(query.order_by(DagRunAssetEvent.asset_event_id).limit(limit))
    return [EventRow(*row) for row in rows]


def run_results(session: Session, dag_run_id: int) -> dict[str, dict[str, Any]]:
    """The results of the run's succeeded tasks: ``{task_id: {key: tagged JSON}}`` (what
    ``ti.xcom_pull`` and a task's ``XComArg`` arguments read)."""
    rows = session.execute(
        select(TaskInstance.task_id, TaskInstance.xcoms).where(
            TaskInstance.dag_run_id == dag_run_id,
            TaskInstance.map_index == -1,  # copies of mapped tasks: mapping.mapped_run_results
            TaskInstance.state == TaskState.SUCCESS,
            TaskInstance.xcoms.is_not(None),
        )
    )
    return {str(task_id): dict(xcoms) for task_id, xcoms in rows if isinstance(xcoms, dict)}


_RUN_RESULTS = select(TaskInstance.task_id, TaskInstance.map_index, TaskInstance.xcoms).where(
    TaskInstance.dag_run_id == bindparam("run_pk"),
    TaskInstance.state == TaskState.SUCCESS,
    TaskInstance.xcoms.is_not(None),
)


def all_run_results(
    session: Session, dag_run_id: int
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]:
    """``run_results`` and ``mapping.mapped_run_results`` of the run, in one read (what a
    task step's context carries)."""
    rows = read_rows(session, _RUN_RESULTS, {"run_pk": dag_run_id})
    whole: dict[str, dict[str, Any]] = {}
    copies: dict[str, dict[str, dict[str, Any]]] = {}
    for task_id, index, xcoms in rows:
        if not isinstance(xcoms, dict):
            continue
        if index < 0:
            whole[str(task_id)] = dict(xcoms)
        else:
            copies.setdefault(str(task_id), {})[str(int(index))] = dict(xcoms)
    return whole, copies


@dataclass(frozen=True, slots=True)
class TaskResults:
    """A task instance's state and stored results (``sluice tasks result``)."""

    state: str
    try_number: int
    xcoms: dict[str, Any]


def load_task_results(
    session: Session, dag_id: str, run_id: str, task_id: str, map_index: int = -1
) -> TaskResults | None:
    """The results of one task instance of one run (``{key: tagged JSON}``): the task's, or
    one copy's of a mapped task (``map_index``); None if no such task instance."""
    row = session.execute(
        select(TaskInstance.state, TaskInstance.try_number, TaskInstance.xcoms)
        .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
        .where(
            DagRun.dag_id == dag_id,
            DagRun.run_id == run_id,
            TaskInstance.task_id == task_id,
            TaskInstance.map_index == map_index,
        )
    ).first()
    if row is None:
        return None
    state, try_number, xcoms = row
    return TaskResults(str(state), int(try_number), dict(xcoms or {}))
