"""Broker watchers that key their events from the message (``partition_key_*``), without a
broker: the rule's checks, the key each option takes, and the rejection of a message that
gives no valid key (its siblings in a batch keep theirs)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import shared_stream.subscriber
from producers import (
    KafkaMessage,
    KafkaMessageBatch,
    KafkaMessageTrigger,
    MessageQueueTrigger,
    SqsMessage,
    SqsMessageTrigger,
)
from producers.exceptions import ProducerConfigError

if TYPE_CHECKING:
    from triggers.base import TriggerEvent

KAFKA: dict[str, Any] = {
    "topics": ["orders"],
    "bootstrap_servers": "b:9092",
    "group_id": "g",
    "dead_letter_topic": "orders-dlt",
}
QUEUE = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"


def region_of(message: KafkaMessage | SqsMessage) -> Any:
    """A ``partition_key_function``: the key is the ``region`` of the value / body."""
    body = message.body if isinstance(message, SqsMessage) else json.loads(message.value or b"")
    if body.get("region") == "boom":
        raise RuntimeError("no region today")
    return body.get("region")


async def async_region_of(message: KafkaMessage) -> str:
    return "eu"


def _msg(
    value: Any, *, offset: int = 0, key: bytes | None = b"k", headers: Any = ()
) -> KafkaMessage:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return KafkaMessage("orders", 0, offset, key, raw, headers=tuple(headers))


async def _judged(trigger: KafkaMessageTrigger, *raws: Any) -> list[TriggerEvent]:
    async def stream() -> Any:
        for raw in raws:
            yield raw

    with anyio.fail_after(5):
        return [event async for event in trigger.filter_shared_stream(stream())]


async def _key_or_rejection(trigger: KafkaMessageTrigger, message: KafkaMessage) -> str:
    """The event's partition key, or ``rejected: <reason>``."""
    events = await _judged(trigger, message)
    if events:
        assert len(events) == 1 and events[0].partition_key is not None
        return events[0].partition_key
    assert [r.trigger_id for r in message.rejections] == [trigger.trigger_id]
    return "rejected: " + message.rejections[0].reason


# -- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"partition_key_field": "region", "partition_key_header": "region"}, "at most one"),
        ({"partition_key_field": "a..b"}, "empty part"),
        ({"partition_key_field": ""}, "non-empty str"),
        ({"partition_key_header": 3}, "non-empty str"),
        ({"partition_key_header": 0}, "non-empty str"),
        ({"partition_key_function": "region_of"}, "dotted path"),
        ({"partition_key_from_key": "yes"}, "True or False"),
    ],
)
def test_a_rule_that_cannot_work_is_refused_where_the_watcher_is_declared(
    options: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ProducerConfigError, match=problem):
        KafkaMessageTrigger(**KAFKA, **options)


def test_a_keyed_kafka_watcher_must_say_where_a_keyless_message_goes() -> None:
    """Without a dead-letter topic the implicit on_unclean is "stop": one message without a
    key would stop its partition for good, so the watcher is refused at parse time."""
    no_dlt = {**KAFKA, "dead_letter_topic": None}
    with pytest.raises(ProducerConfigError, match="dead_letter_topic") as refused:
        KafkaMessageTrigger(**no_dlt, partition_key_field="region")
    assert "partition_key_field='region'" in str(refused.value)
    for chosen in ("commit", "stop"):  # an explicit choice is the user's
        KafkaMessageTrigger(**no_dlt, on_unclean=chosen, partition_key_field="region")
    KafkaMessageTrigger(**no_dlt)  # an unkeyed watcher as before


@pytest.mark.parametrize(
    "options",
    [
        {"partition_key_field": "order.region"},
        {"partition_key_header": "region"},
        {"partition_key_from_key": True},
        {"partition_key_function": "tests.unit.producers.test_partition_keys.region_of"},
    ],
)
def test_the_rule_round_trips_through_serialize(options: dict[str, Any]) -> None:
    trigger = KafkaMessageTrigger(**KAFKA, **options)
    _classpath, kwargs = trigger.serialize()
    assert {k: v for k, v in kwargs.items() if k.startswith("partition_key")} == options
    rebuilt = KafkaMessageTrigger(**kwargs)
    assert rebuilt == trigger and rebuilt.partition_key_rule == trigger.partition_key_rule
    assert not any(
        k.startswith("partition_key") for k in KafkaMessageTrigger(**KAFKA).serialize()[1]
    )


def test_message_queue_trigger_passes_the_rule_on() -> None:
    kafka = MessageQueueTrigger(scheme="kafka", **KAFKA, partition_key_field="region")
    sqs = MessageQueueTrigger(scheme="sqs", sqs_queue=QUEUE, partition_key_attribute="region")
    assert isinstance(kafka, KafkaMessageTrigger) and isinstance(sqs, SqsMessageTrigger)
    assert kafka.serialize()[1]["partition_key_field"] == "region"
    assert sqs.serialize()[1]["partition_key_attribute"] == "region"


