"""SQL of DAG processing: DAG files and parse errors, DAGs, their tasks, assets, watchers and
schedule edges, as the DAG processor's sync reads and writes them; plus the DAG listings
and pause switch of the CLI.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import delete, insert, select, text, update

from engine.db.models import (
    Asset,
    AssetAlias,
    AssetWatcher,
    Dag,
    DagFile,
    DagParseError,
    DagScheduleAsset,
    DagScheduleAssetAlias,
    DagTask,
    Trigger,
)
from engine.db.queries import assets

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime

    from sqlalchemy.orm import Session


logger = logging.getLogger(__name__)


#: The ``dag`` columns the DAG processor owns besides fileloc / is_active / is_paused (it
#: writes them from the parse result; the scheduler owns the ``next_dagrun*`` columns).
PARSED_DAG_COLUMNS: Final = (
    "schedule",
    "description",
    "timetable",
    "timetable_summary",
    "timezone",
    "start_date",
    "end_date",
    "catchup",
    "max_active_runs",
    "max_active_tasks",
    "dagrun_timeout_s",
    "tags",
    "params",
    "doc_md",
    "display_name",
    "has_on_success_callback",
    "has_on_failure_callback",
    "deadline_alerts",
)
#: A change to one of these makes the scheduler compute the next time run again.
TIME_COLUMNS: Final = ("timetable", "timezone", "start_date", "end_date", "catchup")


@dataclass(frozen=True, slots=True)
class DagRowState:
    dag_id: str
    fileloc: str
    is_active: bool
    is_paused: bool
    parsed: dict[str, Any]  # PARSED_DAG_COLUMNS -> stored value

    @property
    def schedule(self) -> Any:
        """The stored asset condition (JSON), None for a DAG not scheduled on assets."""
        return self.parsed.get("schedule")

    @property
    def description(self) -> str | None:
        value = self.parsed.get("description")
        return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class AssetRowState:
    id: int
    name: str
    uri: str
    extra: Any
    is_active: bool


@dataclass(frozen=True, slots=True)
class WatcherRowState:
    """An asset watcher and its trigger row (``kwargs`` still encrypted)."""

    id: int
    asset_id: int
    name: str
    trigger_id: int
    classpath: str
    kwargs: str
    stream_digest: str | None = None


@dataclass(frozen=True, slots=True)
class ParseErrorRow:
    fileloc: str
    error: str
    lineno: int | None
    stacktrace: str | None
    timestamp: datetime


#: Key of the PostgreSQL advisory lock that serializes DAG sync passes across processes.
DAG_SYNC_LOCK_KEY: Final = 0x51_01CE


def lock_dag_sync(session: Session) -> None:
    """Hold the DAG-sync lock until the transaction ends (PostgreSQL; no-op on SQLite)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": DAG_SYNC_LOCK_KEY})


def load_dag_files(session: Session) -> dict[str, str]:
    """fileloc -> encrypted last good parse result."""
    return {str(f): str(r) for f, r in session.execute(select(DagFile.fileloc, DagFile.result))}


def save_dag_files(
    session: Session, files: Mapping[str, tuple[str, str | None]], *, now: datetime
) -> None:
    """Store files' last good parses: fileloc -> (the encrypted parse result, the encrypted
    source that gave it); two statements for any number of files."""
    if not files:
        return
    session.execute(delete(DagFile).where(DagFile.fileloc.in_(list(files))))
    rows = [
        {"fileloc": fileloc, "result": token, "parsed_at": now, "source": source}
        for fileloc, (token, source) in files.items()
    ]
    session.execute(insert(DagFile), rows)


def last_good_source(session: Session, fileloc: str) -> tuple[str, datetime, str] | None:
    """(encrypted source, parsed_at, parse error) of the file's last good version, only
    while the DAG processor has a parse error recorded for the file; None otherwise (no
    error recorded, or no source kept)."""
    row = session.execute(
        select(DagFile.source, DagFile.parsed_at, DagParseError.error)
        .join(DagParseError, DagParseError.fileloc == DagFile.fileloc)
        .where(DagFile.fileloc == fileloc)
    ).first()
    if row is None or row.source is None:
        return None
    return str(row.source), row.parsed_at, str(row.error)


def delete_dag_files(session: Session, filelocs: Iterable[str]) -> None:
    wanted = list(filelocs)
    if wanted:
        session.execute(delete(DagFile).where(DagFile.fileloc.in_(wanted)))


def parse_error_filelocs(session: Session) -> set[str]:
    return set(session.execute(select(DagParseError.fileloc)).scalars())


def replace_parse_errors(
    session: Session, clear: Iterable[str], rows: Sequence[dict[str, Any]]
) -> None:
    """Delete the errors of the files in ``clear`` (and of ``rows``), then insert ``rows``."""
    filelocs = set(clear) | {row["fileloc"] for row in rows}
    if filelocs:
        session.execute(delete(DagParseError).where(DagParseError.fileloc.in_(filelocs)))
    if rows:
        session.execute(insert(DagParseError), list(rows))


