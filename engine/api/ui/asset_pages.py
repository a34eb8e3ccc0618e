"""The asset pages: the list (watchers, last event, who updates and who consumes each), one
asset's events with their source (watcher, task, API, CLI) and partition key (a filter by
key), its partition matrix (keys x latest event / each per-key consumer's run, newest key
first, paged; a range of dates lists the keys a producing CronPartitionTimetable expects
there, missing ones marked), an "emit event" form (op and admin), and the asset graph drawn
as SVG on the server.

Reads through ``engine.views.assets`` (what ``GET /api/v1/assets...`` answers); an event
is emitted through ``queries.assets.emit_asset_event``, as the REST API and the CLI do.
"""

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Annotated, Any, Final, NamedTuple
from urllib.parse import urlencode

import anyio.to_thread
from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.security import Principal, UiOperatorDep, UiReaderDep
from engine.api.storable import problem_in_value
from engine.api.ui.drawing import GraphItem, draw
from engine.api.ui.rendering import (
    PAGE_SIZE,
    asset_url,
    can_operate,
    dag_url,
    json_object_field,
    not_found,
    page,
)
from engine.db.models import utcnow
from engine.db.queries import assets as assets_sql
from engine.views import assets as assets_view
from engine.views import partitions as partitions_view
from engine.views.common import MAX_INT32, MAX_OFFSET
from triggers.base import MAX_PARTITION_KEY_LENGTH, check_partition_key

MAX_EXTRA_CHARS: Final = 65_536
#: After an event is emitted here, the page reloads itself this often until the runs it
#: triggers show up (when a DAG is scheduled on the asset).
REFRESH_S: Final = 2
#: Partition keys per page of the matrix (its columns).
MATRIX_KEYS: Final = 48

router = APIRouter(include_in_schema=False)