# -- Kafka: the key of each option -----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ({"order": {"region": "eu"}}, "eu"),
        ({"order": {"region": 7}}, "7"),
        ({"order": {"region": 2.5}}, "2.5"),
        (
            b'{"order": {"region": NaN}}',
            "rejected: no partition key (partition_key_field="
            "'order.region'): field 'order.region' is nan, not a partition key",
        ),
        ({"order": {"region": "x" * 250}}, "x" * 250),
        ({"order": {"region": "x" * 251}}, "rejected: no partition key (partition_key_field="),
        (
            {"order": {}},
            "rejected: no partition key (partition_key_field='order.region'): "
            "field 'order.region' is missing",
        ),
        (
            {"order": "eu"},
            "rejected: no partition key (partition_key_field='order.region'): "
            "field 'order' is not a JSON object",
        ),
        (
            {"order": {"region": None}},
            "rejected: no partition key (partition_key_field="
            "'order.region'): field 'order.region' is null, not a partition key",
        ),
        (
            {"order": {"region": True}},
            "rejected: no partition key (partition_key_field="
            "'order.region'): field 'order.region' is bool, not a partition key",
        ),
        (
            {"order": {"region": ""}},
            "rejected: no partition key (partition_key_field="
            "'order.region'): field 'order.region': a partition key must not be empty",
        ),
        ({"order": {"region": ["eu"]}}, "rejected: no partition key (partition_key_field="),
        (
            b"plain text",
            "rejected: no partition key (partition_key_field='order.region'): "
            "the value is not JSON",
        ),
    ],
)
async def test_a_field_s_value_is_the_key_and_a_missing_or_bad_one_rejects_the_message(
    value: Any, key: str
) -> None:
    trigger = KafkaMessageTrigger(**KAFKA, partition_key_field="order.region")
    trigger.trigger_id = 7
    assert (await _key_or_rejection(trigger, _msg(value))).startswith(key)


async def test_a_header_the_message_key_or_a_function_gives_the_key() -> None:
    header = KafkaMessageTrigger(**KAFKA, partition_key_header="region")
    own_key = KafkaMessageTrigger(**KAFKA, partition_key_from_key=True)
    function = KafkaMessageTrigger(
        **KAFKA, partition_key_function="tests.unit.producers.test_partition_keys.region_of"
    )
    for trigger, tid in ((header, 1), (own_key, 2), (function, 3)):
        trigger.trigger_id = tid
    eu = {"region": "eu"}
    assert await _key_or_rejection(header, _msg(eu, headers=[("region", b"us")])) == "us"
    repeated = [("region", b"us"), ("region", b"eu")]
    assert await _key_or_rejection(header, _msg(eu, headers=repeated)) == "us"  # the first
    assert "header 'region' is missing" in await _key_or_rejection(header, _msg(eu))
    not_text = _msg(eu, headers=[("region", b"\xff")])
    assert "header 'region' is not UTF-8 text" in await _key_or_rejection(header, not_text)
    assert await _key_or_rejection(own_key, _msg(eu, key=b"customer-9")) == "customer-9"
    assert "the message has no key" in await _key_or_rejection(own_key, _msg(eu, key=None))
    assert await _key_or_rejection(function, _msg(eu)) == "eu"
    raised = await _key_or_rejection(function, _msg({"region": "boom"}))
    assert "the function raised RuntimeError: no region today" in raised
    assert "the function's result is null" in await _key_or_rejection(function, _msg({}))


async def test_an_async_or_missing_key_function_fails_the_watcher_when_it_starts() -> None:
    for path, problem in (
        ("tests.unit.producers.test_partition_keys.async_region_of", "is async"),
        ("tests.unit.producers.test_partition_keys.nowhere", "cannot be imported"),
    ):
        trigger = KafkaMessageTrigger(**KAFKA, partition_key_function=path)
        with pytest.raises(ProducerConfigError, match=problem):
            await _judged(trigger, _msg({}))