def list_parse_errors(session: Session) -> list[ParseErrorRow]:
    rows = session.execute(
        select(
            DagParseError.fileloc,
            DagParseError.error,
            DagParseError.lineno,
            DagParseError.stacktrace,
            DagParseError.timestamp,
        ).order_by(DagParseError.fileloc)
    )
    return [ParseErrorRow(*row) for row in rows]


def load_dags(session: Session) -> dict[str, DagRowState]:
    columns = [getattr(Dag, name) for name in PARSED_DAG_COLUMNS]
    rows = session.execute(select(Dag.dag_id, Dag.fileloc, Dag.is_active, Dag.is_paused, *columns))
    return {
        str(row[0]): DagRowState(
            dag_id=str(row[0]),
            fileloc=str(row[1]),
            is_active=bool(row[2]),
            is_paused=bool(row[3]),
            parsed=dict(zip(PARSED_DAG_COLUMNS, row[4:], strict=True)),
        )
        for row in rows
    }


def insert_dag(session: Session, values: dict[str, Any]) -> None:
    insert_dags(session, [values])


def insert_dags(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Insert DAG rows (one ``executemany``); a row is active and unpaused unless it says."""
    if rows:
        defaults = {"is_paused": False, "is_active": True}
        session.execute(insert(Dag), [{**defaults, **values} for values in rows])


def update_dag(session: Session, dag_id: str, values: dict[str, Any]) -> None:
    session.execute(update(Dag).where(Dag.dag_id == dag_id).values(**values))


def set_last_parsed(session: Session, dag_ids: Iterable[str], now: datetime) -> None:
    """``last_parsed_time`` of the DAGs ``dag_ids`` (one statement: a re-parse that changed
    nothing else)."""
    wanted = list(dag_ids)
    if wanted:
        session.execute(update(Dag).where(Dag.dag_id.in_(wanted)).values(last_parsed_time=now))


def deactivate_dags(session: Session, dag_ids: Iterable[str]) -> None:
    wanted = list(dag_ids)
    if wanted:
        session.execute(update(Dag).where(Dag.dag_id.in_(wanted)).values(is_active=False))


def load_schedule_alias_edges(session: Session) -> set[tuple[str, str]]:
    """(dag_id, alias name) of every alias a DAG's schedule references."""
    rows = session.execute(
        select(DagScheduleAssetAlias.dag_id, AssetAlias.name).join(
            AssetAlias, AssetAlias.id == DagScheduleAssetAlias.alias_id
        )
    )
    return {(str(d), str(a)) for d, a in rows}


def replace_schedule_alias_edges(
    session: Session, add: Iterable[tuple[str, str]], remove: Iterable[tuple[str, str]]
) -> None:
    """Add and remove (dag_id, alias name) schedule edges; aliases are created as needed."""
    names = {alias for _, alias in (*add, *remove)}
    if not names:
        return
    # A task may create the same alias meanwhile: ensure_alias does not conflict with it.
    known = {name: assets.ensure_alias(session, name) for name in sorted(names)}
    for dag_id, alias in sorted(remove):
        session.execute(
            delete(DagScheduleAssetAlias).where(
                DagScheduleAssetAlias.dag_id == dag_id,
                DagScheduleAssetAlias.alias_id == known[alias],
            )
        )
    edges = [{"dag_id": d, "alias_id": known[a]} for d, a in sorted(add)]
    if edges:
        session.execute(insert(DagScheduleAssetAlias), edges)


def load_dag_tasks(session: Session) -> dict[str, list[dict[str, Any]]]:
    """dag_id -> its task rows (as dicts, in ``position`` order)."""
    tasks: dict[str, list[dict[str, Any]]] = {}
    rows = session.execute(select(DagTask).order_by(DagTask.dag_id, DagTask.position))
    for (row,) in rows:
        tasks.setdefault(row.dag_id, []).append(
            {
                "task_id": row.task_id,
                "operator": row.operator,
                "downstream_task_ids": row.downstream_task_ids,
                "retries": row.retries,
                "start_from_trigger": row.start_from_trigger,
                "execution_timeout_s": row.execution_timeout_s,
                "position": row.position,
                "outlets": list(row.outlets or []),
                "outlet_aliases": list(row.outlet_aliases or []),
                "inlets": list(row.inlets or []),
                "inlet_aliases": list(row.inlet_aliases or []),
                "trigger_rule": row.trigger_rule,
                "retry_delay_s": row.retry_delay_s,
                "retry_exponential_backoff": row.retry_exponential_backoff,
                "max_retry_delay_s": row.max_retry_delay_s,
                "mapping": row.mapping,
                "pool": row.pool,
                "pool_slots": row.pool_slots,
                "queue": row.queue,
                "is_setup": row.is_setup,
                "is_teardown": row.is_teardown,
                "on_failure_fail_dagrun": row.on_failure_fail_dagrun,
                "edge_labels": row.edge_labels,
            }
        )
    return tasks


def replace_dag_tasks(session: Session, dag_id: str, rows: Sequence[dict[str, Any]]) -> None:
    replace_tasks_of_dags(session, {dag_id: rows})


def replace_tasks_of_dags(session: Session, tasks: Mapping[str, Sequence[dict[str, Any]]]) -> None:
    """The task rows of the DAGs of ``tasks`` (dag_id -> its rows) replaced by those: two
    statements for any number of DAGs."""
    if not tasks:
        return
    session.execute(delete(DagTask).where(DagTask.dag_id.in_(list(tasks))))
    rows = [{"dag_id": dag_id, **row} for dag_id, dag_rows in tasks.items() for row in dag_rows]
    if rows:
        session.execute(insert(DagTask), rows)


def load_assets(session: Session) -> dict[str, AssetRowState]:
    rows = session.execute(select(Asset.id, Asset.name, Asset.uri, Asset.extra, Asset.is_active))
    return {row[1]: AssetRowState(*row) for row in rows}


def insert_asset(session: Session, *, name: str, uri: str, extra: Any, now: datetime) -> int:
    result = session.execute(
        insert(Asset)
        .values(name=name, uri=uri, extra=extra, is_active=True, created_at=now, updated_at=now)
        .returning(Asset.id)
    )
    return int(result.scalar_one())


def update_asset(session: Session, asset_id: int, values: dict[str, Any]) -> None:
    session.execute(update(Asset).where(Asset.id == asset_id).values(**values))


def load_schedule_edges(session: Session) -> set[tuple[str, int]]:
    """(dag_id, asset_id) of every schedule reference."""
    rows = session.execute(select(DagScheduleAsset.dag_id, DagScheduleAsset.asset_id))
    return {(str(d), int(a)) for d, a in rows}


def add_schedule_edges(session: Session, edges: Iterable[tuple[str, int]]) -> None:
    rows = [{"dag_id": d, "asset_id": a} for d, a in sorted(edges)]
    if rows:
        session.execute(insert(DagScheduleAsset), rows)


def delete_schedule_edges(session: Session, edges: Iterable[tuple[str, int]]) -> None:
    for dag_id, asset_id in sorted(edges):
        session.execute(
            delete(DagScheduleAsset).where(
                DagScheduleAsset.dag_id == dag_id, DagScheduleAsset.asset_id == asset_id
            )
        )


def load_asset_watchers(session: Session) -> list[WatcherRowState]:
    rows = session.execute(
        select(
            AssetWatcher.id,
            AssetWatcher.asset_id,
            AssetWatcher.name,
            AssetWatcher.trigger_id,
            Trigger.classpath,
            Trigger.kwargs,
            Trigger.stream_digest,
        )
        .join(Trigger, Trigger.id == AssetWatcher.trigger_id)
        .order_by(AssetWatcher.id)
    )
    return [WatcherRowState(*row) for row in rows]


def add_asset_watcher(session: Session, *, asset_id: int, name: str, trigger_id: int) -> int:
    result = session.execute(
        insert(AssetWatcher)
        .values(asset_id=asset_id, name=name, trigger_id=trigger_id)
        .returning(AssetWatcher.id)
    )
    return int(result.scalar_one())


def set_watcher_trigger(session: Session, watcher_id: int, trigger_id: int) -> None:
    session.execute(
        update(AssetWatcher).where(AssetWatcher.id == watcher_id).values(trigger_id=trigger_id)
    )


def delete_asset_watchers(session: Session, watcher_ids: Iterable[int]) -> None:
    wanted = list(watcher_ids)
    if wanted:
        session.execute(delete(AssetWatcher).where(AssetWatcher.id.in_(wanted)))


def dags_scheduled_on(session: Session, asset_ids: Iterable[int]) -> dict[str, Any]:
    """dag_id -> stored schedule of the active, unpaused DAGs scheduled on any of the assets."""
    wanted = list(asset_ids)
    if not wanted:
        return {}
    rows = session.execute(
        select(Dag.dag_id, Dag.schedule)
        .join(DagScheduleAsset, DagScheduleAsset.dag_id == Dag.dag_id)
        .where(
            DagScheduleAsset.asset_id.in_(wanted),
            Dag.is_active.is_(True),
            Dag.is_paused.is_(False),
        )
    )
    return {str(dag_id): schedule for dag_id, schedule in rows}


def set_paused(session: Session, dag_id: str, *, paused: bool) -> bool:
    """Pause or unpause; an unpause makes the scheduler compute the next time run again
    (with catchup off, a DAG paused for a week runs its latest interval, not a week's)."""
    values: dict[str, Any] = {"is_paused": paused}
    if not paused:
        values["next_dagrun_computed"] = False
    result = session.execute(update(Dag).where(Dag.dag_id == dag_id).values(**values))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def dag_exists(session: Session, dag_id: str) -> bool:
    return session.get(Dag, dag_id) is not None


def dag_param_specs(session: Session, dag_id: str) -> dict[str, Any] | None:
    """The DAG's stored param specs (``engine.authoring.params.param_spec`` per name)."""
    specs = session.execute(select(Dag.params).where(Dag.dag_id == dag_id)).scalar_one_or_none()
    return specs if isinstance(specs, dict) else None
