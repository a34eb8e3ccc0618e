"""Shared-stream groups of the live triggerers (the CLI's ``sluice streams list``).

- ``GET /streams``: a page of groups by triggerer then key (``?key=&history=``): the
  broker it reads, mode, subscribers, outstanding events per lane and in all, the age of
  the oldest unresolved event, the advance rate, counters (the events dead-lettered among
  them), and (``history``, default on) the last samples for a sparkline.
"""

from functools import partial

from fastapi import APIRouter
from pydantic import BaseModel, Field

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.rest.common import Limit, Offset, Page, read
from engine.api.security import ReaderDep
from engine.db.models import utcnow
from engine.views import streams as streams_view
from engine.views.common import Page as ViewPage

router = APIRouter(tags=["shared streams"])


class StreamSample(BaseModel):
    at: str
    triggerer_id: int
    outstanding: int
    oldest_unresolved_age_s: float | None
    advanced_events: int


class StreamGroup(BaseModel):
    triggerer_id: int
    key: str
    broker: str = Field(
        description="What the group reads: the key's first element when it is a string "
        "(kafka, sqs, rabbitmq, redis, nats, mqtt, directory-scan), else the trigger class name"
    )
    mode: str = Field(description="fast or ack")
    subscribers: int
    outstanding_by_lane: dict[str, int] = Field(
        description="Events not advanced, per lane (the 20 busiest; the others summed)"
    )
    lanes: int = Field(description="Lanes with events not advanced")
    outstanding: int = Field(description="Events not advanced, all lanes")
    oldest_unresolved_age_s: float | None
    advance_rate_per_s: float | None = Field(description="Events advanced per second lately")
    queue_high_water: int
    events_polled: int
    deliveries: int
    advances: int
    advanced_events: int
    last_advance_batch: int
    advance_latency_sum_s: float
    overflows: int
    ack_timeouts: int
    rejects: int
    dead_lettered: int = Field(
        description="Events advanced with a rejected outcome: sent the dead-letter way"
    )
    snapshot_age_s: float | None
    history: list[StreamSample] | None = Field(
        default=None, description="The last samples, oldest first"
    )


@router.get("/streams", response_model=Page[StreamGroup], summary="Shared-stream groups")
async def list_streams(
    _: ReaderDep,
    database: DatabaseDep,
    config: ConfigDep,
    key: str | None = None,
    history: bool = True,
    limit: Limit = 50,
    offset: Offset = 0,
) -> ViewPage[streams_view.StreamGroup]:
    query = partial(
        streams_view.list_stream_groups,
        now=utcnow(),
        config=config,
        key=key,
        history=history,
        limit=limit,
        offset=offset,
    )
    return await read(database, query)
