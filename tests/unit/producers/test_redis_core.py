"""The pure pieces of the Redis Streams adapter and the trigger's construction: no server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.authoring.connections import Connection
from producers import RedisStreamTrigger
from producers.exceptions import ProducerConfigError
from producers.redis_core import (
    Disposition,
    InFlight,
    InFlightEntries,
    decode_body,
    disposition_of,
    make_entry,
    read_plan,
    redact_url,
    url_from_connection,
)
from shared_stream.producer import AdvanceOutcome


@pytest.mark.parametrize(
    ("capacity", "turn", "expected"),
    [
        (9, 0, (["a", "b", "c"], 3)),
        (4, 0, (["a", "b", "c"], 1)),
        (2, 0, (["a", "b"], 1)),
        (2, 1, (["b", "c"], 1)),
        (1, 2, (["c"], 1)),
    ],
)
def test_read_plan_never_asks_for_more_than_the_capacity(capacity, turn, expected) -> None:
    streams, count = read_plan(["a", "b", "c"], capacity, turn)
    assert (streams, count) == expected
    assert len(streams) * count <= capacity


@pytest.mark.parametrize(
    ("outcome", "disposition"),
    [
        (AdvanceOutcome(acked=2, failed=0), Disposition.ACK),
        (AdvanceOutcome(acked=1, failed=0, rejected=1), Disposition.DEAD_LETTER),
        (AdvanceOutcome(acked=1, failed=1, rejected=1), Disposition.DEAD_LETTER),
        (AdvanceOutcome(acked=1, failed=1), Disposition.REDELIVER),
        (AdvanceOutcome(acked=0, failed=0), Disposition.REDELIVER),  # no subscriber
    ],
)
def test_dispositions(outcome, disposition) -> None:
    assert disposition_of(outcome) is disposition


def test_bodies_and_fields_decode_to_json_safe_values() -> None:
    entry = make_entry("s", "1-0", {b"body": b'{"a": 1}', b"bin": b"\xff"}, "body", 1)
    assert (entry.body, entry.body_format) == ({"a": 1}, "json")
    assert entry.fields == {"body": '{"a": 1}', "bin": {"base64": "/w=="}}
    assert decode_body("not json") == ("not json", "text")
    assert decode_body(None) == (None, "missing")
    assert decode_body({"base64": "/w=="}) == ({"base64": "/w=="}, "base64")


def test_in_flight_entries_are_touched_least_recent_first() -> None:
    held = InFlightEntries()
    first, second = (InFlight("s", f"{n}-0", {}, 1, touched_at=float(n)) for n in (1, 2))
    held.add(first)
    held.add(second)
    assert held.next_due(10) == 11
    assert held.due(11.5, 10) == [first]
    held.touched([first], 11.5)
    assert held.due(12, 10) == [second]
    assert held.pop("s", "2-0") is second
    with pytest.raises(Exception, match="not in flight"):
        held.pop("s", "2-0")
    assert held.drain() == [first]
    assert len(held) == 0


def test_a_url_is_shown_without_its_credentials() -> None:
    assert redact_url("redis://user:hunter2@10.0.0.1:6380/4") == "redis://10.0.0.1:6380/4"
    assert redact_url("rediss://:p@[::1]:6379/0") == "rediss://[::1]:6379/0"


@pytest.mark.parametrize(
    ("uri", "url"),
    [
        ("redis://127.0.0.1:6379/11", "redis://127.0.0.1:6379/11"),
        ("redis://:p%40ss@cache:6380", "redis://:p%40ss@cache:6380/0"),
        ("redis://app:pw@cache:6380?db=3&ssl=true", "rediss://app:pw@cache:6380/3"),
        ("rediss://cache", "rediss://cache:6379/0"),
    ],
)
def test_the_uri_form_of_a_connection_gives_the_client_url(uri, url) -> None:
    connection = Connection.from_uri("redis_events", uri).to_dict()
    assert url_from_connection(connection) == url
    assert RedisStreamTrigger.connection_settings("redis_conn_id", connection) == {"url": url}


def test_the_trigger_round_trips_and_its_key_holds_no_password() -> None:
    trigger = RedisStreamTrigger(
        streams=["b", "a", "b"],
        group="g",
        url="redis://:hunter2@cache:6379/2",
        body_filter={"kind": "x"},
        partition_key_entry_field="region",
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "producers.redis_trigger.RedisStreamTrigger"
    again = RedisStreamTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert kwargs["streams"] == ["a", "b"]
    assert trigger.shared_stream_key() == ("redis", "redis://cache:6379/2", "g", ("a", "b"))
    assert "hunter2" not in repr(trigger)
    by_id = RedisStreamTrigger(stream="a", group="g", conn_id="events")
    assert by_id.serialize()[1]["redis_conn_id"] == "events"
    assert by_id.shared_stream_key() == ("redis", "connection:events", "g", ("a",))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"claim_idle_ms": 5}, "claim_idle_ms=5"),
        ({"max_deliveries": 0}, "max_deliveries=0"),
        ({"start_id": "latest"}, "start_id='latest'"),
        ({"block_ms": 0}, "block_ms=0"),
        ({"apply_function": "nodots"}, "apply_function must be a dotted path"),
        (
            {"partition_key_field": "a", "partition_key_entry_field": "b"},
            "at most one of",
        ),
        ({"redis_conn_id": "a", "conn_id": "b"}, "not both"),
    ],
)
def test_settings_that_cannot_work_are_refused(kwargs, match) -> None:
    with pytest.raises(ProducerConfigError, match=match):
        RedisStreamTrigger(stream="s", group="g", **kwargs)


def test_declaring_a_redis_watcher_imports_no_client() -> None:
    probe = (
        "import sys\nfrom producers import RedisStreamTrigger\n"
        "RedisStreamTrigger(stream='s', group='g')\n"
        "print(' '.join(m for m in ('redis', 'anyio', 'asyncio') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == []
