"""SQL of "why did this DAG not run?" (``engine.views.why``): one DAG's row and the parse
error of its file, its active and last runs, the asset events queued for it (by asset and by
alias), the assets of its schedule with their latest event, what the aliases resolved to,
and the tasks that update the assets. The watchers and triggerers behind the assets are
``engine.db.queries.why_watchers``.

Reads only; returns plain dataclasses. The view decides what they mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import and_, case, func, select

from engine.db.models import (
    Asset,
    AssetAlias,
    AssetAliasAsset,
    AssetEvent,
    AssetEventQueue,
    Dag,
    DagParseError,
    DagRun,
    DagTask,
    TaskInstance,
)
from engine.db.queries import asset_queue
from engine.states import DagRunState

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    from sqlalchemy.orm import Session

_ACTIVE: Final = (DagRunState.QUEUED, DagRunState.RUNNING)


@dataclass(frozen=True, slots=True)
class DagFacts:
    dag_id: str
    fileloc: str
    is_active: bool
    is_paused: bool
    last_parsed: datetime | None
    parse_error: tuple[str, int | None, datetime] | None  # (error, line, at) of its file


def dag_facts(session: Session, dag_id: str) -> DagFacts | None:
    """The DAG's row and the parse error of its file, if any (None: no such DAG)."""
    row = session.execute(
        select(Dag.dag_id, Dag.fileloc, Dag.is_active, Dag.is_paused, Dag.last_parsed_time).where(
            Dag.dag_id == dag_id
        )
    ).first()
    if row is None:
        return None
    error = session.execute(
        select(DagParseError.error, DagParseError.lineno, DagParseError.timestamp).where(
            DagParseError.fileloc == row.fileloc
        )
    ).first()
    return DagFacts(
        dag_id=row.dag_id,
        fileloc=row.fileloc,
        is_active=bool(row.is_active),
        is_paused=bool(row.is_paused),
        last_parsed=row.last_parsed_time,
        parse_error=None if error is None else (error[0], error[1], error[2]),
    )


def parse_error_count(session: Session) -> int:
    return int(session.execute(select(func.count()).select_from(DagParseError)).scalar_one())


@dataclass(frozen=True, slots=True)
class RunFacts:
    run_id: str
    run_type: str
    state: str
    queued_at: datetime
    start_date: datetime | None
    end_date: datetime | None
    logical_date: datetime | None
    run_after: datetime | None
    partition_key: str | None


_RUN_COLUMNS: Final = (
    DagRun.run_id,
    DagRun.run_type,
    DagRun.state,
    DagRun.queued_at,
    DagRun.start_date,
    DagRun.end_date,
    DagRun.logical_date,
    DagRun.run_after,
    DagRun.partition_key,
)


#: How many active runs the view lists (all are counted): a backlog of queued runs can be long.
ACTIVE_RUNS_SHOWN: Final = 20


def _active(dag_id: str) -> Any:
    return and_(DagRun.dag_id == dag_id, DagRun.state.in_(_ACTIVE), DagRun.backfill_id.is_(None))


def active_run_counts(session: Session, dag_id: str) -> dict[str, int]:
    """State -> how many queued and running runs count against ``max_active_runs`` (a
    backfill's runs have a limit of their own)."""
    rows = session.execute(
        select(DagRun.state, func.count()).where(_active(dag_id)).group_by(DagRun.state)
    )
    return {str(state): int(count) for state, count in rows}


def active_runs(session: Session, dag_id: str, *, limit: int = ACTIVE_RUNS_SHOWN) -> list[RunFacts]:
    """The first ``limit`` of those runs: the running ones, then the queued ones in the
    order they are admitted."""
    rows = session.execute(
        select(*_RUN_COLUMNS)
        .where(_active(dag_id))
        .order_by(
            case((DagRun.state == DagRunState.RUNNING, 0), else_=1),
            func.coalesce(DagRun.run_after, DagRun.queued_at),
            DagRun.id,
        )
        .limit(limit)
    )
    return [RunFacts(*row) for row in rows]


def last_run(session: Session, dag_id: str, *, run_type: str | None = None) -> RunFacts | None:
    """The DAG's latest run (of ``run_type``, if given), by the time it was queued."""
    query = select(*_RUN_COLUMNS).where(DagRun.dag_id == dag_id)
    if run_type is not None:
        query = query.where(DagRun.run_type == run_type)
    row = session.execute(
        query.order_by(DagRun.queued_at.desc(), DagRun.id.desc()).limit(1)
    ).first()
    return None if row is None else RunFacts(*row)


@dataclass(slots=True)
class QueuedEvents:
    """Asset events queued for the DAG (not consumed by a run yet) of one asset or alias."""

    count: int = 0
    last_at: datetime | None = None
    by_source: dict[str, int] = field(default_factory=dict)

    def add(self, source: str | None, count: int, last_at: datetime | None) -> None:
        self.count += count
        self.by_source[source or "unknown"] = self.by_source.get(source or "unknown", 0) + count
        if last_at is not None and (self.last_at is None or last_at > self.last_at):
            self.last_at = last_at


def queued_by_asset(session: Session, dag_id: str) -> dict[str, QueuedEvents]:
    """Asset name -> the events of it queued for the DAG (every asset, in its tree or not:
    the scheduler evaluates the condition on all of them)."""
    rows = session.execute(
        select(Asset.name, AssetEvent.source, func.count(), func.max(AssetEvent.timestamp))
        .select_from(AssetEventQueue)
        .join(AssetEvent, AssetEvent.id == AssetEventQueue.asset_event_id)
        .join(Asset, Asset.id == AssetEvent.asset_id)
        .where(AssetEventQueue.dag_id == dag_id)
        .group_by(Asset.name, AssetEvent.source)
    )
    out: dict[str, QueuedEvents] = {}
    for name, source, count, last_at in rows:
        out.setdefault(str(name), QueuedEvents()).add(source, int(count), last_at)
    return out


def queued_partition_events(session: Session, dag_id: str) -> list[tuple[int, str, str | None]]:
    """(event id, asset name, partition key) of every event queued for the DAG, oldest
    first: what a partitioned DAG's plan is made from (as the scheduler reads it)."""
    queue = asset_queue.queued_events(session, dag_id)
    return [(event_id, name, queue.partition_keys.get(event_id)) for event_id, name in queue.events]


def queued_by_alias(session: Session, dag_id: str) -> dict[str, QueuedEvents]:
    """Alias name -> the queued events of the assets the alias resolved to (as the
    scheduler counts an alias updated: ``engine.db.queries.asset_queue.lock_queued_dag``)."""
    rows = session.execute(
        select(AssetAlias.name, AssetEvent.source, func.count(), func.max(AssetEvent.timestamp))
        .select_from(AssetEventQueue)
        .join(AssetEvent, AssetEvent.id == AssetEventQueue.asset_event_id)
        .join(AssetAliasAsset, AssetAliasAsset.asset_id == AssetEvent.asset_id)
        .join(AssetAlias, AssetAlias.id == AssetAliasAsset.alias_id)
        .where(AssetEventQueue.dag_id == dag_id)
        .group_by(AssetAlias.name, AssetEvent.source)
    )
    out: dict[str, QueuedEvents] = {}
    for name, source, count, last_at in rows:
        out.setdefault(str(name), QueuedEvents()).add(source, int(count), last_at)
    return out


@dataclass(frozen=True, slots=True)
class AssetFacts:
    id: int
    name: str
    uri: str
    last_event_at: datetime | None  # its latest event, queued for this DAG or not
    last_event_source: str | None


