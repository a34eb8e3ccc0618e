"""Kafka trigger and producer logic without a broker: decoding, filters, settings, epochs."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections import deque
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from aiokafka import TopicPartition
from aiokafka import errors as kafka_errors
from hypothesis import given
from hypothesis import strategies as st

import producers.kafka as kafka_module
from producers import KafkaMessage, KafkaMessageTrigger, KafkaSharedStreamProducer, kafka_codec
from producers.exceptions import (
    BrokerRefused,
    BrokerRequestFailed,
    BrokerUnavailable,
    ProducerConfigError,
    UncleanEventError,
)
from producers.kafka_bootstrap import capture_bootstrap_errors
from producers.kafka_codec import Undecodable, decoded_value, event_payload
from producers.kafka_errors import translate_kafka_error
from producers.kafka_messages import KafkaOffset
from producers.kafka_partitions import PartitionBook
from producers.kafka_settings import KafkaSettings, resolve_on_unclean
from producers.kafka_unclean import dead_letter_headers
from shared_stream.producer import AdvanceItem, AdvanceOutcome
from tests.unit.producers.kafka_doubles import RecordingConsumer, recording_producer
from triggers.base import TriggerEvent
from triggers.exceptions import SerializationError
from triggers.serde import dumps_kwargs, is_plain_json, loads_kwargs

BASE: dict[str, Any] = {"topics": ["orders"], "bootstrap_servers": "b:9092", "group_id": "g"}
ORDERS = KafkaSettings(topics=("orders",), group_id="g", bootstrap_servers=("b:9092",))


def msg(
    value: bytes | None, *, key: bytes | None = b"k", offset: int = 0, **kw: Any
) -> KafkaMessage:
    return KafkaMessage("orders", kw.pop("partition", 0), offset, key, value, **kw)


async def judged(trigger: KafkaMessageTrigger, *messages: KafkaMessage) -> list[Any]:
    async def stream() -> Any:
        for message in messages:
            yield message

    with anyio.fail_after(5):
        return [event async for event in trigger.filter_shared_stream(stream())]


# -- decoding -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fmt", "expected"),
    [
        (b'{"a": 1}', "auto", ("json", {"a": 1})),
        (b"plain text", "auto", ("text", "plain text")),
        (b"\xff\xfe", "auto", ("base64", "//4=")),
        (None, "auto", ("null", None)),
        (b"7", "text", ("text", "7")),
        (b"7", "bytes", ("base64", "Nw==")),
        (b"[1, 2]", "json", ("json", [1, 2])),
    ],
)
def test_values_decode_per_format(value: bytes | None, fmt: str, expected: Any) -> None:
    assert decoded_value(msg(value), fmt) == expected


@pytest.mark.parametrize(("value", "fmt"), [(b"not json", "json"), (b"\xff", "text")])
def test_values_that_do_not_decode_as_the_format_are_undecodable(value: bytes, fmt: str) -> None:
    assert isinstance(decoded_value(msg(value), fmt), Undecodable)


def test_payload_has_coordinates_key_headers_and_is_computed_once() -> None:
    message = msg(b'{"n": 1}', key=b"\x00\xff", offset=7, headers=(("h", b"v"), ("b", b"\xff")))
    payload = event_payload(message, "auto")
    assert payload == {
        "topic": "orders",
        "partition": 0,
        "offset": 7,
        "timestamp": None,
        "key": {"base64": "AP8="},
        "headers": [["h", "v"], ["b", {"base64": "/w=="}]],
        "value": {"n": 1},
        "value_encoding": "json",
    }
    assert event_payload(message, "auto") is payload


# -- filtering ------------------------------------------------------------------------------


async def test_match_key_headers_and_dotted_fields() -> None:
    trigger = KafkaMessageTrigger(
        **BASE,
        match_key="k",
        match_headers={"kind": "order"},
        match_fields={"order.status": "paid"},
    )
    good = msg(b'{"order": {"status": "paid"}}', offset=1, headers=(("kind", b"order"),))
    others = [
        msg(b'{"order": {"status": "paid"}}', key=b"x", headers=(("kind", b"order"),)),
        msg(b'{"order": {"status": "paid"}}', headers=(("kind", b"refund"),)),
        msg(b'{"order": {"status": "new"}}', headers=(("kind", b"order"),)),
        msg(b"paid", headers=(("kind", b"order"),)),
    ]
    events = await judged(trigger, *others, good)
    assert [e.payload["offset"] for e in events] == [1]
    assert events[0].dedup_key == "kafka:orders:0:1"


def accept_even(message: KafkaMessage, modulo: int = 2) -> bool:
    value = json.loads(message.value or b"0")
    if value == "boom":
        raise ValueError("cannot judge boom")
    return bool(value % modulo == 0)


async def test_a_raising_filter_rejects_the_message_logs_it_and_keeps_going(
    caplog: pytest.LogCaptureFixture,
) -> None:
    trigger = KafkaMessageTrigger(**BASE, apply_function=f"{__name__}.accept_even")
    trigger.trigger_id = 42
    messages = [msg(b"1", offset=0), msg(b'"boom"', offset=1), msg(b"4", offset=2)]
    events = await judged(trigger, *messages)
    assert [e.payload["value"] for e in events] == [4]
    assert [(r.trigger_id, "cannot judge boom" in r.reason) for r in messages[1].rejections] == [
        (42, True)
    ]
    failed = [r for r in caplog.records if getattr(r, "action", None) == "kafka.filter_failed"]
    assert [(r.levelno, r.trigger_id) for r in failed] == [(logging.ERROR, 42)]


async def accept_second(message: KafkaMessage) -> bool:
    await anyio.lowlevel.checkpoint()
    return message.offset == 1


async def test_apply_function_gets_its_args_and_may_be_async() -> None:
    trigger = KafkaMessageTrigger(
        **BASE, apply_function=f"{__name__}.accept_even", apply_function_args=[3]
    )
    events = await judged(trigger, *(msg(b"%d" % n, offset=n) for n in range(7)))
    assert [e.payload["value"] for e in events] == [0, 3, 6]
    coroutine = KafkaMessageTrigger(**BASE, apply_function=f"{__name__}.accept_second")
    events = await judged(coroutine, *(msg(b"%d" % n, offset=n) for n in range(3)))
    assert [e.payload["offset"] for e in events] == [1]


async def test_undecodable_value_is_rejected_and_an_unimportable_filter_fails() -> None:
    trigger = KafkaMessageTrigger(**BASE, value_format="json")
    garbage = msg(b"{oops")
    assert await judged(trigger, garbage, msg(b"{}")) != []
    assert "not valid JSON" in garbage.rejections[0].reason
    missing = KafkaMessageTrigger(**BASE, apply_function="nowhere_at_all.f")
    with pytest.raises(ProducerConfigError, match="cannot import apply_function"):
        await judged(missing, msg(b"1"))


async def test_a_watcher_whose_consumer_settings_differ_from_the_shared_one_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = KafkaMessageTrigger(**BASE, dead_letter_topic="dlt-a")
    other = KafkaMessageTrigger(**BASE, dead_letter_topic="dlt-b", match_key="k")
    other.trigger_id = 5
    shared = KafkaMessageTrigger.create_shared_stream_producer(first.serialize()[1])
    same = KafkaMessageTrigger.create_shared_stream_producer(
        KafkaMessageTrigger(**BASE, dead_letter_topic="dlt-a", match_key="x").serialize()[1]
    )
    assert same.settings_digest == shared.settings_digest  # filters are not shared settings
    await judged(other, msg(b"1", settings_digest=shared.settings_digest), msg(b"2", offset=1))
    mismatches = [
        r for r in caplog.records if getattr(r, "action", None) == "kafka.settings_mismatch"
    ]
    assert [r.trigger_id for r in mismatches] == [5]  # once, not per message


# -- the trigger contract -------------------------------------------------------------------


def test_serialize_round_trips_and_siblings_share_one_key() -> None:
    red = KafkaMessageTrigger(**BASE, match_fields={"color": "red"}, sasl_plain_password=None)
    blue = KafkaMessageTrigger(
        topics="orders", bootstrap_servers=["b:9092"], group_id="g", match_key="blue"
    )
    classpath, kwargs = red.serialize()
    assert classpath == "producers.kafka_trigger.KafkaMessageTrigger"
    assert KafkaMessageTrigger(**kwargs) == red
    assert (
        red.shared_stream_key() == blue.shared_stream_key() == ("kafka", "b:9092", "g", ("orders",))
    )
    assert (
        KafkaMessageTrigger(**{**BASE, "group_id": "h"}).shared_stream_key()
        != red.shared_stream_key()
    )
    assert KafkaMessageTrigger.uses_ack_mode()
    producer = KafkaMessageTrigger.create_shared_stream_producer(kwargs)
    assert isinstance(producer, KafkaSharedStreamProducer)
    assert producer.get_advance_lane(KafkaOffset("orders", 3, 9)) == ("orders", 3)


# Trigger kwargs exactly as the trigger rows of users' databases hold them (written by
# KafkaMessageTrigger.serialize() before its settings became a KafkaSettings): each must
# load and serialize back to the same canonical text.
STORED_WITH_SERVERS: dict[str, Any] = {
    "topics": ["audit", "orders"],
    "bootstrap_servers": "b:9092,c:9093",
    "kafka_config_id": None,
    "group_id": "g",
    "apply_function": "json.loads",
    "apply_function_args": [1],
    "apply_function_kwargs": {"a": 2},
    "match_key": "k",
    "match_headers": {"h": "v"},
    "match_fields": {"order.status": "paid"},
    "value_format": "json",
    "dead_letter_topic": "dlt",
    "on_unclean": None,
    "auto_offset_reset": "latest",
    "session_timeout_ms": 10000,
    "heartbeat_interval_ms": 3000,
    "rebalance_timeout_ms": 20000,
    "client_id": "sluice",
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "PLAIN",
    "sasl_plain_username": "u",
    "sasl_plain_password": "pw",
    "ssl_cafile": None,
    "ssl_certfile": None,
    "ssl_keyfile": None,
    "ssl_password": None,
    "consumer_options": {"max_poll_interval_ms": 600000},
}
# servers from a connection the triggerer looks up: stored unchecked, filters at defaults
STORED_WITH_CONNECTION: dict[str, Any] = {
    **STORED_WITH_SERVERS,
    "topics": ["orders"],
    "bootstrap_servers": None,
    "kafka_config_id": "kafka_prod",
    "apply_function": None,
    "apply_function_args": [],
    "apply_function_kwargs": {},
    "match_key": None,
    "match_headers": {},
    "match_fields": {},
    "value_format": "auto",
    "dead_letter_topic": None,
    "sasl_mechanism": None,
    "sasl_plain_username": None,
    "sasl_plain_password": None,
    "consumer_options": {},
}
STORED_KWARGS = [STORED_WITH_SERVERS, STORED_WITH_CONNECTION]


@pytest.mark.parametrize("stored", STORED_KWARGS, ids=["servers", "connection"])
def test_stored_kwargs_load_and_serialize_to_the_same_text(stored: dict[str, Any]) -> None:
    loaded = loads_kwargs(dumps_kwargs(stored, owner="a trigger row"))
    classpath, kwargs = KafkaMessageTrigger(**loaded).serialize()
    assert classpath == "producers.kafka_trigger.KafkaMessageTrigger"
    assert kwargs == stored
    assert dumps_kwargs(kwargs, owner="t") == dumps_kwargs(stored, owner="t")


def test_secrets_never_show_in_reprs() -> None:
    trigger = KafkaMessageTrigger(
        **BASE,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="u",
        sasl_plain_password="hunter2",
    )
    producer = KafkaMessageTrigger.create_shared_stream_producer(trigger.serialize()[1])
    assert "hunter2" not in repr(trigger) + repr(producer) + repr(producer.settings)
    assert producer.settings.client_kwargs()["sasl_plain_password"] == "hunter2"


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"consumer_options": {"enable_auto_commit": True}}, "enable_auto_commit=True is refused"),
        ({"consumer_options": {"group_id": "x"}}, "may not set"),
        ({"on_unclean": "dead_letter"}, "needs dead_letter_topic"),
        ({"on_unclean": "maybe"}, "on_unclean must be one of"),
        ({"dead_letter_topic": "orders"}, "also a consumed topic"),
        ({"value_format": "xml"}, "value_format must be one of"),
        ({"apply_function": "not a path"}, "dotted path"),
        ({"security_protocol": "SASL_SSL"}, "sasl_mechanism"),
        ({"security_protocol": "TLS"}, "security_protocol must be one of"),
        ({"auto_offset_reset": "middle"}, "auto_offset_reset"),
        ({"bootstrap_servers": " , "}, "bootstrap_servers is empty"),
        ({"group_id": ""}, "needs a group_id"),
    ],
)
def test_settings_that_cannot_work_are_refused_at_construction(
    extra: dict[str, Any], match: str
) -> None:
    with pytest.raises(ProducerConfigError, match=match):
        KafkaMessageTrigger(**{**BASE, **extra})


def test_on_unclean_default_is_dead_letter_with_a_topic_else_stop() -> None:
    assert resolve_on_unclean(None, "dlt") == "dead_letter"
    assert resolve_on_unclean(None, None) == "stop"
    assert resolve_on_unclean("commit", None) == "commit"


# -- dead-letter headers and error translation ----------------------------------------------


def test_dead_letter_headers_say_why_and_which_watchers() -> None:
    message = msg(b"x", offset=5)
    message.note_rejection(7, "value is not valid JSON")
    item = AdvanceItem(KafkaOffset("orders", 0, 5), AdvanceOutcome(acked=2, failed=0, rejected=1))
    headers = dict(dead_letter_headers(item, message, "g"))
    assert headers["sluice.dead_letter.reason"] == b"rejected"
    assert headers["sluice.dead_letter.rejected_by"] == b"7"
    assert headers["sluice.dead_letter.source"] == b"orders/0/5"
    assert headers["sluice.dead_letter.outcome"] == b"acked=2 failed=0 rejected=1"
    assert json.loads(headers["sluice.dead_letter.errors"]) == [
        {"trigger_id": 7, "reason": "value is not valid JSON"}
    ]
    nobody = AdvanceItem(item.broker_payload, AdvanceOutcome(acked=0, failed=0))
    assert (
        dict(dead_letter_headers(nobody, msg(b"x"), "g"))["sluice.dead_letter.reason"]
        == b"no_subscribers"
    )


@pytest.mark.parametrize(
    ("error", "translated"),
    [
        (kafka_errors.KafkaConnectionError("down"), BrokerUnavailable),
        (kafka_errors.KafkaTimeoutError(), BrokerUnavailable),
        (kafka_errors.NotCoordinatorForGroupError(), BrokerUnavailable),
        (kafka_errors.TopicAuthorizationFailedError(), ProducerConfigError),
        (kafka_errors.AuthenticationFailedError(), ProducerConfigError),
        (kafka_errors.RecordTooLargeError(), BrokerRequestFailed),
    ],
)
def test_aiokafka_errors_are_translated(error: Exception, translated: type[Exception]) -> None:
    result = translate_kafka_error(error, doing="fetching", where="b:9092")
    assert type(result) is translated
    assert "b:9092" in str(result)


def test_an_unknown_topic_is_an_error_naming_it_not_an_unreachable_broker() -> None:
    error = translate_kafka_error(
        kafka_errors.UnknownTopicOrPartitionError(),
        doing="fetching",
        where="b:9092 group='g' topics=['ordrs']",
        address="b:9092",
    )
    assert type(error) is ProducerConfigError
    assert "topics=['ordrs']" in str(error) and "topic" in str(error)
    assert "unreachable" not in str(error)


def _bootstrap_fails(*errors: Exception) -> Exception:
    """What the producer raises for a bootstrap whose servers failed with ``errors`` (logged
    on aiokafka's logger as its ``bootstrap()`` does)."""
    kafka = logging.getLogger("aiokafka")
    with capture_bootstrap_errors() as failures:
        for error in errors:
            kafka.error('Unable connect to "%s:%s": %s', "b", 9092, error)
    down = kafka_errors.KafkaConnectionError("Unable to bootstrap from [('b', 9092, 0)]")
    return translate_kafka_error(
        down, doing="connecting", where="b:9092 group='g'", address="b:9092", bootstrap=failures
    )


def test_a_refused_sasl_login_is_a_refusal_naming_its_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiokafka")
    error = _bootstrap_fails(
        OSError(111, "Connect call failed"),
        kafka_errors.SaslAuthenticationFailed("Authentication failed: Invalid credentials"),
    )
    assert isinstance(error, BrokerRefused) and error.address == "b:9092"
    assert "SaslAuthenticationFailed: Authentication failed: Invalid credentials" in str(error)
    assert "unreachable" not in str(error)
    assert not caplog.records  # captured into the error, not logged apart from it


def test_an_unreachable_bootstrap_says_the_last_error_of_each_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiokafka")
    error = _bootstrap_fails(
        OSError(113, "No route to host"), ConnectionRefusedError(111, "Connect call failed")
    )
    assert isinstance(error, BrokerUnavailable)
    assert "b:9092: ConnectionRefusedError: [Errno 111] Connect call failed" in str(error)
    assert "No route" not in str(error)
    # outside a capture, the line is logged as aiokafka says it
    logging.getLogger("aiokafka").error('Unable connect to "%s:%s": %s', "b", 9092, "x")
    assert [r.getMessage() for r in caplog.records] == ['Unable connect to "b:9092": x']


def test_a_task_started_inside_a_capture_logs_after_it_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiokafka's background tasks inherit the capture's context: once the capture is
    closed, their lines are logged, not swallowed into a list nobody reads."""
    caplog.set_level(logging.DEBUG, logger="aiokafka")
    with capture_bootstrap_errors() as failures:
        inherited = contextvars.copy_context()
    inherited.run(
        logging.getLogger("aiokafka").error, 'Unable connect to "%s:%s": %s', "b", 9092, "late"
    )
    assert failures == []
    assert [r.getMessage() for r in caplog.records] == ['Unable connect to "b:9092": late']


def test_settings_build_client_settings() -> None:
    servers = replace(ORDERS, bootstrap_servers=("a:1", "b:2"))
    assert replace(servers, client_id="c").client_kwargs() == {
        "bootstrap_servers": ["a:1", "b:2"],
        "client_id": "c",
        "security_protocol": "PLAINTEXT",
    }
    with pytest.raises(ProducerConfigError, match="TLS context"):
        replace(servers, security_protocol="SSL", ssl_cafile="/nonexistent/ca.pem").client_kwargs()


# -- partition epochs -----------------------------------------------------------------------


def _items(key: tuple[str, int], offsets: list[int]) -> list[AdvanceItem]:
    return [AdvanceItem(KafkaOffset(*key, o), AdvanceOutcome(acked=1, failed=0)) for o in offsets]


def test_revoked_then_reassigned_partition_commits_only_its_new_epoch() -> None:
    book, key = PartitionBook(), ("orders", 0)
    book.assign([key])
    epoch = book.yielding_epoch(key)
    assert epoch is not None
    for offset in range(3):
        assert book.record(key, epoch, msg(b"", offset=offset))
    assert book.begin_revoke([key]) == [key]
    assert book.yielding_epoch(key) is None  # no yields while revoking
    assert not book.is_drained([key])
    assert book.end_revoke([key]) == 3
    book.assign([key])  # back to us: the group's committed offset (0) is where it resumes
    new = book.yielding_epoch(key)
    assert new is not None and new != epoch
    assert not book.record(key, epoch, msg(b"", offset=3))  # the old epoch cannot yield
    book.record(key, new, msg(b"", offset=0))
    assert book.begin_advance(key, _items(key, [0, 1, 2])) == []  # old epoch: nothing to commit
    book.end_advance(key)
    live = book.begin_advance(key, _items(key, [0]))
    book.end_advance(key)
    assert [m.offset for _, m in live] == [0]
    assert book.is_drained([key])


STEPS = st.one_of(
    st.just(("yield", 0)),
    st.just(("rebalance", 0)),
    st.tuples(st.just("advance"), st.integers(1, 5)),
)


@given(st.lists(STEPS, max_size=80))
def test_a_commit_moves_forward_over_messages_advanced_in_the_owning_epoch(
    steps: list[tuple[str, int]],
) -> None:
    # Model: fetching resumes at the group's committed offset after every rebalance, and
    # the manager advances what was yielded in yield order (any batch sizes).
    book, key = PartitionBook(), ("orders", 0)
    book.assign([key])
    committed = epoch_start = position = 0
    pending: deque[int] = deque()
    advanced: set[int] = set()  # offsets advanced in the current epoch
    for step, size in steps:
        if step == "yield":
            epoch = book.yielding_epoch(key)
            assert epoch is not None and book.record(key, epoch, msg(b"", offset=position))
            pending.append(position)
            position += 1
        elif step == "advance" and pending:
            batch = [pending.popleft() for _ in range(min(size, len(pending)))]
            live = book.begin_advance(key, _items(key, batch))
            book.end_advance(key)
            advanced.update(message.offset for _, message in live)
            if live and book.may_commit(key, live[-1][1].offset + 1):
                offset = live[-1][1].offset + 1
                assert offset > committed  # never back
                assert set(range(epoch_start, offset)) <= advanced  # nothing skipped
                book.committed(key, offset)
                committed = offset
        elif step == "rebalance":
            book.end_revoke(book.begin_revoke([key]))
            book.assign([key])
            epoch_start = position = committed
            advanced = set()


# -- the producer's rebalance handling (a fake consumer records the commits) ----------------


def _records(*offsets: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(
            topic="orders", partition=0, offset=o, key=None, value=b"1", headers=(), timestamp=0
        )
        for o in offsets
    ]


def _batch(*offsets: int, clean: bool = True) -> list[AdvanceItem]:
    outcome = AdvanceOutcome(acked=1, failed=0) if clean else AdvanceOutcome(acked=0, failed=1)
    return [AdvanceItem(KafkaOffset("orders", 0, o), outcome) for o in offsets]


TP = TopicPartition("orders", 0)


async def test_revocation_drains_what_was_yielded_then_gives_the_partition_up() -> None:
    producer, consumer = recording_producer(revoke_drain_timeout_ms=60_000)
    producer._assigned({TP})
    assert len(list(producer._admit(TP, _records(0, 1, 2)))) == 3
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(producer._revoked, {TP})
            await anyio.wait_all_tasks_blocked()
            assert list(producer._admit(TP, _records(3))) == []  # no new yields while revoking
            await producer.advance(_batch(0, 1))
            await producer.advance(_batch(2))  # drained: the revocation returns
    assert consumer.commits == [(0, 2), (0, 3)]
    producer._assigned({TP})
    list(producer._admit(TP, _records(3)))
    await producer.advance(_batch(3))
    assert consumer.commits[-1] == (0, 4)


async def test_a_cancelled_drain_still_gives_the_partition_up() -> None:
    producer, consumer = recording_producer(revoke_drain_timeout_ms=60_000)
    producer._assigned({TP})
    list(producer._admit(TP, _records(0, 1)))
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(producer._revoked, {TP})
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    await producer.advance(_batch(0, 1))  # resolved after the revocation: not committed
    assert consumer.commits == []
    assert producer.stats.dropped_after_revoke == 2


@pytest.mark.parametrize("policy", ["stop", "commit"])
async def test_unclean_policy_without_a_dead_letter_topic(policy: str) -> None:
    producer, consumer = recording_producer(on_unclean=policy)
    producer._assigned({TP})
    list(producer._admit(TP, _records(0, 1, 2)))
    batch = [*_batch(0), *_batch(1, clean=False), *_batch(2)]
    if policy == "stop":
        with pytest.raises(UncleanEventError, match="orders/0/1"):
            await producer.advance(batch)
        assert consumer.commits == [(0, 1)]  # the clean prefix only
    else:
        await producer.advance(batch)
        assert consumer.commits == [(0, 3)]
        assert producer.stats.committed_unclean == 1


class FetchingConsumer(RecordingConsumer):
    """Every ``getmany`` returns the next two records of partition 0."""

    def __init__(self) -> None:
        super().__init__()
        self.fetches = 0

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        self.fetches += 1
        first = 2 * (self.fetches - 1)
        return {TP: _records(first, first + 1)}


async def test_no_fetch_while_max_inflight_messages_wait_for_their_advance() -> None:
    producer = KafkaSharedStreamProducer(ORDERS, max_inflight_messages=3)
    consumer = FetchingConsumer()

    async def start_clients() -> FetchingConsumer:
        producer._consumer = consumer
        producer._assigned({TP})
        return consumer

    producer._start_clients = start_clients  # type: ignore[method-assign]
    stream = producer.open_stream()
    with anyio.fail_after(5):
        offsets = [(await anext(stream))[1].offset for _ in range(4)]
        assert offsets == [0, 1, 2, 3] and consumer.fetches == 2
        async with anyio.create_task_group() as tg:
            fifth: list[int] = []

            async def pull() -> None:
                fifth.append((await anext(stream))[1].offset)

            tg.start_soon(pull)
            await anyio.wait_all_tasks_blocked()
            assert fifth == [] and consumer.fetches == 2  # 4 in flight >= 3: no fetch
            await producer.advance(_batch(0, 1))  # 2 in flight: fetching resumes
        assert fifth == [4] and consumer.fetches == 3
        await stream.aclose()
    assert consumer.commits == [(0, 2)]


def test_max_inflight_messages_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_inflight_messages"):
        KafkaSharedStreamProducer(ORDERS, max_inflight_messages=0)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def _outcome_of(load: Any, raw: bytes) -> Any:
    try:
        return ("value", json.dumps(load(raw), sort_keys=True))
    except (ValueError, RecursionError) as exc:
        return ("error", type(exc))


@given(
    value=_JSON_VALUES,
    around=st.sampled_from(["", " ", "\n", "x", "\ufeff"]),
    encoding=st.sampled_from(["utf-8", "utf-16", "utf-32"]),
)
def test_the_fast_json_decode_agrees_with_json_loads(
    value: Any, around: str, encoding: str
) -> None:
    text = json.dumps(value)
    for raw in (
        (around + text).encode(encoding),
        (text + around).encode(encoding),
        text.encode(encoding)[:-1],
    ):
        assert _outcome_of(kafka_codec._loads, raw) == _outcome_of(json.loads, raw)


@given(raw=st.binary(max_size=40))
def test_the_fast_json_decode_agrees_with_json_loads_on_any_bytes(raw: bytes) -> None:
    assert _outcome_of(kafka_codec._loads, raw) == _outcome_of(json.loads, raw)


_AWKWARD_JSON: list[bytes] = [
    b'{"__sluice_type__": "datetime", "__sluice_value__": "2026-01-01T00:00:00"}',
    b'{"a": {"\\u005f_sluice_type__": "set", "__sluice_value__": [1]}}',
    b'{"n": NaN}',
    b"[Infinity, -Infinity]",
    b'{"big": 1e999}',
    b"-1e400",
    b"[" * 99 + b"]" * 99,
    b'{"deep": ' + b"[" * 120 + b"]" * 120 + b"}",
    b'{"text": "NaN and Infinity are words", "f": 1.5e-3, "neg": -0.0}',
]


@given(
    raw=st.one_of(
        st.builds(lambda v: json.dumps(v).encode(), _JSON_VALUES), st.sampled_from(_AWKWARD_JSON)
    )
)
def test_a_value_called_plain_json_is_plain_json(raw: bytes) -> None:
    """The event of a message whose value is called plain is built without the payload
    check: whenever the decoder says so, the check would have said so too (and the value is
    what ``json.loads`` gives)."""
    value, plain = kafka_codec._loads_plain(raw)
    assert json.dumps(value, sort_keys=True) == json.dumps(json.loads(raw), sort_keys=True)
    if plain:
        assert is_plain_json({"value": value}), raw  # as an event's payload holds it


@pytest.mark.parametrize("raw", _AWKWARD_JSON[:-1])
def test_values_the_check_would_tag_or_refuse_are_not_called_plain(raw: bytes) -> None:
    assert not kafka_codec._loads_plain(raw)[1]
    message = KafkaMessage("t", 0, 7, None, raw)
    payload = kafka_codec.event_payload(message, "auto")
    if is_plain_json(payload):  # "[[...]]" 99 deep: plain, but too many brackets to know
        assert kafka_codec.message_event(message, "auto") == TriggerEvent(payload)
    else:
        with contextlib.suppress(SerializationError):  # nested too deep: refused as before
            assert kafka_codec.message_event(message, "auto").plain is False


def test_an_ordinary_value_is_called_plain_and_its_event_is_checked_no_further() -> None:
    assert kafka_codec._loads_plain(_AWKWARD_JSON[-1]) == (json.loads(_AWKWARD_JSON[-1]), True)
    message = KafkaMessage("t", 0, 7, b"k", b'{"bucket": 3}', (("h", b"\xff"),), 0)
    event = kafka_codec.message_event(message, "auto")
    assert event.plain and event.dedup_key == "kafka:t:0:7"
    assert event == TriggerEvent(event.payload, dedup_key="kafka:t:0:7")
    assert event.payload["headers"] == [["h", {"base64": "/w=="}]]


@pytest.mark.parametrize(
    ("fields", "value", "matches"),
    [
        ({"bucket": 3}, b'{"bucket": 3, "n": 1}', True),
        ({"bucket": 3}, b'{"bucket": 4}', False),
        ({"bucket": 3}, b'{"n": 3}', False),
        ({"bucket": 3, "kind": "a"}, b'{"bucket": 3, "kind": "a"}', True),
        ({"bucket": 3, "kind": "a"}, b'{"bucket": 3, "kind": "b"}', False),
        ({"gone": None}, b'{"gone": null}', True),
        ({"gone": None}, b"{}", False),  # an absent field is not a null one
        ({"bucket": 3}, b"[3]", False),
        ({"bucket": 3}, b"3", False),
        ({"bucket": 3.0}, b'{"bucket": 3}', True),  # equality, as for dotted paths
    ],
)
async def test_top_level_fields_match_by_equality_and_presence(
    fields: dict[str, Any], value: bytes, matches: bool
) -> None:
    top = KafkaMessageTrigger(**BASE, match_fields=fields)
    dotted = KafkaMessageTrigger(**BASE, match_fields={**fields, "x.y": 1})
    nested = value.replace(b"{", b'{"x": {"y": 1}, ', 1) if value.startswith(b"{") else value
    assert bool(await judged(top, msg(value))) is matches
    assert bool(await judged(dotted, msg(nested.replace(b", }", b"}")))) is matches


def _consumer_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """What the producer hands aiokafka's consumer, given ``consumer_options``."""
    producer = KafkaSharedStreamProducer(replace(ORDERS, consumer_options=options))
    return producer._consumer_kwargs


@pytest.mark.parametrize(
    ("options", "interval_ms"), [({}, 3_600_000), ({"max_poll_interval_ms": 600_000}, 600_000)]
)
def test_a_consumer_held_back_by_the_in_flight_bound_stays_in_its_group(
    options: dict[str, Any], interval_ms: int
) -> None:
    """aiokafka leaves the group after ``max_poll_interval_ms`` without fetched records (300 s
    by default, as the ack timeout): the producer's default is an hour, ``consumer_options``
    may set it."""
    assert _consumer_kwargs(options)["max_poll_interval_ms"] == interval_ms


@pytest.mark.parametrize(("options", "wait_ms"), [({}, 100), ({"fetch_max_wait_ms": 500}, 500)])
def test_a_fetch_that_finds_nothing_new_is_not_held_long(
    options: dict[str, Any], wait_ms: int
) -> None:
    """aiokafka keeps one fetch in flight per broker: while the broker holds it for the idle
    partitions, a backlogged partition whose records ran out waits (measured: the last
    records of a 100k run came 350 ms late at aiokafka's 500 ms). The producer's default
    is 100 ms; ``consumer_options`` may set it."""
    assert _consumer_kwargs(options)["fetch_max_wait_ms"] == wait_ms


async def test_a_consumer_fenced_before_it_started_leaves_the_group_once_it_has_joined() -> None:
    """A lease lost while ``consumer.start()`` is still joining: nothing to leave yet (the
    consumer has no coordinator, ``unsubscribe`` would raise), so fence() does not touch it,
    and the start path leaves the group as soon as start() returns."""

    class JoiningConsumer(RecordingConsumer):
        def __init__(self) -> None:
            super().__init__()
            self.joined = anyio.Event()
            self.left = 0

        def subscribe(self, **_kwargs: Any) -> None:
            pass

        async def start(self) -> None:
            await self.joined.wait()

        def unsubscribe(self) -> None:
            if not self.joined.is_set():
                raise AttributeError("'NoneType' object has no attribute 'request_rejoin'")
            self.left += 1

    producer, _ = recording_producer()
    consumer = JoiningConsumer()
    with anyio.fail_after(5), pytest.MonkeyPatch.context() as patch:
        patch.setattr(kafka_module, "AIOKafkaConsumer", lambda **_kw: consumer)
        async with anyio.create_task_group() as tg:
            tg.start_soon(producer._start_clients)
            await anyio.lowlevel.checkpoint()
            producer.fence()  # during start(): must not raise
            assert consumer.left == 0
            consumer.joined.set()
    assert consumer.left == 1
