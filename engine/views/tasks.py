"""Task instances as shown: per run with map index, try, state and duration; a task's
results (XComs, decoded); and the log of a try, read only from inside the log folder."""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING, Any, Final, TypedDict

from engine.db.queries import browse, run_context
from engine.db.queries import dags as dags_sql
from engine.db.queries import mapping as mapping_sql
from engine.task_log_files import find_log_file, logged_tries
from engine.views.common import Page, check_page, duration_s, iso, jsonable, page
from triggers.exceptions import SerializationError
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from datetime import datetime
    from pathlib import Path

    from sqlalchemy.orm import Session

    from engine.db.models import TaskInstance

#: The most of a log one read returns (a page of a long log; ``next_offset`` goes on).
MAX_LOG_CHUNK_BYTES: Final = 1 << 20


class TaskInstanceItem(TypedDict):
    """A task instance as lists show it."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int  # -1: an unmapped task
    #: a copy's ``map_index_template`` rendered when it ran (None: shown by its number)
    rendered_map_index: str | None
    operator: str | None  # None: a task its DAG no longer has
    state: str
    try_number: int
    max_tries: int
    queued_at: str | None
    start_date: str | None
    end_date: str | None
    duration_s: float | None  # so far, while running
    runtime_s: float
    hostname: str | None
    pid: int | None
    pool: str | None
    pool_slots: int | None
    trigger_id: int | None
    trigger_timeout: str | None
    next_retry_at: str | None


class TaskInstanceDetails(TaskInstanceItem):
    """One task instance of ``show_task_instance``."""

    map_indexes: list[int]  # of its task's copies (empty: an unmapped task)
    #: each copy's rendered ``map_index_template`` (None: none), as ``map_indexes``
    rendered_map_indexes: list[str | None]
    logged_tries: list[int] | None  # the tries that have a log (None: no log folder given)


class TaskResultsShown(TypedDict):
    """The results (XComs) a task instance stored."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    state: str
    try_number: int
    results: dict[str, Any]  # ``return_value`` first, then by key


class TaskLogChunk(TypedDict):
    """A chunk of the log of a try."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    tries: list[int]  # the tries that have a log
    offset: int
    next_offset: int  # where to read on as the try writes more
    size: int
    content: str


def task_instance_json(
    ti: TaskInstance, *, operator: str | None, run_id: str, now: datetime
) -> TaskInstanceItem:
    """One task instance: ids, state, try, times, ``duration_s`` (so far while running),
    where it runs, its pool, and the trigger it waits on."""
    return {
        "dag_id": ti.dag_id,
        "run_id": run_id,
        "task_id": ti.task_id,
        "map_index": ti.map_index,
        "rendered_map_index": ti.rendered_map_index,
        "operator": operator,
        "state": ti.state,
        "try_number": ti.try_number,
        "max_tries": ti.max_tries,
        "queued_at": iso(ti.queued_at),
        "start_date": iso(ti.start_date),
        "end_date": iso(ti.end_date),
        "duration_s": duration_s(ti.start_date, ti.end_date, now),
        "runtime_s": ti.runtime_s,
        "hostname": ti.hostname,
        "pid": ti.pid,
        "pool": ti.pool,
        "pool_slots": ti.pool_slots,
        "trigger_id": ti.trigger_id,
        "trigger_timeout": iso(ti.trigger_timeout),
        "next_retry_at": iso(ti.next_retry_at),
    }


def list_task_instances(
    session: Session,
    dag_id: str,
    run_id: str,
    *,
    now: datetime,
    state: str | None = None,
    task_id: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> Page[TaskInstanceItem] | None:
    """A page of one run's task instances in task order, None if the run is unknown."""
    check_page(limit, offset)
    run = browse.find_run(session, dag_id, run_id)
    if run is None:
        return None
    rows, total = browse.task_instance_page(
        session, run.id, state=state, task_id=task_id, limit=limit, offset=offset
    )
    items = [task_instance_json(ti, operator=op, run_id=run_id, now=now) for ti, op in rows]
    return page(items, total, limit, offset)


