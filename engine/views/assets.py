"""Assets as shown: their watchers, last event, the DAGs they schedule and the tasks that
update them; their events with where each came from (watcher, task, API, CLI) and the runs
it triggered; and the asset graph (assets, watchers, producing tasks, consuming DAGs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypedDict

from engine.db.queries import browse, lineage
from engine.views.common import Page, check_page, iso, page

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.db.models import Asset, AssetEvent, AssetWatcher


class WatcherItem(TypedDict):
    """A watcher of an asset: its trigger's class, owner and failures (never its kwargs)."""

    name: str
    trigger_id: int
    classpath: str
    triggerer_id: int | None
    failures: int
    last_failure_date: str | None
    last_error: str | None


class LastEvent(TypedDict):
    id: int
    timestamp: str
    source: str | None
    partition_key: str | None


class AssetItem(TypedDict):
    """An asset of ``list_assets`` / ``show_asset``."""

    name: str
    uri: str
    extra: Any
    events: int
    last_event: LastEvent | None
    watchers: list[WatcherItem]
    consuming_dags: list[str]
    producing_tasks: list[str]  # ``dag_id/task_id``
    updated_at: str


class AssetEventItem(TypedDict):
    """An asset event: where it came from, its extra and payload, the runs it triggered."""

    id: int
    asset: str
    timestamp: str
    source: str | None  # watcher, task, cli, api
    source_watcher: str | None
    source_task: str | None  # ``dag_id/run_id/task_id``
    source_try_number: int | None
    source_alias: str | None
    created_by: str | None
    extra: Any
    payload: Any
    runs: list[str]  # ``dag_id/run_id``
    partition_key: str | None  # the slice of the asset it updated (None: unpartitioned)


class _Node(TypedDict):
    id: str  # ``<kind>:<name>``
    label: str


class AssetNode(_Node):
    kind: Literal["asset"]
    uri: str
    events: int
    last_event: LastEvent | None


class WatcherNode(_Node, WatcherItem):
    kind: Literal["watcher"]


class TaskNode(_Node):
    kind: Literal["task"]
    dag_id: str


class DagNode(_Node):
    kind: Literal["dag"]
    paused: bool | None  # None: a DAG not in the database


GraphNode = AssetNode | WatcherNode | TaskNode | DagNode


class GraphEdge(TypedDict):
    source: str
    target: str
    kind: Literal["updates", "schedules", "runs"]


class AssetGraph(TypedDict):
    nodes: list[GraphNode]
    edges: list[GraphEdge]


def _producers(session: Session) -> dict[str, list[tuple[str, str]]]:
    """asset name -> the tasks (dag_id, task_id) that update it, directly or through an
    alias that has resolved to it."""
    aliases = lineage.asset_aliases(session)
    out: dict[str, list[tuple[str, str]]] = {}
    for dag_id, task_id, outlets, outlet_aliases in lineage.task_outlets(session):
        names = [*outlets, *(a for alias in outlet_aliases for a in aliases.get(alias, []))]
        for name in dict.fromkeys(names):
            out.setdefault(name, []).append((dag_id, task_id))
    return out


def _watcher_json(watcher: AssetWatcher, trigger: Any) -> WatcherItem:
    trigger_id, classpath, triggerer_id, failures, last_failure, last_error = trigger
    return {
        "name": watcher.name,
        "trigger_id": trigger_id,
        "classpath": classpath,
        "triggerer_id": triggerer_id,
        "failures": failures,
        "last_failure_date": iso(last_failure),
        "last_error": last_error,
    }


def _last_event_json(event: AssetEvent | None) -> LastEvent | None:
    if event is None:
        return None
    return {
        "id": event.id,
        "timestamp": event.timestamp.isoformat(),
        "source": event.source,
        "partition_key": event.partition_key,
    }


def _assets_json(
    session: Session, assets: list[Asset], producers: dict[str, list[tuple[str, str]]]
) -> list[AssetItem]:
    ids = [a.id for a in assets]
    counts = lineage.event_counts(session, ids)
    last = lineage.last_events(session, ids)
    watchers = lineage.asset_watchers(session, ids)
    consumers = lineage.asset_consumers(session, ids)
    return [
        {
            "name": a.name,
            "uri": a.uri,
            "extra": a.extra,
            "events": counts.get(a.id, 0),
            "last_event": _last_event_json(last.get(a.id)),
            "watchers": [_watcher_json(w, t) for w, t in watchers.get(a.id, [])],
            "consuming_dags": consumers.get(a.id, []),
            "producing_tasks": [f"{d}/{t}" for d, t in producers.get(a.name, [])],
            "updated_at": a.updated_at.isoformat(),
        }
        for a in assets
    ]


