"""Assets, their events and the asset graph (the CLI's ``sluice assets``).

- ``GET /assets``: a page of assets (``?search=``) with their watchers, last event, the DAGs
  they schedule and the tasks that update them;
- ``GET /assets/{name}``: one asset (the name may hold slashes);
- ``GET /assets/{name}/partitions``: its partition keys, newest first, each with its latest
  event and, per DAG consuming it per key, the state of its run (``?from=&to=``: the keys a
  producing DAG on a ``CronPartitionTimetable`` expects in that range, missing ones marked);
- ``GET /asset-events``: a page of events, newest first (``?asset=&source=&since=
  &partition_key=``), with where each came from, its partition key and the runs it triggered;
- ``POST /asset-events`` (op): record an event of an asset, as ``sluice assets emit`` does
  (source ``api``, created by ``api:<user>``); the DAGs scheduled on it run;
- ``GET /asset-graph``: assets, watchers, producing tasks and consuming DAGs as nodes and
  edges.
"""

from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.rest.common import (
    BoundedDate,
    FilterDate,
    Limit,
    Offset,
    Page,
    PartitionKey,
    RequestBody,
    Search,
    act,
    found,
    invalid,
    read,
)
from engine.api.security import OperatorDep, ReaderDep
from engine.db.models import utcnow
from engine.db.queries import assets as assets_sql
from engine.views import assets as assets_view
from engine.views import partitions as partitions_view
from engine.views.common import Page as ViewPage
from triggers.base import MAX_PARTITION_KEY_LENGTH

router = APIRouter(tags=["assets"])

SourceName = Literal["watcher", "task", "cli", "api"]


class AssetWatcherItem(BaseModel):
    name: str
    trigger_id: int
    classpath: str
    triggerer_id: int | None = Field(description="The triggerer running it (None: unclaimed)")
    failures: int
    last_failure_date: str | None
    last_error: str | None


class LastEvent(BaseModel):
    id: int
    timestamp: str
    source: str | None
    partition_key: str | None = Field(description="The slice it updated (None: unpartitioned)")


class AssetItem(BaseModel):
    name: str
    uri: str
    extra: Any
    events: int = Field(description="Number of events")
    last_event: LastEvent | None
    watchers: list[AssetWatcherItem]
    consuming_dags: list[str] = Field(description="DAGs scheduled on it (or on an alias of it)")
    producing_tasks: list[str] = Field(description="Tasks (dag_id/task_id) that update it")
    updated_at: str


class AssetEventItem(BaseModel):
    id: int
    asset: str
    timestamp: str
    source: str | None = Field(description="watcher, task, cli or api")
    source_watcher: str | None
    source_task: str | None = Field(description="dag_id/run_id/task_id of the producing task")
    source_try_number: int | None
    source_alias: str | None
    created_by: str | None = Field(description="Who emitted it: cli:user@host, api:user")
    extra: Any
    payload: Any
    runs: list[str] = Field(description="Runs it triggered, as dag_id/run_id")
    partition_key: str | None = Field(description="The slice it updated (None: unpartitioned)")


class KeyEvent(BaseModel):
    id: int
    timestamp: str
    source: str | None


class ConsumerCell(BaseModel):
    dag_id: str
    downstream_keys: list[str] = Field(description="The keys the DAG's mapper gives this key")
    state: str | None = Field(description="Its latest run of those keys (None: no run)")
    run_id: str | None
    runs: int
    waiting: bool = Field(description="An event of this key is queued for it, no run yet")
    error: str | None = Field(description="Why its mapper refuses the key")


class PartitionRow(BaseModel):
    partition_key: str
    expected: bool | None = Field(description="A key a producer's tick in the range expects")
    missing: bool = Field(description="Expected, and no event carries it")
    events: int
    last_event: KeyEvent | None
    consumers: list[ConsumerCell]


class PartitionConsumer(BaseModel):
    dag_id: str
    partitioned: bool = Field(description="On a PartitionedAssetTimetable: runs per key")
    mapper: str | None
    error: str | None


class PartitionProducer(BaseModel):
    dag_id: str
    timetable: str | None


class PartitionRange(BaseModel):
    start: str
    end: str
    expected: int
    missing: int


