"""``BrokerLiveness``: a Kafka broker that stays unreachable is told from a quiet topic.

The consumer here is a double of the three aiokafka calls the check reads (``assignment``,
``last_poll_timestamp``, ``topics``); the clocks are fakes. The real thing, a broker stopped
under a running group, is the conformance kit's ``broker_restart[kafka]``.
"""

from __future__ import annotations

import anyio
import pytest
from aiokafka import TopicPartition
from aiokafka import errors as kafka_errors

from producers.exceptions import BrokerUnavailable
from producers.kafka_liveness import MIN_LOST_AFTER_S, BrokerLiveness, lost_after_default

WHERE = "127.0.0.1:9 group='g' topics=['t']"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Consumer:
    """Partitions with their last fetch response (wall ms); ``topics`` answers or fails."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.polled: dict[TopicPartition, int | None] = {}
        self.metadata: BaseException | None = None
        self.hang = False
        self.asked = 0

    def assignment(self) -> set[TopicPartition]:
        return set(self.polled)

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None:
        return self.polled[tp]

    def fetched_now(self, tp: TopicPartition) -> None:
        self.polled[tp] = int(self.clock.now * 1000)

    async def topics(self) -> set[str]:
        self.asked += 1
        if self.hang:
            await anyio.sleep_forever()
        if self.metadata is not None:
            raise self.metadata
        return {"t"}


def liveness(clock: Clock, lost_after_s: float = 2.0) -> BrokerLiveness:
    return BrokerLiveness(lost_after_s, clock=clock, wall=clock)


async def check(live: BrokerLiveness, consumer: Consumer) -> None:
    with anyio.fail_after(5):
        await live.check(consumer, where=WHERE, address="127.0.0.1:9")


async def test_recent_fetch_responses_need_no_request() -> None:
    clock = Clock()
    consumer, live = Consumer(clock), liveness(clock)
    tp = TopicPartition("t", 0)
    consumer.metadata = kafka_errors.KafkaConnectionError("would fail")
    for _ in range(10):  # an idle partition answered within the bound: alive, nothing sent
        clock.now += 1.5
        consumer.fetched_now(tp)
        await check(live, consumer)
    assert consumer.asked == 0


async def test_a_quiet_consumer_whose_broker_answers_metadata_stays() -> None:
    clock = Clock()
    consumer, live = Consumer(clock), liveness(clock)  # no partition assigned (rebalancing)
    clock.now += 2.5
    await check(live, consumer)
    await check(live, consumer)  # answered: alive again, no second request within the bound
    assert consumer.asked == 1
    clock.now += 2.5
    await check(live, consumer)
    assert consumer.asked == 2


@pytest.mark.parametrize(
    "failure", [kafka_errors.KafkaError("Unable to get cluster metadata"), None]
)
async def test_no_fetch_response_nor_metadata_past_the_bound_is_unavailable(
    failure: BaseException | None,
) -> None:
    clock = Clock()
    consumer, live = Consumer(clock), liveness(clock, lost_after_s=0.05)
    tp = TopicPartition("t", 0)
    consumer.fetched_now(tp)
    clock.now += 0.04
    await check(live, consumer)  # within the bound: nothing asked
    clock.now += 0.02
    if failure is None:
        consumer.hang = True  # a broker that accepts and never answers
    else:
        consumer.metadata = failure
    with pytest.raises(BrokerUnavailable) as caught:
        await check(live, consumer)
    assert caught.value.address == "127.0.0.1:9"
    assert WHERE in str(caught.value)
    assert isinstance(caught.value.__cause__, TimeoutError | kafka_errors.KafkaError)


async def test_records_fetched_are_a_sign_of_life() -> None:
    clock = Clock()
    consumer, live = Consumer(clock), liveness(clock)
    consumer.metadata = kafka_errors.KafkaConnectionError("down")
    clock.now += 1.9
    live.alive()
    clock.now += 1.9
    await check(live, consumer)
    assert consumer.asked == 0


def test_the_default_bound_is_the_session_timeout_with_a_floor() -> None:
    assert lost_after_default(10_000) == 10.0
    assert lost_after_default(1_000) == MIN_LOST_AFTER_S
    with pytest.raises(ValueError, match="lost_after_s"):
        BrokerLiveness(0)
