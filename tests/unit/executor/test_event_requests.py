"""A page of triggering events as the executor answers it (``engine.executor.event_requests``)
and the answer line that carries it (``engine.channel_server``'s ``EncodedValue``); the
task's side, ``LazyAssetEvents``, against a reader that counts its requests."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from engine.authoring.assets import Asset
from engine.channel_server import EncodedValue, RequestError, RequestServer, _encoded
from engine.db.queries.assets import EventRow
from engine.execution.asset_events import AssetEvents
from engine.execution.triggering_events import LazyAssetEvents, read_all
from engine.executor.event_requests import event_json, page_text
from triggers.serde import serialize_value

AT = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def _row(event_id: int, payload: Any = None, name: str = "orders") -> EventRow:
    return EventRow(event_id, name, payload, AT, "w", partition_key="p")


def test_an_event_carries_its_payload_as_stored_and_its_time_in_iso_8601() -> None:
    stored = serialize_value({"at": AT, "raw": b"\x01"})
    event = json.loads(event_json(_row(7, stored)))
    assert event["payload"] == stored  # not decoded: the task's process decodes it
    assert event["timestamp"] == AT.isoformat()
    assert (event["id"], event["asset"], event["uri"], event["extra"]) == (
        7,
        "orders",
        "orders",
        {},
    )
    assert event["partition_key"] == "p"


@pytest.mark.parametrize(
    ("rows", "limit", "max_bytes", "ids", "more"),
    [
        (3, 5, 10_000, [1, 2, 3], False),  # all of them
        (4, 3, 10_000, [1, 2, 3], True),  # one row past the limit: more
        (3, 3, 10_000, [1, 2, 3], False),  # exactly the limit
        (4, 9, 1_200, [1, 2], True),  # the byte limit stops the page first
    ],
)
def test_a_page_stops_at_its_row_or_byte_limit_and_says_whether_more_remain(
    rows: int, limit: int, max_bytes: int, ids: list[int], more: bool
) -> None:
    events = [_row(i, {"v": "x" * 200}) for i in range(1, rows + 1)]
    page = json.loads(page_text(events, limit=limit, max_bytes=max_bytes))
    assert [e["id"] for e in page["events"]] == ids
    assert page["more"] is more
    assert len(page_text(events, limit=limit, max_bytes=max_bytes)) <= max_bytes + 30


def test_an_event_over_the_byte_limit_on_its_own_is_an_error_naming_it() -> None:
    with pytest.raises(RequestError, match=r"asset event 4 of 'orders' is [\d,]+ bytes"):
        page_text([_row(4, "x" * 1000)], limit=10, max_bytes=500)


async def test_an_encoded_value_goes_into_the_answer_as_it_is() -> None:
    server = RequestServer()

    async def page() -> EncodedValue:
        return EncodedValue('{"more":false,"events":[{"id":1}]}')

    server.handlers["page"] = page
    answer = await server.answer(b'{"id": 5, "kind": "page"}')
    assert answer == {"id": 5, "ok": True, "value": EncodedValue(answer["value"].text)}
    line = json.loads(_encoded(answer))
    assert line == {"id": 5, "ok": True, "value": {"more": False, "events": [{"id": 1}]}}


class Reader:
    """Pages of ``count`` events (odd ids ``orders``, even ``prices``), ``size`` a page."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self.asked: list[int | None] = []

    def triggering_events(self, *, after_id: int | None, limit: int) -> dict[str, Any]:
        self.asked.append(after_id)
        first = (after_id or 0) + 1
        ids = range(first, min(first + min(limit, self.size), self.count + 1))
        rows = [_row(i, serialize_value({"i": i}), "orders" if i % 2 else "prices") for i in ids]
        return {"more": ids.stop <= self.count, "events": [json.loads(event_json(r)) for r in rows]}


def test_reading_asks_page_after_page_in_id_order_and_decodes_each_payload_once() -> None:
    reader = Reader(count=10, size=4)
    events = read_all(reader)
    assert reader.asked == [None, 4, 8]
    assert [e.id for e in events["orders"]] == [1, 3, 5, 7, 9]
    assert events["prices"][0].payload == {"i": 2}
    assert events["prices"][0].timestamp == AT


def test_nothing_is_asked_until_the_events_are_read_and_then_only_once() -> None:
    reader = Reader(count=3, size=10)
    events = LazyAssetEvents(reader)
    context = {"triggering_asset_events": events}
    assert dict(context)["triggering_asset_events"] is events and reader.asked == []
    assert len(events) == 2 and reader.asked == [None]
    assert [e.id for e in events[Asset("orders")]] == [1, 3]
    assert "prices" in events and events.get("nope") is None
    assert reader.asked == [None]  # read once, kept


@pytest.mark.parametrize(
    "use",
    [
        lambda e: list(e),
        lambda e: dict(e),
        lambda e: {**e},
        lambda e: list(e.items()),
        lambda e: repr(e),
        lambda e: e == {},
        lambda e: bool(e),
        lambda e: json.dumps(e, default=str),
        lambda e: copy.deepcopy(e),
    ],
)
def test_every_way_of_reading_reads_the_events_first(use: Any) -> None:
    reader = Reader(count=3, size=10)
    use(LazyAssetEvents(reader))
    assert reader.asked == [None]


def test_it_is_a_mapping_as_airflows_accessor_and_json_reads_it_through_its_repr() -> None:
    events = LazyAssetEvents(Reader(count=2, size=10))
    assert isinstance(events, Mapping) and not isinstance(events, dict)
    assert json.loads(json.dumps(events, default=str)) == repr(events)
    with pytest.raises(TypeError, match="not JSON serializable"):
        json.dumps(events)  # never a silent "{}" before the first read


def test_a_copy_or_a_pickle_is_the_eager_events() -> None:
    events = LazyAssetEvents(Reader(count=2, size=10))
    for twin in (copy.copy(events), pickle.loads(pickle.dumps(events))):
        assert type(twin) is AssetEvents and twin == events
        assert [e.id for e in twin["orders"]] == [1]