class AssetPartitions(Page[PartitionRow]):
    asset: str
    unkeyed_events: int = Field(description="Events without a partition key")
    consumers: list[PartitionConsumer]
    producers: list[PartitionProducer] = Field(
        description="Producing DAGs on a CronPartitionTimetable"
    )
    range: PartitionRange | None


class EmitRequest(RequestBody):
    asset: str = Field(description="The asset's name")
    extra: dict[str, Any] | None = Field(default=None, description="A JSON object: its extra")
    partition_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PARTITION_KEY_LENGTH,
        description="The slice of the asset the event updated (None: unpartitioned)",
    )


class EmittedEvent(BaseModel):
    asset: str
    event_id: int
    created_by: str
    partition_key: str | None = None


class GraphNode(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = Field(description="asset:NAME, watcher:ASSET/NAME, task:DAG/TASK or dag:DAG")
    kind: Literal["asset", "watcher", "task", "dag"]
    label: str


class GraphEdge(BaseModel):
    source: str
    target: str
    kind: Literal["updates", "schedules", "runs"]


class AssetGraph(BaseModel):
    nodes: list[GraphNode]
    edges: list[GraphEdge]


@router.get("/assets", response_model=Page[AssetItem], summary="Assets")
async def list_assets(
    _: ReaderDep,
    database: DatabaseDep,
    search: Search = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> ViewPage[assets_view.AssetItem]:
    query = partial(assets_view.list_assets, search=search, limit=limit, offset=offset)
    return await read(database, query)


@router.get(
    "/assets/{name:path}/partitions",
    response_model=AssetPartitions,
    summary="An asset's partitions: events and consumer runs per key",
    responses={422: {"description": "A range that cannot be listed"}},
)
async def asset_partitions(
    _: ReaderDep,
    database: DatabaseDep,
    name: str,
    start: Annotated[BoundedDate | None, Query(alias="from")] = None,
    end: Annotated[BoundedDate | None, Query(alias="to")] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> partitions_view.AssetPartitions:
    if start is not None and end is None:
        end = utcnow()
    query = partial(
        partitions_view.asset_partitions,
        name=name,
        start=start,
        end=end,
        limit=limit,
        offset=offset,
    )
    try:
        shown = await read(database, query)
    except partitions_view.PartitionRangeError as exc:
        invalid(str(exc))
    return found(shown, f"no asset {name!r}")


@router.get("/assets/{name:path}", response_model=AssetItem, summary="One asset")
async def show_asset(_: ReaderDep, database: DatabaseDep, name: str) -> assets_view.AssetItem:
    shown = await read(database, partial(assets_view.show_asset, name=name))
    return found(shown, f"no asset {name!r}")


@router.get(
    "/asset-events",
    response_model=Page[AssetEventItem],
    summary="Asset events",
    responses={404: {"description": "No asset has the name given as ?asset="}},
)
async def list_asset_events(
    _: ReaderDep,
    database: DatabaseDep,
    asset: str | None = None,
    source: SourceName | None = None,
    since: FilterDate | None = None,
    partition_key: PartitionKey = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> ViewPage[assets_view.AssetEventItem]:
    query = partial(
        assets_view.list_asset_events,
        asset=asset,
        source=source,
        since=since,
        partition_key=partition_key,
        limit=limit,
        offset=offset,
    )
    return found(await read(database, query), f"no asset {asset!r}")


@router.post(
    "/asset-events",
    response_model=EmittedEvent,
    status_code=201,
    summary="Record an event of an asset (its DAGs run)",
)
async def emit_asset_event(
    who: OperatorDep, database: DatabaseDep, config: ConfigDep, body: EmitRequest
) -> EmittedEvent:
    actor = f"api:{who.username}"
    emit = partial(
        assets_sql.emit_asset_event,
        asset_name=body.asset,
        extra=body.extra,
        source=assets_sql.SOURCE_API,
        created_by=actor,
        partition_key=body.partition_key,
        keep_while_paused=config.scheduler.keep_events_while_paused,
    )
    event_id: int = await act(database, emit)
    return EmittedEvent(
        asset=body.asset, event_id=event_id, created_by=actor, partition_key=body.partition_key
    )


@router.get("/asset-graph", response_model=AssetGraph, summary="The asset graph")
async def asset_graph(_: ReaderDep, database: DatabaseDep) -> assets_view.AssetGraph:
    return await read(database, assets_view.asset_graph)