async def test_a_keyless_message_is_rejected_alone_in_its_batch_and_logged_by_offset(
    caplog: pytest.LogCaptureFixture,
) -> None:
    trigger = KafkaMessageTrigger(**KAFKA, partition_key_field="region")
    trigger.trigger_id = 5
    values = [{"region": "eu"}, {"n": 1}, {"region": "us"}]
    batch = KafkaMessageBatch("orders", 0, [_msg(v, offset=o) for o, v in enumerate(values)])
    with caplog.at_level(logging.WARNING, logger="producers.kafka_trigger"):
        events = await _judged(trigger, batch)
    assert [(e.payload["offset"], e.partition_key) for e in events] == [(0, "eu"), (2, "us")]
    assert [e.dedup_key for e in events] == ["kafka:orders:0:0", "kafka:orders:0:2"]
    assert [bool(m.rejections) for m in batch.messages] == [False, True, False]
    (record,) = [r for r in caplog.records if getattr(r, "action", "") == "kafka.no_partition_key"]
    assert record.trigger_id == 5
    assert "orders/0/1" in record.getMessage()
    assert "field 'region' is missing" in record.getMessage()


async def test_sibling_watchers_key_the_same_message_each_by_its_own_rule() -> None:
    by_region = KafkaMessageTrigger(**KAFKA, partition_key_field="region")
    by_day = KafkaMessageTrigger(**KAFKA, partition_key_field="day")
    unkeyed = KafkaMessageTrigger(**KAFKA)
    assert by_region.shared_stream_key() == by_day.shared_stream_key()  # one consumer
    message = _msg({"region": "eu", "day": "2026-03-10"})
    keys = [
        [e.partition_key for e in await _judged(t, message)] for t in (by_region, by_day, unkeyed)
    ]
    assert keys == [["eu"], ["2026-03-10"], [None]]


async def test_the_filter_decides_first_a_message_it_skips_needs_no_key() -> None:
    trigger = KafkaMessageTrigger(
        **KAFKA, match_fields={"kind": "order"}, partition_key_field="region"
    )
    message = _msg({"kind": "refund"})
    assert await _judged(trigger, message) == []
    assert message.rejections == ()


# -- SQS -------------------------------------------------------------------------------------


def _sqs(body: Any, **attributes: Any) -> SqsMessage:
    return SqsMessage("m-1", body, json.dumps(body), {}, attributes, None)


async def _sqs_judged(
    trigger: SqsMessageTrigger, message: SqsMessage, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[TriggerEvent], int]:
    """The trigger's events for ``message``, and how often it rejected it."""
    rejected: list[None] = []
    monkeypatch.setattr(
        shared_stream.subscriber, "reject_shared_stream_event", lambda: rejected.append(None)
    )

    async def stream() -> Any:
        yield message

    with anyio.fail_after(5):
        events = [event async for event in trigger.filter_shared_stream(stream())]
    return events, len(rejected)


@pytest.mark.parametrize(
    ("options", "message", "key"),
    [
        ({"partition_key_field": "where.region"}, _sqs({"where": {"region": "eu"}}), "eu"),
        ({"partition_key_field": "n"}, _sqs({"n": 12}), "12"),
        ({"partition_key_attribute": "region"}, _sqs({}, region="us"), "us"),
        ({"partition_key_attribute": "region"}, _sqs({}, region=b"ap"), "ap"),
        (
            {"partition_key_function": "tests.unit.producers.test_partition_keys.region_of"},
            _sqs({"region": "eu"}),
            "eu",
        ),
    ],
)
async def test_an_sqs_watcher_keys_its_events(
    options: dict[str, Any], message: SqsMessage, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    trigger = SqsMessageTrigger(queue_url=QUEUE, **options)
    events, rejected = await _sqs_judged(trigger, message, monkeypatch)
    assert ([e.partition_key for e in events], rejected) == ([key], 0)
    assert events[0].dedup_key == "sqs:m-1"
    assert SqsMessageTrigger(**trigger.serialize()[1]) == trigger


@pytest.mark.parametrize(
    ("options", "message", "reason"),
    [
        ({"partition_key_field": "region"}, _sqs({}), "field 'region' is missing"),
        ({"partition_key_field": "region"}, _sqs("plain text"), "the body is not a JSON object"),
        ({"partition_key_attribute": "region"}, _sqs({}), "message attribute 'region' is missing"),
    ],
)
async def test_an_sqs_message_without_a_valid_key_is_rejected_and_logged_by_id(
    options: dict[str, Any],
    message: SqsMessage,
    reason: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    trigger = SqsMessageTrigger(queue_url=QUEUE, **options)
    with caplog.at_level(logging.WARNING, logger="producers.sqs_trigger"):
        events, rejected = await _sqs_judged(trigger, message, monkeypatch)
    assert (events, rejected) == ([], 1)
    (record,) = [r for r in caplog.records if getattr(r, "action", "") == "sqs.message_rejected"]
    assert record.message_id == "m-1"
    assert reason in record.getMessage()
    assert "no partition key" in record.getMessage()


def test_an_sqs_watcher_takes_at_most_one_rule() -> None:
    with pytest.raises(ProducerConfigError, match="at most one"):
        SqsMessageTrigger(queue_url=QUEUE, partition_key_field="a", partition_key_attribute="b")