def assets_named(session: Session, names: Iterable[str]) -> dict[str, AssetFacts]:
    """The named assets that exist, with their latest event."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    rows = session.execute(
        select(Asset.id, Asset.name, Asset.uri).where(Asset.name.in_(wanted))
    ).all()
    out = {}
    for asset_id, name, uri in rows:
        # One query per asset (a handful), so that PostgreSQL plans each with its own id:
        # a correlated subquery is planned for any asset and may walk every event's id.
        latest = session.execute(
            select(AssetEvent.timestamp, AssetEvent.source)
            .where(AssetEvent.asset_id == asset_id)
            .order_by(AssetEvent.id.desc())
            .limit(1)
        ).first()
        at, source = (None, None) if latest is None else latest
        out[str(name)] = AssetFacts(int(asset_id), str(name), str(uri), at, source)
    return out


def alias_assets(session: Session, aliases: Iterable[str]) -> dict[str, list[str]]:
    """Alias name -> the names of the assets it resolved to so far."""
    wanted = sorted(set(aliases))
    out: dict[str, list[str]] = {name: [] for name in wanted}
    if not wanted:
        return out
    rows = session.execute(
        select(AssetAlias.name, Asset.name)
        .join(AssetAliasAsset, AssetAliasAsset.alias_id == AssetAlias.id)
        .join(Asset, Asset.id == AssetAliasAsset.asset_id)
        .where(AssetAlias.name.in_(wanted))
        .order_by(AssetAlias.name, Asset.name)
    )
    for alias, asset in rows:
        out[str(alias)].append(str(asset))
    return out


@dataclass(frozen=True, slots=True)
class ProducerFacts:
    """A task of an active DAG that updates an asset (or attaches events through an alias)."""

    dag_id: str
    task_id: str
    dag_paused: bool
    outlets: list[str]
    outlet_aliases: list[str]
    last_state: str | None = None
    last_run_id: str | None = None
    last_end: datetime | None = None


def producers_of(
    session: Session, assets: Iterable[str], aliases: Iterable[str]
) -> list[ProducerFacts]:
    """Tasks of active DAGs whose outlets hold one of ``assets`` or ``aliases``, with the
    state of their latest task instance.

    The outlets are JSON lists: they are matched here in Python (portable across SQLite and
    PostgreSQL); only tasks that have outlets are read.
    """
    asset_set, alias_set = set(assets), set(aliases)
    if not asset_set and not alias_set:
        return []
    rows = session.execute(
        select(
            DagTask.dag_id, DagTask.task_id, Dag.is_paused, DagTask.outlets, DagTask.outlet_aliases
        )
        .join(Dag, Dag.dag_id == DagTask.dag_id)
        .where(Dag.is_active.is_(True))
        .order_by(DagTask.dag_id, DagTask.position)
    )
    found = []
    for dag_id, task_id, paused, outlets, outlet_aliases in rows:
        outs = [str(o) for o in outlets or [] if o in asset_set]
        out_aliases = [str(a) for a in outlet_aliases or [] if a in alias_set]
        if outs or out_aliases:
            found.append(ProducerFacts(dag_id, task_id, bool(paused), outs, out_aliases))
    return _with_last_states(session, found)


def _with_last_states(session: Session, found: list[ProducerFacts]) -> list[ProducerFacts]:
    """Each producer with the state of its task in the DAG's latest run that has it.

    One small query per producer, led by ``dag_run`` (indexed by DAG) and then the task
    instance's unique (run, task) index: no scan of the task instances of every DAG.
    """
    out = []
    for p in found:
        row = session.execute(
            select(TaskInstance.state, DagRun.run_id, TaskInstance.end_date)
            .join(DagRun, DagRun.id == TaskInstance.dag_run_id)
            .where(DagRun.dag_id == p.dag_id, TaskInstance.task_id == p.task_id)
            .order_by(DagRun.id.desc(), TaskInstance.map_index)
            .limit(1)
        ).first()
        state, run_id, end = (None, None, None) if row is None else row
        out.append(
            ProducerFacts(
                p.dag_id, p.task_id, p.dag_paused, p.outlets, p.outlet_aliases, state, run_id, end
            )
        )
    return out