def list_assets(
    session: Session, *, search: str | None = None, limit: int | None = None, offset: int = 0
) -> Page[AssetItem]:
    """A page of assets by name: uri, extra, number of events, the last event, watchers
    (trigger class, owner, failures; never the trigger's kwargs), the DAGs they schedule and
    the tasks that update them."""
    check_page(limit, offset)
    assets, total = lineage.asset_page(session, search=search, limit=limit, offset=offset)
    return page(_assets_json(session, assets, _producers(session)), total, limit, offset)


def show_asset(session: Session, name: str) -> AssetItem | None:
    """One asset as ``list_assets`` shows it, None if unknown."""
    asset = lineage.asset_by_name(session, name)
    return None if asset is None else _assets_json(session, [asset], _producers(session))[0]


def event_json(event: AssetEvent, asset: str, runs: list[tuple[str, str]]) -> AssetEventItem:
    """One asset event: where it came from (``source``: watcher, task, cli, api; the watcher,
    the task try, or who emitted it), its extra and payload, and the runs it triggered."""
    task = (
        None
        if event.source_task_id is None
        else f"{event.source_dag_id}/{event.source_run_id}/{event.source_task_id}"
    )
    return {
        "id": event.id,
        "asset": asset,
        "timestamp": event.timestamp.isoformat(),
        "source": event.source,
        "source_watcher": event.source_watcher,
        "source_task": task,
        "source_try_number": event.source_try_number,
        "source_alias": event.source_alias,
        "created_by": event.created_by,
        "extra": event.extra,
        "payload": event.payload,
        "runs": [f"{dag_id}/{run_id}" for dag_id, run_id in runs],
        "partition_key": event.partition_key,
    }


def list_asset_events(
    session: Session,
    *,
    asset: str | None = None,
    source: str | None = None,
    since: datetime | None = None,
    partition_key: str | None = None,
    newest_first: bool = True,
    limit: int | None = None,
    offset: int = 0,
) -> Page[AssetEventItem] | None:
    """A page of asset events (newest first by default), of one asset (None if that asset
    is unknown), from one source, since a time, of one partition key."""
    check_page(limit, offset)
    asset_id = None
    if asset is not None:
        row = lineage.asset_by_name(session, asset)
        if row is None:
            return None
        asset_id = row.id
    events, total = lineage.event_page(
        session,
        asset_id=asset_id,
        source=source,
        since=since,
        partition_key=partition_key,
        newest_first=newest_first,
        limit=limit,
        offset=offset,
    )
    runs = lineage.event_runs(session, [e.id for e, _ in events])
    items = [event_json(e, name, runs.get(e.id, [])) for e, name in events]
    return page(items, total, limit, offset)


def asset_graph(session: Session) -> AssetGraph:
    """Every asset with what updates it and what it schedules, as ``nodes`` (``id``,
    ``kind``: asset / watcher / task / dag, ``label`` and details) and ``edges`` (``source``,
    ``target``, ``kind``): watcher -updates-> asset, task -updates-> asset,
    asset -schedules-> dag, dag -runs-> task (a producing task's DAG)."""
    assets, _ = lineage.asset_page(session)
    producers = _producers(session)
    shown = _assets_json(session, assets, producers)
    dags = {d.dag_id: d for d in browse.dag_page(session)[0]}
    nodes: dict[str, GraphNode] = {}
    edges: list[GraphEdge] = []

    def dag_node(dag_id: str) -> str:
        dag = dags.get(dag_id)
        paused = None if dag is None else dag.is_paused
        node: DagNode = {"id": f"dag:{dag_id}", "kind": "dag", "label": dag_id, "paused": paused}
        nodes.setdefault(node["id"], node)
        return node["id"]

    for a in shown:
        node = f"asset:{a['name']}"
        nodes[node] = {"id": node, "kind": "asset", "label": a["name"], "uri": a["uri"],
                       "events": a["events"], "last_event": a["last_event"]}  # fmt: skip
        for w in a["watchers"]:
            wid = f"watcher:{a['name']}/{w['name']}"
            nodes[wid] = {"id": wid, "kind": "watcher", "label": w["name"], **w}
            edges.append({"source": wid, "target": node, "kind": "updates"})
        for dag_id, task_id in producers.get(a["name"], []):
            tid = f"task:{dag_id}/{task_id}"
            if tid not in nodes:
                nodes[tid] = {"id": tid, "kind": "task", "label": task_id, "dag_id": dag_id}
                edges.append({"source": dag_node(dag_id), "target": tid, "kind": "runs"})
            edges.append({"source": tid, "target": node, "kind": "updates"})
        edges.extend(
            {"source": node, "target": dag_node(dag_id), "kind": "schedules"}
            for dag_id in a["consuming_dags"]
        )
    return {"nodes": list(nodes.values()), "edges": edges}