def show_task_instance(
    session: Session,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int = -1,
    *,
    now: datetime,
    log_folder: Path | None = None,
) -> TaskInstanceDetails | None:
    """One task instance (``task_instance_json``), None if unknown, with the map indexes of
    its task's copies (and their rendered names) and (given the log folder) the tries that
    have a log."""
    run = browse.find_run(session, dag_id, run_id)
    found = (
        None
        if run is None
        else browse.find_task_instance_with_operator(session, run.id, task_id, map_index)
    )
    if found is None:
        return None
    ti, operator = found
    tries = None
    if log_folder is not None:
        tries = logged_tries(log_folder, dag_id, run_id, task_id, map_index=map_index)
    copies = mapping_sql.copy_names(session, dag_id, run_id, task_id)
    return {
        **task_instance_json(ti, operator=operator, run_id=run_id, now=now),
        "map_indexes": [index for index, _ in copies],
        "rendered_map_indexes": [name for _, name in copies],
        "logged_tries": tries,
    }


def missing_task_instance(
    session: Session,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int,
    *,
    map_option: str = "--map-index",
) -> str:
    """Why no task instance matched: no such DAG, no such run of it, no such task in the
    run, or the map indexes of a mapped task."""
    if not dags_sql.dag_exists(session, dag_id):
        return f"no DAG {dag_id!r}; see `sluice dags list`"
    if browse.find_run(session, dag_id, run_id) is None:
        return f"no run {run_id!r} of DAG {dag_id!r}; see `sluice runs list {dag_id}`"
    indexes = mapping_sql.map_indexes(session, dag_id, run_id, task_id)
    if indexes and map_index not in indexes:
        return (
            f"task {task_id!r} of run {run_id!r} (DAG {dag_id!r}) is mapped: pass {map_option} "
            f"{indexes[0]}..{indexes[-1]}"
        )
    copy = f" map_index {map_index}" if map_index >= 0 else ""
    return f"no task {task_id!r}{copy} in run {run_id!r} of DAG {dag_id!r}; see `sluice runs list`"


def _stored_value(value: Any) -> Any:
    """A stored result decoded; one this version cannot decode is shown as stored."""
    try:
        return deserialize_value(value)
    except SerializationError:
        return value


def task_results(
    session: Session,
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: int = -1,
    *,
    plain: bool = True,
) -> TaskResultsShown | None:
    """The results (XComs) a task instance stored, None if it is unknown: its state and
    try, and ``results`` {key: value}, ``return_value`` first then by key. ``plain``: the
    values as JSON types (``jsonable``); else as decoded (datetimes, tuples, sets)."""
    found = run_context.load_task_results(session, dag_id, run_id, task_id, map_index)
    if found is None:
        return None
    ordered = sorted(found.xcoms.items(), key=lambda item: (item[0] != "return_value", item[0]))
    results = {name: _stored_value(value) for name, value in ordered}
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "task_id": task_id,
        "map_index": map_index,
        "state": found.state,
        "try_number": found.try_number,
        "results": jsonable(results) if plain else results,
    }


def task_log(
    folder: Path,
    dag_id: str,
    run_id: str,
    task_id: str,
    try_number: int | None = None,
    *,
    map_index: int = -1,
    offset: int = 0,
    max_bytes: int = MAX_LOG_CHUNK_BYTES,
) -> TaskLogChunk:
    """The log of a try from byte ``offset`` (at most ``max_bytes``): ``content`` and
    ``next_offset`` (where to read on as the try writes more), ``size``, ``try_number``,
    ``tries``. Raises ``TaskLogNotFoundError`` when there is no such log, and its subclass
    ``LogPathOutsideFolderError`` for a path that leads out of ``folder``."""
    path, number, tries = find_log_file(
        folder, dag_id, run_id, task_id, try_number, map_index=map_index
    )
    with path.open("rb") as handle:
        size = handle.seek(0, 2)
        start = min(max(offset, 0), size)
        handle.seek(start)
        data = handle.read(max(min(max_bytes, MAX_LOG_CHUNK_BYTES), 1))
        # a chunk that ends inside a UTF-8 character takes its last bytes too (at most 3)
        for _ in range(3):
            if not _cut_character(data):
                break
            more = handle.read(1)
            if not more:
                break
            data += more
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=False)
    pending = len(decoder.getstate()[0])  # a character still being written: read it later
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "task_id": task_id,
        "map_index": map_index,
        "try_number": number,
        "tries": tries,
        "offset": start,
        "next_offset": start + len(data) - pending,
        "size": size,
        "content": text,
    }


def _cut_character(data: bytes) -> bool:
    """Whether ``data`` ends inside a UTF-8 character."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoder.decode(data, final=False)
    return bool(decoder.getstate()[0])
