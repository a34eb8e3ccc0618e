"""Batch mode of the Kafka shared stream without a broker: one raw event per fetched run of a
partition, every message still judged, fired, refused and committed on its own."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest
from aiokafka import TopicPartition

from producers import KafkaMessage, KafkaMessageBatch, KafkaMessageTrigger
from producers.exceptions import UncleanEventError
from producers.kafka_settings import DEFAULT_BATCH_MESSAGES
from producers.kafka_trigger import YIELD_EVERY_MESSAGES
from shared_stream import reject_shared_stream_event
from shared_stream.producer import AdvanceItem, AdvanceOutcome
from tests.unit.producers.kafka_doubles import RecordingConsumer, recording_producer
from triggers.base import TriggerEvent

if TYPE_CHECKING:
    from producers.kafka import KafkaSharedStreamProducer
    from producers.kafka_messages import KafkaOffset

BASE: dict[str, Any] = {"topics": ["orders"], "bootstrap_servers": "b:9092", "group_id": "g"}
TP = TopicPartition("orders", 0)
CLEAN = AdvanceOutcome(acked=2, failed=0)


def _producer(**kwargs: Any) -> tuple[KafkaSharedStreamProducer, RecordingConsumer]:
    producer, consumer = recording_producer(**{"batch_messages": 3, **kwargs})
    producer._assigned({TP})
    return producer, consumer


def _records(*offsets: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(
            topic="orders",
            partition=0,
            offset=o,
            key=None,
            value=b'{"n": %d}' % o,
            headers=(),
            timestamp=0,
        )
        for o in offsets
    ]


def _advanced(*batches: tuple[KafkaMessageBatch, KafkaOffset]) -> list[AdvanceItem]:
    return [AdvanceItem(offset, CLEAN) for _, offset in batches]


def test_a_fetch_is_yielded_in_lane_ordered_batches_of_at_most_batch_messages() -> None:
    producer, _ = _producer()
    yielded = list(producer._admit_batches(TP, _records(*range(7))))
    assert [[m.offset for m in batch] for batch, _ in yielded] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [offset for _, offset in yielded] == [
        ("orders", 0, 2),
        ("orders", 0, 5),
        ("orders", 0, 6),
    ]
    assert producer._book.inflight == 7  # messages, not batches
    assert producer.stats.messages == 7


async def test_advancing_batches_commits_after_their_last_message() -> None:
    producer, consumer = _producer()
    first, second, third = producer._admit_batches(TP, _records(*range(7)))
    await producer.advance(_advanced(first, second))
    assert consumer.commits == [(0, 6)]
    assert producer._book.inflight == 1
    await producer.advance(_advanced(third))
    assert consumer.commits == [(0, 6), (0, 7)]


@pytest.mark.parametrize("policy", ["stop", "commit"])
async def test_a_message_refused_alone_is_unclean_and_its_batch_siblings_are_not(
    policy: str,
) -> None:
    producer, consumer = _producer(on_unclean=policy)
    first, second = producer._admit_batches(TP, _records(*range(6)))
    second[0].messages[1].note_rejection(7, "value is not valid JSON")  # offset 4
    if policy == "stop":
        with pytest.raises(UncleanEventError, match=r"orders/0/4 .*rejected=1.*trigger 7"):
            await producer.advance(_advanced(first, second))
        assert consumer.commits == [(0, 4)]  # everything before it, its batch's head too
    else:
        await producer.advance(_advanced(first, second))
        assert consumer.commits == [(0, 6)]
        assert producer.stats.committed_unclean == 1


async def test_a_batch_resolved_unclean_makes_each_of_its_messages_unclean() -> None:
    producer, consumer = _producer(on_unclean="commit")
    [(_, offset)] = producer._admit_batches(TP, _records(0, 1, 2))
    await producer.advance([AdvanceItem(offset, AdvanceOutcome(acked=1, failed=1))])
    assert consumer.commits == [(0, 3)] and producer.stats.committed_unclean == 3


async def test_a_batch_advanced_after_its_partition_was_revoked_commits_nothing() -> None:
    producer, consumer = _producer(revoke_drain_timeout_ms=0)
    [(batch, offset)] = producer._admit_batches(TP, _records(0, 1, 2))
    await producer._revoked({TP})  # nothing drained within 0 ms: given up
    assert list(producer._admit_batches(TP, _records(3))) == []  # no longer ours
    await producer.advance(_advanced((batch, offset)))
    assert consumer.commits == [] and producer.stats.dropped_after_revoke == 3
    assert producer._book.inflight == 0


def test_batch_messages_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_messages"):
        _producer(batch_messages=0)


# -- the trigger ----------------------------------------------------------------------------


def batch_of(*values: bytes, first: int = 0) -> KafkaMessageBatch:
    return KafkaMessageBatch(
        "orders",
        0,
        [KafkaMessage("orders", 0, first + i, None, v) for i, v in enumerate(values)],
    )


async def judged(trigger: KafkaMessageTrigger, *raws: Any) -> list[TriggerEvent]:
    async def stream() -> Any:
        for raw in raws:
            yield raw

    with anyio.fail_after(5):
        return [event async for event in trigger.filter_shared_stream(stream())]


def accept_small(message: KafkaMessage) -> bool:
    n = int(message.value or b"0")
    if n < 0:
        raise ValueError("negative")
    return n < 10


async def accept_small_later(message: KafkaMessage) -> bool:
    await anyio.lowlevel.checkpoint()
    return accept_small(message)


@pytest.mark.parametrize("function", ["accept_small", "accept_small_later"])
async def test_every_message_of_a_batch_is_judged_fired_or_refused_on_its_own(
    function: str, caplog: pytest.LogCaptureFixture
) -> None:
    trigger = KafkaMessageTrigger(**BASE, apply_function=f"{__name__}.{function}")
    trigger.trigger_id = 3
    first, second = batch_of(b"1", b"-1", b"50", b"2"), batch_of(b"70", b"80", first=4)
    events = await judged(trigger, first, second)
    assert [e.dedup_key for e in events] == ["kafka:orders:0:0", "kafka:orders:0:3"]
    assert [(r.trigger_id, "negative" in r.reason) for r in first.messages[1].rejections] == [
        (3, True)
    ]
    refused = [m.offset for b in (first, second) for m in b.messages if m.rejections]
    assert refused == [1]  # the filter's refusal marks its message only
    assert "reject_shared_stream_event() ignored" not in caplog.text  # not called per batch


def test_every_watcher_shares_one_batch_consumer_and_an_override_is_fed_messages() -> None:
    class PerMessage(KafkaMessageTrigger):
        async def filter_shared_stream(self, shared_stream: Any) -> Any:
            async for message in shared_stream:
                yield TriggerEvent({"offset": message.offset})

    class Deeper(PerMessage):  # inherits the fed filter: not wrapped twice
        pass

    default, custom = KafkaMessageTrigger(**BASE), PerMessage(**BASE)
    assert default.shared_stream_key() == ("kafka", "b:9092", "g", ("orders",))
    assert custom.shared_stream_key() == default.shared_stream_key()  # one consumer
    for cls, trigger in ((KafkaMessageTrigger, default), (PerMessage, custom)):
        producer = cls.create_shared_stream_producer(trigger.serialize()[1])
        assert producer.batch_messages == DEFAULT_BATCH_MESSAGES
    assert Deeper.filter_shared_stream is PerMessage.filter_shared_stream
    assert default._producer().batch_messages is None  # the standalone run() reads messages


async def test_an_overriding_filter_judges_single_messages_and_refuses_one_alone() -> None:
    class OddRefusing(KafkaMessageTrigger):
        async def filter_shared_stream(self, shared_stream: Any) -> Any:
            async for message in shared_stream:
                if message.offset % 2:
                    reject_shared_stream_event()
                else:
                    yield TriggerEvent({"offset": message.offset})

    trigger = OddRefusing(**BASE)
    trigger.trigger_id = 4
    first, second = batch_of(b"{}", b"{}", b"{}"), batch_of(b"{}", b"{}", first=3)
    with anyio.fail_after(5):
        events = await judged(trigger, first, second)
    assert [e.payload["offset"] for e in events] == [0, 2, 4]
    refused = [m.offset for b in (first, second) for m in b.messages if m.rejections]
    assert refused == [1, 3]  # each refusal marks its own message, not its batch
    assert first.messages[1].rejections[0].trigger_id == 4


async def test_a_watcher_lets_the_loop_run_while_it_judges_a_queue_of_batches() -> None:
    trigger = KafkaMessageTrigger(**BASE, match_fields={"never": True})
    size = YIELD_EVERY_MESSAGES // 2
    batches = [batch_of(*[b"{}"] * size, first=i * size) for i in range(6)]
    ran: list[int] = []  # how many batches were judged when another task got to run

    async def queued() -> Any:  # a queue that never waits, as a busy subscriber's
        for judged, batch in enumerate(batches):
            if judged == 5:
                assert ran, "the other task never ran"
            yield batch

    async def other() -> None:
        await anyio.lowlevel.checkpoint()
        ran.append(1)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
            assert [e async for e in trigger.filter_shared_stream(queued())] == []