@router.get("/assets", response_class=HTMLResponse)
async def asset_list(
    request: Request,
    _principal: UiReaderDep,
    database: DatabaseDep,
    search: Annotated[str | None, Query(max_length=250)] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> HTMLResponse:
    found = await database.read(
        partial(assets_view.list_assets, search=search or None, limit=PAGE_SIZE, offset=offset)
    )
    return page(request, "asset_list.html", "/assets", assets=found, search=search)


def graph_items(
    graph: assets_view.AssetGraph,
) -> tuple[list[GraphItem], list[tuple[str, str]]]:
    """``assets_view.asset_graph``'s nodes and edges as items to draw, each with its link."""
    items = [_graph_item(node) for node in graph["nodes"]]
    edges = [(edge["source"], edge["target"]) for edge in graph["edges"]]
    return items, edges


def _graph_item(node: assets_view.GraphNode) -> GraphItem:
    label = str(node["label"])
    href, title, flagged = None, label, False
    if node["kind"] == "asset":
        href, title = asset_url(label), f"asset {label} ({node['events']} events)"
    elif node["kind"] == "dag":
        href = dag_url(label)
        title = f"DAG {label}" + (" (paused)" if node["paused"] else "")
    elif node["kind"] == "task":
        href, title = dag_url(node["dag_id"]), f"task {node['dag_id']}.{label}"
    else:
        error = node["last_error"]
        flagged = bool(error)
        title = f"watcher {label}: {node['classpath']}" + (f"; error: {error}" if error else "")
    return GraphItem(node["id"], node["kind"], label, href, title, flagged)


@router.get("/asset-graph", response_class=HTMLResponse)
async def asset_graph(
    request: Request, _principal: UiReaderDep, database: DatabaseDep
) -> HTMLResponse:
    graph = await database.read(assets_view.asset_graph)
    # Laying out a big graph takes CPU time: not on the event loop the engine shares.
    drawn = await anyio.to_thread.run_sync(lambda: draw(*graph_items(graph)))
    return page(request, "asset_graph.html", "/asset-graph", graph=drawn)


def awaits_runs(
    asset: Mapping[str, Any], events: Sequence[Mapping[str, Any]], emitted: int | None
) -> bool:
    """Whether the event just emitted (``emitted``) has no run yet though DAGs consume it."""
    if emitted is None or not asset["consuming_dags"]:
        return False
    return any(event["id"] == emitted and not event["runs"] for event in events)


class PartitionQuery(NamedTuple):
    """What the asset page's partition parts were asked: the events of one key, the matrix's
    page and range (ISO dates as typed)."""

    key: str | None = None
    offset: int = 0
    start: str | None = None
    end: str | None = None


def _matrix(
    session: Any, name: str, asked: PartitionQuery
) -> tuple[partitions_view.AssetPartitions | None, str | None]:
    """The partition matrix's page, or the problem with the range asked."""
    try:
        start, end = partitions_view.read_range(session, name, asked.start, asked.end, now=utcnow())
        shown = partitions_view.asset_partitions(
            session, name, start=start, end=end, limit=MATRIX_KEYS, offset=asked.offset
        )
    except partitions_view.PartitionRangeError as exc:
        return None, str(exc)
    return shown, None


_NOTHING_ASKED: Final = PartitionQuery()


async def _asset_page(
    request: Request,
    database: DatabaseDep,
    name: str,
    offset: int,
    emitted: int | None = None,
    asked: PartitionQuery = _NOTHING_ASKED,
    **extra: Any,
) -> HTMLResponse:
    def read(session: Any) -> tuple[Any, ...]:
        shown = assets_view.show_asset(session, name)
        events = assets_view.list_asset_events(
            session, asset=name, partition_key=asked.key, limit=PAGE_SIZE, offset=offset
        )
        return shown, events, *_matrix(session, name, asked)

    asset, events, matrix, problem = await database.read(read)
    if asset is None or events is None:
        raise not_found(f"no asset {name!r}; the asset list shows the assets")
    if problem is not None:
        extra.setdefault("status_code", 422)
    return page(
        request,
        "asset.html",
        "/assets",
        asset=asset,
        events=events,
        matrix=matrix,
        asked=asked,
        range_query=urlencode({k: v for k, v in (("pfrom", asked.start), ("pto", asked.end)) if v}),
        partition_problem=problem,
        can_operate=can_operate(request),
        emitted=emitted,
        refresh_s=REFRESH_S if awaits_runs(asset, events["items"], emitted) else None,
        **extra,
    )


@router.get("/assets/{name:path}", response_class=HTMLResponse)
async def asset_page(
    request: Request,
    name: str,
    _principal: UiReaderDep,
    database: DatabaseDep,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    emitted: Annotated[int | None, Query(ge=1, le=MAX_INT32)] = None,
    partition_key: Annotated[str | None, Query(min_length=1, max_length=250)] = None,
    poffset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    pfrom: Annotated[str | None, Query(max_length=64)] = None,
    pto: Annotated[str | None, Query(max_length=64)] = None,
) -> HTMLResponse:
    asked = PartitionQuery(partition_key, poffset, pfrom or None, pto or None)
    return await _asset_page(request, database, name, offset, emitted, asked)


def emitted_by(principal: Principal) -> str:
    """Who emitted an event from the UI, as the event's ``created_by`` records it."""
    return f"ui:{principal.username}"


@router.post("/assets/{name:path}/events", response_model=None)
async def emit_event(
    request: Request,
    name: str,
    principal: UiOperatorDep,
    database: DatabaseDep,
    config: ConfigDep,
    extra: Annotated[str, Form(max_length=MAX_EXTRA_CHARS)] = "",
    partition_key: Annotated[str, Form(max_length=4 * MAX_PARTITION_KEY_LENGTH)] = "",
) -> Response:
    """Record an event of the asset (source ``api``), of one partition when a key is given:
    the DAGs scheduled on it run. Then the asset's page, with the new event marked; bad
    extra or key: the page again saying why (422)."""
    key = partition_key.strip() or None
    try:
        parsed = json_object_field(extra, "extra")
        if key is not None:
            check_partition_key(key, "partition key")
            if found := problem_in_value(key, "partition key"):
                raise ValueError(found)
        event_id = await database.run(
            partial(
                assets_sql.emit_asset_event,
                asset_name=name,
                extra=parsed,
                source=assets_sql.SOURCE_API,
                created_by=emitted_by(principal),
                partition_key=key,
                keep_while_paused=config.scheduler.keep_events_while_paused,
            )
        )
    except assets_sql.UnknownAssetError as exc:
        raise not_found(str(exc)) from exc
    except ValueError as exc:
        return await _asset_page(
            request,
            database,
            name,
            0,
            problem=str(exc),
            extra_text=extra,
            key_text=partition_key,
            status_code=422,
        )
    return RedirectResponse(f"{asset_url(name)}?emitted={event_id}#event-{event_id}", 303)
