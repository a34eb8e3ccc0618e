"""Planning a DAG sync (pure): which parse results to use, and what the tables should hold.

The last good parse result of every DAG file is kept; a pass brings fresh results for some
files. ``accept_results`` merges them into the last good map but refuses a fresh result
that conflicts with another file (a dag_id defined twice, an asset declared with two uris,
one watcher with two triggers): that file keeps its previous version and gets a parse error
naming both files. ``plan`` turns the accepted map into the desired state: the DAGs, the
assets, the schedule edges (to declared assets only: a schedule's ``Asset.ref(name=...)`` of
an asset no file declares gets its edge once one does), and the watchers that run (those of
assets that the schedule of some active DAG references). ``task_rows`` and ``dag_columns``
are a parsed DAG's rows as the tables hold them, for ``engine.dag_processing.sync`` to
compare and write.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from engine.dag_processing.parsing import (
    FileParseResult,
    ParsedAsset,
    ParsedDag,
    ParsedWatcher,
    ParseError,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Set

DUPLICATE_DAG_ID: Final = "DuplicateDagIdError"
ASSET_CONFLICT: Final = "AssetConflictError"


@dataclass(frozen=True, slots=True)
class Conflict:
    kind: str  # DUPLICATE_DAG_ID or ASSET_CONFLICT
    key: str  # the dag_id or asset name
    first: str  # fileloc earlier in sorted order
    second: str
    what: str  # the clash, for messages


def find_conflict(files: Mapping[str, FileParseResult]) -> Conflict | None:
    """The first clash between two files, scanning them in sorted order."""
    dag_ids: dict[str, str] = {}
    uris: dict[str, tuple[str, str]] = {}
    watchers: dict[tuple[str, str], tuple[str, ParsedWatcher]] = {}
    for fileloc in sorted(files):
        for dag in files[fileloc].dags:
            holder = dag_ids.setdefault(dag.dag_id, fileloc)
            if holder != fileloc:
                what = f"DAG id {dag.dag_id!r} is defined in both {holder} and {fileloc}"
                return Conflict(DUPLICATE_DAG_ID, dag.dag_id, holder, fileloc, what)
        for asset in files[fileloc].assets:
            holder, uri = uris.setdefault(asset.name, (fileloc, asset.uri))
            if uri != asset.uri:
                what = (
                    f"asset {asset.name!r} is declared with uri {uri!r} in {holder} and "
                    f"{asset.uri!r} in {fileloc}"
                )
                return Conflict(ASSET_CONFLICT, asset.name, holder, fileloc, what)
            for watcher in asset.watchers:
                holder, other = watchers.setdefault((asset.name, watcher.name), (fileloc, watcher))
                if other != watcher:
                    what = (
                        f"asset {asset.name!r} watcher {watcher.name!r} has different triggers "
                        f"in {holder} and {fileloc}"
                    )
                    return Conflict(ASSET_CONFLICT, asset.name, holder, fileloc, what)
    return None


@dataclass(frozen=True, slots=True)
class Acceptance:
    files: dict[str, FileParseResult]  # the new last good map
    accepted: set[str]  # files whose fresh result is now in use
    rejected: dict[str, ParseError]  # files refused for a conflict


def _loser(conflict: Conflict, pending: Set[str], dag_owners: Mapping[str, str]) -> str:
    first, second = conflict.first, conflict.second
    if (first in pending) != (second in pending):
        return first if first in pending else second  # the version already in use wins
    owner = dag_owners.get(conflict.key) if conflict.kind == DUPLICATE_DAG_ID else None
    if owner in (first, second):
        return second if owner == first else first  # the file that owns the DAG keeps it
    return second


def _conflict_error(conflict: Conflict, loser: str, result: FileParseResult) -> ParseError:
    lineno = next((d.lineno for d in result.dags if d.dag_id == conflict.key), None)
    if conflict.kind != DUPLICATE_DAG_ID:
        lineno = None
    hint = (
        "dag ids must be unique across the dags folder: rename one of them"
        if conflict.kind == DUPLICATE_DAG_ID
        else "declare the asset once (e.g. in a plugins module) and import it in both files"
    )
    message = (
        f"{conflict.what}; {hint}. {loser} is not used until this is fixed (the DAGs it "
        "defined before keep their last good version)"
    )
    return ParseError(type=conflict.kind, message=message, lineno=lineno)


def accept_results(
    last_good: Mapping[str, FileParseResult],
    fresh: Mapping[str, FileParseResult],
    dag_owners: Mapping[str, str],
) -> Acceptance:
    """Merge the successful ``fresh`` results into ``last_good``, refusing conflicting ones.

    ``dag_owners`` maps a dag_id to the file that defines it in the DB: when two fresh
    results claim one id, that file keeps it.
    """
    candidate = dict(last_good)
    pending = {fileloc for fileloc, result in fresh.items() if result.ok}
    candidate.update((fileloc, fresh[fileloc]) for fileloc in pending)
    rejected: dict[str, ParseError] = {}
    while (conflict := find_conflict(candidate)) is not None:
        loser = _loser(conflict, pending, dag_owners)
        rejected[loser] = _conflict_error(conflict, loser, candidate[loser])
        pending.discard(loser)
        if loser in last_good and candidate[loser] is not last_good[loser]:
            candidate[loser] = last_good[loser]
        else:
            del candidate[loser]
    return Acceptance(candidate, pending, rejected)


@dataclass(frozen=True, slots=True)
class DesiredState:
    dags: dict[str, tuple[str, ParsedDag]] = field(default_factory=dict)  # id -> (file, dag)
    assets: dict[str, ParsedAsset] = field(default_factory=dict)  # without watchers
    edges: set[tuple[str, str]] = field(default_factory=set)  # (dag_id, asset name)
    alias_edges: set[tuple[str, str]] = field(default_factory=set)  # (dag_id, alias name)
    watchers: dict[tuple[str, str], ParsedWatcher] = field(default_factory=dict)


def plan(files: Mapping[str, FileParseResult]) -> DesiredState:
    """What the tables should hold for these (conflict-free) results."""
    state = DesiredState()
    declared: dict[tuple[str, str], ParsedWatcher] = {}
    for fileloc in sorted(files):
        for dag in files[fileloc].dags:
            state.dags.setdefault(dag.dag_id, (fileloc, dag))
            state.edges.update((dag.dag_id, name) for name in dag.schedule_assets)
            state.alias_edges.update((dag.dag_id, name) for name in dag.schedule_aliases)
        for asset in files[fileloc].assets:
            state.assets.setdefault(asset.name, ParsedAsset(asset.name, asset.uri, asset.extra))
            for watcher in asset.watchers:
                declared.setdefault((asset.name, watcher.name), watcher)
    # A DAG scheduled on Asset.ref(name=...) of an asset no file declares waits: no edge yet.
    state.edges.difference_update({e for e in state.edges if e[1] not in state.assets})
    scheduled = {name for _, name in state.edges}
    state.watchers.update((key, w) for key, w in declared.items() if key[0] in scheduled)
    return state


def task_rows(dag: ParsedDag) -> list[dict[str, Any]]:
    """``dag_task`` rows of a parsed DAG, as ``dags_sql.load_dag_tasks`` returns them."""
    return [
        {
            "task_id": task.task_id,
            "operator": task.operator,
            "downstream_task_ids": list(task.downstream),
            "retries": task.retries,
            "start_from_trigger": task.start_from_trigger,
            "execution_timeout_s": (
                None if task.execution_timeout_s is None else math.ceil(task.execution_timeout_s)
            ),
            "position": position,
            "outlets": list(task.outlets),
            "outlet_aliases": list(task.outlet_aliases),
            "inlets": list(task.inlets),
            "inlet_aliases": list(task.inlet_aliases),
            "trigger_rule": task.trigger_rule,
            "retry_delay_s": task.retry_delay_s,
            "retry_exponential_backoff": task.retry_exponential_backoff,
            "max_retry_delay_s": task.max_retry_delay_s,
            "mapping": task.mapping,
            "pool": task.pool,
            "pool_slots": task.pool_slots,
            "queue": task.queue,
            "is_setup": task.is_setup,
            "is_teardown": task.is_teardown,
            "on_failure_fail_dagrun": task.on_failure_fail_dagrun,
            "edge_labels": task.edge_labels,
        }
        for position, task in enumerate(dag.tasks)
    ]


def dag_columns(dag: ParsedDag) -> dict[str, Any]:
    """The parsed ``dag`` columns (``dags_sql.PARSED_DAG_COLUMNS``) of a parsed DAG."""
    return {
        "schedule": dag.schedule,
        "description": dag.description,
        "timetable": dag.timetable,
        "timetable_summary": dag.timetable_summary,
        "timezone": dag.timezone,
        "start_date": _datetime(dag.start_date),
        "end_date": _datetime(dag.end_date),
        "catchup": dag.catchup,
        "max_active_runs": dag.max_active_runs,
        "max_active_tasks": dag.max_active_tasks,
        "dagrun_timeout_s": dag.dagrun_timeout_s,
        "tags": list(dag.tags),
        "params": dag.params,
        "doc_md": dag.doc_md,
        "display_name": dag.display_name,
        "has_on_success_callback": dag.has_on_success_callback,
        "has_on_failure_callback": dag.has_on_failure_callback,
        "deadline_alerts": list(dag.deadline_alerts) or None,
    }


def _datetime(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)
