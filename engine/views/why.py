"""Why did a DAG not run? ``explain_dag`` answers in one record (``why_records.WhyAnswer``),
read by ``sluice dags why`` (``engine.cli.dags``; ``engine.cli.why_text`` renders it as
text), by ``GET /api/v1/dags/{dag_id}/why`` and by the web UI's "why" page.

It reads the facts in one transaction against one ``now`` and asks the scheduler's own
decision for the asset condition (``engine.authoring.assets.is_condition_met``, each node
through ``BaseAsset.evaluate``) and the DAG's own timetable for the next tick: nothing here
re-implements a scheduling rule. The diagnosis is pure: ``why_entries`` judges each watcher,
asset and alias, ``why_findings`` gives the findings and the verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal, overload

from engine.authoring.assets import (
    Asset,
    AssetAlias,
    AssetAll,
    AssetAny,
    AssetNameRef,
    BaseAsset,
    is_condition_met,
)
from engine.authoring.partition_timetables import PartitionedAssetTimetable
from engine.authoring.schedules import timetable_from_json
from engine.authoring.timetables import DataInterval, TimeRestriction
from engine.db.queries import asset_queue, backfills, runs, time_schedules
from engine.db.queries import why as why_sql
from engine.db.queries import why_watchers as watchers_sql
from engine.states import DagRunState
from engine.views import why_entries, why_findings, why_partitions
from engine.views.common import iso

if TYPE_CHECKING:
    from collections.abc import Set
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.db.queries.backfills import DagSchedule
    from engine.db.queries.why import RunFacts
    from engine.views.why_records import (
        AliasEntry,
        AssetEntry,
        AssetSchedule,
        LeafNode,
        NextRun,
        Node,
        ParseError,
        PartitionSchedule,
        Run,
        Runs,
        TimeSchedule,
        WhyAnswer,
    )

#: 2.1 x the default 5 s heartbeats (``[triggerer]`` / ``[scheduler] health_check_threshold``)
DEFAULT_HEALTH_THRESHOLD_S: Final = 10.5
_ASSET_OR_TIME: Final = "asset_or_time"


class UnknownDagError(LookupError):
    """No DAG has this id (the message says where to look)."""


def explain_dag(
    session: Session,
    dag_id: str,
    *,
    now: datetime,
    triggerer_threshold_s: float = DEFAULT_HEALTH_THRESHOLD_S,
    scheduler_threshold_s: float = DEFAULT_HEALTH_THRESHOLD_S,
) -> WhyAnswer:
    """Why ``dag_id`` runs or not at ``now`` (``why_records.WhyAnswer``).

    Raises ``UnknownDagError`` when no DAG has that id. The thresholds are the heartbeat ages
    after which a triggerer / scheduler counts as dead (the configured health thresholds).
    """
    facts = why_sql.dag_facts(session, dag_id)
    if facts is None:
        raise UnknownDagError(_unknown(session, dag_id))
    sched = backfills.dag_schedules(session, [dag_id])[dag_id]
    engine = watchers_sql.engine_facts(
        session,
        now=now,
        triggerer_threshold_s=triggerer_threshold_s,
        scheduler_threshold_s=scheduler_threshold_s,
    )
    counts = why_sql.active_run_counts(session, dag_id)
    active = sum(counts.values())
    kind = _kind(sched)
    time, limit = None, sched.max_active_runs
    partitions = _partitions(session, sched)
    if sched.timetable and not _is_partitioned(sched):
        time, limit = _time_schedule(session, sched, now, active)
    condition, condition_error = _condition(sched.asset_condition)
    assets_section, assets, aliases = _asset_schedule(
        session, dag_id, condition, condition_error, now, triggerer_threshold_s, engine
    )
    if assets_section is not None and partitions is not None:
        assets_section["met"] = bool(partitions["ready"])  # met per key, not over all keys
    out: WhyAnswer = {
        "dag_id": dag_id,
        "now": iso(now),
        "verdict": "",
        "findings": [],
        "dag": {
            "fileloc": facts.fileloc,
            "active": facts.is_active,
            "paused": facts.is_paused,
            "last_parsed": iso(facts.last_parsed),
            "parse_error": _parse_error(facts.parse_error),
        },
        "runs": _runs(session, dag_id, counts, limit),
        "schedule": {
            "kind": kind,
            "text": _schedule_text(sched, condition),
            "assets": assets_section,
            "time": time,
            "partitions": partitions,
        },
        "assets": assets,
        "aliases": aliases,
        "engine": {
            "schedulers_alive": engine.schedulers_alive,
            "triggerers_alive": engine.triggerers_alive,
            "triggerer_capacity": engine.triggerer_capacity,
            "triggers_held": engine.triggers_held,
        },
    }
    out["findings"] = why_findings.findings(out)
    out["verdict"] = why_findings.verdict(out["findings"])
    return out


def _unknown(session: Session, dag_id: str) -> str:
    message = f"no DAG {dag_id!r}; `sluice dags list` shows the DAGs"
    broken = why_sql.parse_error_count(session)
    if broken:
        message += (
            f", and {broken} DAG file(s) fail to parse (`sluice dags errors`): a DAG defined "
            "in a file that never parsed is not known yet"
        )
    return message


def _is_partitioned(sched: DagSchedule) -> bool:
    """Whether the DAG runs per partition key on asset events (a
    ``PartitionedAssetTimetable``, whose time part never schedules)."""
    stored = sched.timetable
    return isinstance(stored, dict) and stored.get("__type") == PartitionedAssetTimetable.json_type


def _partitions(session: Session, sched: DagSchedule) -> PartitionSchedule | None:
    """The scheduler's plan for a partitioned DAG's queued events, in words."""
    if not _is_partitioned(sched):
        return None
    try:
        timetable = timetable_from_json(sched.timetable)
    except ValueError:  # the asset condition's section reports a schedule it cannot read
        return None
    assert isinstance(timetable, PartitionedAssetTimetable), timetable
    queued = why_sql.queued_partition_events(session, sched.dag_id)
    consumed = asset_queue.consumed_by_key(session, sched.dag_id, [e for e, _, _ in queued])
    return why_partitions.partition_schedule(timetable, queued, consumed)


def _kind(sched: DagSchedule) -> Literal["none", "assets", "time", "assets_or_time"]:
    if _is_partitioned(sched):
        return "assets"
    if sched.timetable is not None:
        is_both = isinstance(sched.timetable, dict) and sched.timetable.get("__type") == (
            _ASSET_OR_TIME
        )
        return "assets_or_time" if is_both else "time"
    return "none" if sched.asset_condition is None else "assets"


def _parse_error(error: tuple[str, int | None, datetime] | None) -> ParseError | None:
    if error is None:
        return None
    return {"error": error[0], "line": error[1], "at": iso(error[2])}


def _runs(session: Session, dag_id: str, counts: dict[str, int], limit: int) -> Runs:
    return {
        "max_active_runs": limit,
        "active": [_run(run) for run in why_sql.active_runs(session, dag_id)],
        "running": counts.get(DagRunState.RUNNING, 0),
        "queued": counts.get(DagRunState.QUEUED, 0),
        "limit_reached": sum(counts.values()) >= limit,
        "last": _run(why_sql.last_run(session, dag_id)),
    }


@overload
def _run(run: RunFacts) -> Run: ...
@overload
def _run(run: None) -> None: ...
def _run(run: RunFacts | None) -> Run | None:
    if run is None:
        return None
    return {
        "run_id": run.run_id,
        "run_type": run.run_type,
        "state": run.state,
        "queued_at": iso(run.queued_at),
        "start_date": iso(run.start_date),
        "end_date": iso(run.end_date),
        "logical_date": iso(run.logical_date),
        "run_after": iso(run.run_after),
        "partition_key": run.partition_key,
    }


# --- the asset condition ---------------------------------------------------------------


def _condition(stored: Any) -> tuple[BaseAsset | None, str | None]:
    if stored is None:
        return None, None
    try:
        return BaseAsset.from_json(stored), None
    except ValueError as exc:
        return None, f"cannot read the stored asset condition: {exc}"


def _asset_schedule(
    session: Session,
    dag_id: str,
    condition: BaseAsset | None,
    error: str | None,
    now: datetime,
    threshold_s: float,
    engine: watchers_sql.EngineFacts,
) -> tuple[AssetSchedule | None, list[AssetEntry], list[AliasEntry]]:
    if condition is None:
        if error is None:
            return None, [], []
        unread: AssetSchedule = {
            "condition": None,
            "met": False,
            "missing": None,
            "last_asset_run": None,
            "error": error,
        }
        return unread, [], []
    queued = why_sql.queued_by_asset(session, dag_id)
    queued_aliases = why_sql.queued_by_alias(session, dag_id)
    updated, aliases = frozenset(queued), frozenset(queued_aliases)
    last_asset_run = why_sql.last_run(session, dag_id, run_type=runs.ASSET_TRIGGERED)
    section: AssetSchedule = {
        "condition": _node(condition, updated, aliases, queued, queued_aliases),
        "met": is_condition_met(condition, updated, aliases),
        "missing": _missing(condition, updated, aliases),
        "last_asset_run": _run(last_asset_run),
        "error": None,
    }
    names, alias_names = condition.asset_names(), condition.alias_names()
    producers = why_sql.producers_of(session, names, alias_names)
    known = why_sql.assets_named(session, names)
    watchers = watchers_sql.watchers_of(session, [a.id for a in known.values()])
    digests = {w.stream_digest for w in watchers if w.stream_digest}
    groups = watchers_sql.stream_groups(session, digests, now=now, threshold_s=threshold_s)
    context = why_entries.WatcherContext(now, threshold_s, engine, groups)
    leaves = {a.name: a for a in condition.iter_asset_leaves()}
    alias_leaves = {a.name: a for a in condition.iter_aliases()}
    assets = [
        why_entries.asset_entry(
            name,
            known.get(name),
            queued.get(name),
            satisfied=leaves[name].evaluate(updated, aliases),
            watchers=[w for w in watchers if name in known and w.asset_id == known[name].id],
            producers=[p for p in producers if name in p.outlets],
            context=context,
        )
        for name in names
    ]
    resolved = why_sql.alias_assets(session, alias_names)
    alias_entries = [
        why_entries.alias_entry(
            name,
            queued_aliases.get(name),
            satisfied=alias_leaves[name].evaluate(updated, aliases),
            assets=resolved.get(name, []),
            producers=[p for p in producers if name in p.outlet_aliases],
        )
        for name in alias_names
    ]
    return section, assets, alias_entries


def _node(
    condition: BaseAsset,
    updated: Set[str],
    aliases: Set[str],
    queued: dict[str, why_sql.QueuedEvents],
    queued_aliases: dict[str, why_sql.QueuedEvents],
) -> Node:
    """The stored condition as a tree, each node judged by its own ``evaluate``."""
    satisfied = condition.evaluate(updated, aliases)
    if isinstance(condition, Asset | AssetNameRef | AssetAlias):
        is_asset = not isinstance(condition, AssetAlias)
        events = (queued if is_asset else queued_aliases).get(condition.name)
        leaf: LeafNode = {
            "type": "asset" if is_asset else "alias",
            "name": condition.name,
            "satisfied": satisfied,
            "queued_events": 0 if events is None else events.count,
        }
        return leaf
    assert isinstance(condition, AssetAll | AssetAny), condition
    return {
        "type": "all" if isinstance(condition, AssetAll) else "any",
        "satisfied": satisfied,
        "objects": [_node(o, updated, aliases, queued, queued_aliases) for o in condition.objects],
    }


def _missing(condition: BaseAsset, updated: Set[str], aliases: Set[str]) -> str | None:
    """What the condition still lacks, in words ("b", "b and c", "b or alias x")."""
    if condition.evaluate(updated, aliases):
        return None
    if isinstance(condition, Asset | AssetNameRef):
        return condition.name
    if isinstance(condition, AssetAlias):
        return f"alias {condition.name}"
    assert isinstance(condition, AssetAll | AssetAny), condition
    parts = [
        text for item in condition.objects if (text := _missing(item, updated, aliases)) is not None
    ]
    if len(parts) == 1:
        return parts[0]
    # A part that is itself "x and y" / "x or y" is put in parentheses.
    parts = [f"({p})" if " and " in p or " or " in p else p for p in parts]
    return (" and " if isinstance(condition, AssetAll) else " or ").join(parts)


def _schedule_text(sched: DagSchedule, condition: BaseAsset | None) -> str:
    if _is_partitioned(sched) and condition is not None:
        return f"assets {_condition_text(condition)}, per partition key"
    parts = []
    if sched.timetable is not None:
        parts.append(sched.timetable_summary or "timetable")
    if condition is not None:
        parts.append(f"assets {_condition_text(condition)}")
    return " or ".join(parts) or "None"


def _condition_text(condition: BaseAsset, *, nested: bool = False) -> str:
    if isinstance(condition, Asset | AssetNameRef):
        return condition.name
    if isinstance(condition, AssetAlias):
        return f"alias {condition.name}"
    assert isinstance(condition, AssetAll | AssetAny), condition
    sep = " & " if isinstance(condition, AssetAll) else " | "
    text = sep.join(_condition_text(o, nested=True) for o in condition.objects)
    return f"({text})" if nested else text


# --- the time schedule -------------------------------------------------------------------


def _time_schedule(
    session: Session, sched: DagSchedule, now: datetime, active: int
) -> tuple[TimeSchedule, int]:
    """The next tick: the one the scheduler stored, or (not computed yet, a paused DAG, a
    one-off timetable) the one the timetable gives now, as the scheduler would compute it;
    and the effective ``max_active_runs`` (the timetable's own limit may be lower)."""
    last_run = why_sql.last_run(session, sched.dag_id, run_type=runs.SCHEDULED)
    out: TimeSchedule = {
        "summary": sched.timetable_summary,
        "description": None,
        "error": None,
        "next_run": None,
        "source": "computed",
        "held": False,
        "last_scheduled_run": _run(last_run),
    }
    limit = sched.max_active_runs
    try:
        timetable = timetable_from_json(sched.timetable)
    except ValueError as exc:
        out["error"] = f"cannot read the stored timetable: {exc}"
        return out, limit
    out["description"] = timetable.description
    if timetable.active_runs_limit is not None:
        limit = min(sched.max_active_runs, timetable.active_runs_limit)
    if sched.next_dagrun_computed and timetable.periodic and not sched.is_paused:
        out["source"] = "scheduler"
        if sched.next_dagrun is not None:
            run_after = sched.next_dagrun_create_after
            out["held"] = run_after is None  # stored without a time: max_active_runs
            out["next_run"] = _next_run(
                sched.next_dagrun, sched.next_dagrun_data_interval, run_after, now
            )
        return out, limit
    last = time_schedules.last_automated_interval(session, sched.dag_id)
    info = timetable.next_dagrun_info(
        last_automated_data_interval=None if last is None else DataInterval(*last),
        restriction=TimeRestriction(sched.start_date, sched.end_date, sched.catchup),
        now=now,
    )
    if info is not None:
        interval = (info.data_interval.start, info.data_interval.end)
        out["next_run"] = _next_run(info.logical_date, interval, info.run_after, now)
        out["held"] = info.run_after <= now and active >= limit
    return out, limit


def _next_run(
    logical: datetime,
    interval: tuple[datetime, datetime] | None,
    run_after: datetime | None,
    now: datetime,
) -> NextRun:
    return {
        "logical_date": iso(logical),
        "data_interval": None if interval is None else [iso(interval[0]), iso(interval[1])],
        "run_after": iso(run_after),
        "due": run_after is None or run_after <= now,
    }
