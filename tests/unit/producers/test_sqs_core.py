"""The pure parts of the SQS adapter: dispositions, settings, error translation, in-flight
bookkeeping, message parsing and ``SqsMessageTrigger``'s filter and serialization."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError
from hypothesis import given
from hypothesis import strategies as st

from producers import SqsConnection, SqsMessage, SqsMessageTrigger, SqsReceipt
from producers.exceptions import (
    BrokerRequestFailed,
    BrokerUnavailable,
    EventFilterError,
    ProducerConfigError,
    ProducerError,
)
from producers.sqs_core import (
    Disposition,
    InFlight,
    InFlightMessages,
    check_settings,
    disposition_of,
    parse_message,
)
from producers.sqs_errors import translate_error, translated
from shared_stream import AdvanceOutcome
from triggers.exceptions import TriggerContractError

URL = "http://127.0.0.1:1/123456789012/q"


@pytest.mark.parametrize(
    ("acked", "failed", "rejected", "on_reject", "expected"),
    [
        (2, 0, 0, "leave", Disposition.DELETE),
        (2, 0, 0, "dead_letter", Disposition.DELETE),
        (1, 1, 0, "dead_letter", Disposition.MAKE_VISIBLE),
        (0, 0, 0, "leave", Disposition.MAKE_VISIBLE),  # zero-subscriber broadcast
        (1, 0, 1, "leave", Disposition.LEAVE),
        (1, 0, 1, "visible", Disposition.MAKE_VISIBLE),
        (1, 0, 1, "dead_letter", Disposition.DEAD_LETTER),
        (0, 1, 1, "dead_letter", Disposition.DEAD_LETTER),  # a reject outweighs a failure
    ],
)
def test_disposition_of(acked, failed, rejected, on_reject, expected) -> None:
    assert disposition_of(AdvanceOutcome(acked, failed, rejected), on_reject) is expected


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"on_reject": "drop"}, "on_reject='drop'"),
        ({"on_reject": "dead_letter"}, "needs dead_letter_queue_url"),
        ({"visibility_timeout_s": 0}, "visibility timeout of 0s"),
        ({"wait_time_s": 21}, "wait_time_s=21"),
        ({"wait_time_s": 0}, "wait_time_s=0"),
        ({"max_in_flight": 0}, "max_in_flight=0"),
    ],
)
def test_settings_that_cannot_work_are_refused(kwargs, problem) -> None:
    with pytest.raises(ProducerConfigError, match=problem):
        check_settings(**kwargs)
    with pytest.raises(ProducerConfigError, match=f"SqsMessageTrigger on {URL}"):
        SqsMessageTrigger(queue_url=URL, **kwargs)


def test_good_settings_pass() -> None:
    check_settings(on_reject="dead_letter", dead_letter_queue_url=URL, visibility_timeout_s=30)


def _client_error(code: str, status: int) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": "boom"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, "ReceiveMessage")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_client_error("AWS.SimpleQueueService.NonExistentQueue", 400), ProducerConfigError),
        (_client_error("InvalidClientTokenId", 403), ProducerConfigError),
        (_client_error("InternalError", 500), BrokerUnavailable),
        (_client_error("ThrottlingException", 400), BrokerUnavailable),
        (_client_error("InvalidParameterValue", 400), BrokerRequestFailed),
        (EndpointConnectionError(endpoint_url="http://x"), BrokerUnavailable),
        (NoCredentialsError(), ProducerConfigError),
        (ConnectionRefusedError(), BrokerUnavailable),
        (TimeoutError(), BrokerUnavailable),
    ],
)
def test_errors_are_translated(error, expected) -> None:
    translated_error = translate_error(error, action="ReceiveMessage", queue_url=URL)
    assert type(translated_error) is expected
    assert f"SQS ReceiveMessage on {URL}" in str(translated_error)


def test_translated_keeps_the_cause_and_lets_other_errors_through() -> None:
    error = EndpointConnectionError(endpoint_url="http://x")
    with pytest.raises(BrokerUnavailable) as info, translated("DeleteMessageBatch", URL):
        raise error
    assert info.value.__cause__ is error
    with pytest.raises(KeyError), translated("DeleteMessageBatch", URL):
        raise KeyError("not an I/O error")


def test_parse_message() -> None:
    raw = {
        "MessageId": "m1",
        "ReceiptHandle": "h1",
        "Body": json.dumps({"a": [1, 2]}),
        "Attributes": {"MessageGroupId": "g", "ApproximateReceiveCount": "1"},
        "MessageAttributes": {
            "text": {"DataType": "String", "StringValue": "x"},
            "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
        },
    }
    message, receipt = parse_message(raw)
    assert receipt == SqsReceipt("h1", "m1", "g")
    assert message.body == {"a": [1, 2]}
    assert message.message_attributes == {"text": "x", "blob": b"\x00\x01"}
    assert message.group_id == "g"
    text, _ = parse_message({**raw, "Body": "{not json", "Attributes": {}})
    assert (text.body, text.raw_body, text.group_id) == ("{not json", "{not json", None)


def _entry(handle: str, at: float) -> InFlight:
    return InFlight(SqsReceipt(handle, f"id-{handle}", None), "body", {}, extended_at=at)


def test_in_flight_messages_extend_oldest_first_and_forget_advanced_ones() -> None:
    tracker = InFlightMessages()
    assert tracker.next_due(5) is None
    for handle, at in (("a", 0.0), ("b", 1.0), ("c", 2.0)):
        tracker.add(_entry(handle, at))
    assert tracker.next_due(5) == 5.0
    due = tracker.due(6.5, 5)
    assert [e.receipt.receipt_handle for e in due] == ["a", "b"]
    tracker.pop("b")  # advanced while its extension was in flight
    tracker.extended(due, 6.5, stale=[])
    assert tracker.next_due(5) == 7.0  # "c" is now the oldest
    assert [e.receipt.receipt_handle for e in tracker.due(12, 5)] == ["c", "a"]
    assert len(tracker) == 2


def test_a_stale_entry_is_no_longer_extended_but_still_advanced() -> None:
    tracker = InFlightMessages()
    stale = _entry("a", 0.0)
    tracker.add(stale)
    tracker.add(_entry("b", 0.0))
    due = tracker.due(10, 5)
    tracker.extended(due, 10, stale=[stale])
    assert [e.receipt.receipt_handle for e in tracker.due(100, 5)] == ["b"]
    assert tracker.pop("a") is stale
    with pytest.raises(ProducerError, match="not in flight"):
        tracker.pop("a")
    assert [e.receipt.receipt_handle for e in tracker.drain()] == ["b"]
    assert len(tracker) == 0


@given(st.lists(st.tuples(st.sampled_from(["add", "pop", "beat"]), st.integers(0, 9))))
def test_next_due_is_always_the_oldest_extension(ops: list[tuple[str, int]]) -> None:
    tracker = InFlightMessages()
    now = 0.0
    live: dict[str, float] = {}
    for op, n in ops:
        now += 1.0
        handle = str(n)
        if op == "add" and handle not in live:
            tracker.add(_entry(handle, now))
            live[handle] = now
        elif op == "pop" and handle in live:
            tracker.pop(handle)
            del live[handle]
        elif op == "beat":
            due = tracker.due(now, 3)
            assert {e.receipt.receipt_handle for e in due} == {
                h for h, at in live.items() if at + 3 <= now
            }
            tracker.extended(due, now, stale=[])
            live.update((e.receipt.receipt_handle, now) for e in due)
        expected = min(live.values()) + 3 if live else None
        assert tracker.next_due(3) == expected


# -- the trigger ------------------------------------------------------------------------


def _message(body: Any, **attributes: Any) -> SqsMessage:
    raw = body if isinstance(body, str) else json.dumps(body)
    return SqsMessage("m1", json.loads(raw) if raw[:1] in "{[" else raw, raw, {}, attributes, None)


@pytest.mark.parametrize(
    ("filters", "message", "expected"),
    [
        ({}, _message("anything"), True),
        ({"body_filter": {"kind": "a"}}, _message({"kind": "a"}), True),
        ({"body_filter": {"kind": "a"}}, _message({"kind": "b"}), False),
        ({"body_filter": {"kind": ["a", "b"]}}, _message({"kind": "b"}), True),
        ({"body_filter": {"x.y": 1}}, _message({"x": {"y": 1}}), True),
        ({"body_filter": {"x.y": 1}}, _message({"x": 3}), False),
        ({"body_filter": {"flag": True}}, _message({"flag": 1}), False),
        ({"body_filter": {"flag": True}}, _message({"flag": True}), True),
        ({"body_filter": {"kind": "a"}}, _message({}), False),
        ({"attribute_filter": {"region": "eu"}}, _message({}, region="eu"), True),
        ({"attribute_filter": {"region": "eu"}}, _message({}), False),
        ({"attribute_filter": {"priority": 5}}, _message({}, priority="5"), True),
        ({"attribute_filter": {"flag": True}}, _message({}, flag="True"), False),
        (
            {"body_filter": {"kind": "a"}, "attribute_filter": {"region": "eu"}},
            _message({"kind": "a"}, region="us"),
            False,
        ),
    ],
)
def test_filters(filters, message, expected) -> None:
    assert SqsMessageTrigger(queue_url=URL, **filters).matches(message) is expected


@pytest.mark.parametrize("body", ["plain text", [1, 2]])
def test_a_body_filter_cannot_apply_to_a_body_that_is_not_an_object(body) -> None:
    trigger = SqsMessageTrigger(queue_url=URL, body_filter={"kind": "a"})
    with pytest.raises(EventFilterError, match="not a JSON object"):
        trigger.matches(_message(body))


def test_serialize_round_trips_and_the_key_is_the_queue() -> None:
    trigger = SqsMessageTrigger(
        queue_url=URL,
        endpoint_url="http://127.0.0.1:1",
        aws_access_key_id="AKID",
        aws_secret_access_key="SECRET-VALUE",
        body_filter={"kind": "a"},
        on_reject="visible",
        visibility_timeout_s=30,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "producers.sqs_trigger.SqsMessageTrigger"
    assert SqsMessageTrigger(**kwargs) == trigger
    sibling = SqsMessageTrigger(queue_url=URL, endpoint_url="http://127.0.0.1:1")
    assert sibling.shared_stream_key() == trigger.shared_stream_key()
    other = SqsMessageTrigger(queue_url=URL + "2", endpoint_url="http://127.0.0.1:1")
    assert other.shared_stream_key() != trigger.shared_stream_key()
    assert SqsMessageTrigger.uses_ack_mode()
    producer = SqsMessageTrigger.create_shared_stream_producer(kwargs)
    assert (producer.on_reject, producer.visibility_timeout_s) == ("visible", 30)
    for text in (repr(trigger), repr(producer), repr(producer.connection)):
        assert "SECRET-VALUE" not in text


def test_event_payload_and_connection_defaults() -> None:
    message = SqsMessage("m1", {"a": 1}, '{"a": 1}', {"SentTimestamp": "1"}, {"k": "v"}, None)
    assert SqsMessageTrigger.event_payload(message) == {
        "message_id": "m1",
        "body": {"a": 1},
        "attributes": {"SentTimestamp": "1"},
        "message_attributes": {"k": "v"},
    }
    assert SqsConnection(URL).client_kwargs()["endpoint_url"] is None


async def test_run_alone_is_refused() -> None:
    with pytest.raises(TriggerContractError, match="shared-stream subscriber"):
        await anext(aiter(SqsMessageTrigger(queue_url=URL).run()))
