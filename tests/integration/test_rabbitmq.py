"""The RabbitMQ producer and ``RabbitMQMessageTrigger`` against the machine's RabbitMQ.

Most tests drive the real ``SharedStreamManager`` with ``SubscriberHarness`` subscribers (as
the triggerer does); a few drive the producer alone (``test_rabbitmq_triggerer.py`` runs
watchers through the real triggerer). Each test has queues of its own (``rabbitmq_queues``).
"Acked" is checked from the broker's side: once the consumer's connection is closed, the
broker puts back every delivery it was not acknowledged, so a queue with nothing ready then
has had everything acked.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from producers import RabbitMQMessageTrigger
from producers.exceptions import (
    BrokerRefused,
    BrokerRequestFailed,
    BrokerUnavailable,
    ProducerConfigError,
)
from shared_stream import AckTimeout, AdvanceItem, AdvanceOutcome, SharedStreamManager
from shared_stream.testing import SubscriberHarness
from tests.services_rabbitmq import free_port, tcp_proxy
from tests.waiting import eventually, wait_until

if TYPE_CHECKING:
    from tests.services_rabbitmq import RabbitQueues

pytestmark = pytest.mark.integration

_FAILED = AdvanceOutcome(acked=0, failed=1)


def is_large(message: Any, threshold: int) -> bool:
    """An ``apply_function`` (imported by its dotted path)."""
    return bool(message.body["amount"] >= threshold)


async def is_even(message: Any) -> bool:
    """An async ``apply_function``."""
    return bool(message.body["n"] % 2 == 0)


def _advanced(manager: SharedStreamManager, count: int) -> Any:
    return lambda: sum(s.advanced_events for s in manager.stats()) >= count


def _bodies(harness: SubscriberHarness) -> list[Any]:
    return [p["body"] for p in harness.payloads]


async def test_two_filtered_siblings_share_one_consumer_and_everything_is_acked(
    rabbitmq_url, rabbitmq_queues: RabbitQueues, caplog
) -> None:
    queue, dlq = await rabbitmq_queues.make()
    bodies = [{"kind": "ab"[n % 2], "n": n} for n in range(20)]
    ids = await rabbitmq_queues.publish(queue, bodies, headers={"origin": "shop"})
    await rabbitmq_queues.publish(queue, [{"kind": "a", "n": 99}], headers={"origin": "legacy"})
    a = RabbitMQMessageTrigger(
        url=rabbitmq_url, queue=queue, body_filter={"kind": "a"}, header_filter={"origin": "shop"}
    )
    b = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue, body_filter={"kind": ["b", "c"]})
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            first = SubscriberHarness(manager, a, trigger_id=1)
            second = SubscriberHarness(manager, b, trigger_id=2)
            tg.start_soon(first.run)
            tg.start_soon(second.run)
            await first.wait_for_events(10)
            await second.wait_for_events(10)
            await wait_until(_advanced(manager, 21))
            assert manager.group_keys == (a.shared_stream_key(),)
    assert _bodies(first) == bodies[0::2]
    assert _bodies(second) == bodies[1::2]
    assert [e.dedup_key for e in first.events] == [f"rabbitmq:{queue}:{i}" for i in ids[0::2]]
    assert first.payloads[0]["headers"] == {"origin": "shop"}
    assert first.payloads[0]["redelivered"] is False
    assert await rabbitmq_queues.ready(queue) == 0  # acked: nothing came back at close
    assert await rabbitmq_queues.ready(dlq) == 0
    assert "guest:guest" not in caplog.text


async def test_nothing_is_acked_while_a_subscriber_has_not_confirmed(
    rabbitmq_url, rabbitmq_queues: RabbitQueues
) -> None:
    queue, _ = await rabbitmq_queues.make()
    await rabbitmq_queues.publish(queue, [{"n": n} for n in range(6)])
    trigger = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            fine = SubscriberHarness(manager, trigger, trigger_id=1)
            held = SubscriberHarness(manager, trigger, trigger_id=2, auto_confirm=False)
            tg.start_soon(fine.run)
            tg.start_soon(held.run)
            await fine.wait_for_events(6)
            await held.wait_for_events(6)
            await wait_until(lambda: len(fine.unconfirmed) == 0)  # fine confirmed all six
            assert await rabbitmq_queues.ready(queue) == 0  # all six in flight
            tg.cancel_scope.cancel()
    assert _bodies(held) == [{"n": n} for n in range(6)]
    # The connection closed with what was not confirmed by both: every one came back.
    assert await eventually(lambda: _ready_is(rabbitmq_queues, queue, 6))


async def test_only_the_confirmed_prefix_is_acked(
    rabbitmq_url, rabbitmq_queues: RabbitQueues
) -> None:
    queue, _ = await rabbitmq_queues.make()
    await rabbitmq_queues.publish(queue, [{"n": n} for n in range(6)])
    trigger = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            held = SubscriberHarness(manager, trigger, trigger_id=1, auto_confirm=False)
            tg.start_soon(held.run)
            await held.wait_for_events(6)
            manager.confirm_persisted(held.unconfirmed[:4])  # n = 0..3
            await wait_until(_advanced(manager, 4))
            tg.cancel_scope.cancel()
    assert await eventually(lambda: _ready_is(rabbitmq_queues, queue, 2))
    leftover = await rabbitmq_queues.drain(queue)
    assert [json.loads(m.body) for m in leftover] == [{"n": 4}, {"n": 5}]


async def _ready_is(queues: RabbitQueues, queue: str, count: int) -> bool:
    return await queues.ready(queue) == count


async def test_a_failed_message_is_redelivered_at_once_with_the_same_dedup_key(
    rabbitmq_url, rabbitmq_queues: RabbitQueues
) -> None:
    queue, dlq = await rabbitmq_queues.make()
    [message_id] = await rabbitmq_queues.publish(queue, [{"n": 1}])
    trigger = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager(ack_timeout=0.3) as manager:
            fine = SubscriberHarness(manager, trigger, trigger_id=1)
            stuck = SubscriberHarness(manager, trigger, trigger_id=2, auto_confirm=False)
            tg.start_soon(fine.run)
            tg.start_soon(stuck.run)
            await fine.wait_for_events(2)
            await stuck.wait_finished()
            await wait_until(_advanced(manager, 2))
    assert isinstance(stuck.error, AckTimeout)
    assert [p["redelivered"] for p in fine.payloads] == [False, True]
    assert {e.dedup_key for e in fine.events} == {f"rabbitmq:{queue}:{message_id}"}
    assert await rabbitmq_queues.ready(queue) == 0
    assert await rabbitmq_queues.ready(dlq) == 0


async def test_a_rejected_or_poison_message_goes_to_the_dead_letter_exchange(
    rabbitmq_url, rabbitmq_queues: RabbitQueues, caplog
) -> None:
    queue, dlq = await rabbitmq_queues.make()
    await rabbitmq_queues.publish(queue, [{"kind": "a", "n": 1}])
    [poison_id] = await rabbitmq_queues.publish(queue, [b"\xffnot json"])
    await rabbitmq_queues.publish(queue, [{"kind": "a", "n": 2}])
    trigger = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue, body_filter={"kind": "a"})
    trigger.trigger_id = 7  # the runtime sets it; the harness does not
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=7)
            tg.start_soon(harness.run)
            await harness.wait_for_events(2)
            await wait_until(_advanced(manager, 3))
    assert _bodies(harness) == [{"kind": "a", "n": 1}, {"kind": "a", "n": 2}]
    assert await rabbitmq_queues.ready(queue) == 0
    [dead] = await rabbitmq_queues.drain(dlq)
    assert dead.body == b"\xffnot json"
    assert dead.message_id == poison_id
    [record] = [
        r for r in caplog.records if getattr(r, "action", None) == "rabbitmq.message_rejected"
    ]
    assert (record.trigger_id, record.message_id) == (7, poison_id)


async def test_routing_key_lanes_advance_independently_in_order(
    rabbitmq_url, rabbitmq_queues: RabbitQueues
) -> None:
    queue, _ = await rabbitmq_queues.make()
    exchange = await rabbitmq_queues.exchange("lanes", queue, routing_keys=("a", "b"))
    for n in range(5):
        for key in ("a", "b"):
            await rabbitmq_queues.publish_to(exchange, key, {"lane": key, "n": n})
    trigger = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue, lanes="routing_key")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1, auto_confirm=False)
            tg.start_soon(harness.run)
            await harness.wait_for_events(10)
            lane_b = [
                seq
                for seq, p in zip(harness.seqs, harness.payloads, strict=True)
                if p["routing_key"] == "b"
            ]
            # Lane "a" stays unconfirmed: with one lane it would hold back every "b".
            manager.confirm_persisted(lane_b)
            await wait_until(_advanced(manager, 5))
            tg.cancel_scope.cancel()
    by_lane: dict[str, list[int]] = {}
    for body in _bodies(harness):
        by_lane.setdefault(body["lane"], []).append(body["n"])
    assert by_lane == {"a": list(range(5)), "b": list(range(5))}
    assert await eventually(lambda: _ready_is(rabbitmq_queues, queue, 5))
    assert {json.loads(m.body)["lane"] for m in await rabbitmq_queues.drain(queue)} == {"a"}


async def test_a_quorum_queue_message_past_max_deliveries_is_dead_lettered_unseen(
    rabbitmq_url, rabbitmq_queues: RabbitQueues, caplog
) -> None:
    queue, dlq = await rabbitmq_queues.make(**{"x-queue-type": "quorum"})
    [message_id] = await rabbitmq_queues.publish(queue, [{"n": 1}])
    trigger = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue, max_deliveries=2)
    producer = trigger.build_producer()
    with anyio.fail_after(10):
        stream = producer.open_stream()
        try:
            counts = []
            for _ in range(2):
                message, delivery = await anext(stream)
                counts.append(message.delivery_count)
                await producer.advance([AdvanceItem(delivery, _FAILED)])  # requeued
            with anyio.move_on_after(0.5):  # the third delivery never comes out
                await anext(stream)
                pytest.fail("a delivery past max_deliveries reached the watchers")
            await eventually(lambda: _ready_is(rabbitmq_queues, dlq, 1))
        finally:
            await stream.aclose()
            await producer.aclose()
    assert counts == [None, 2]  # a first delivery carries no x-delivery-count
    [dead] = await rabbitmq_queues.drain(dlq)
    assert dead.message_id == message_id
    assert await rabbitmq_queues.ready(queue) == 0
    assert any(getattr(r, "action", None) == "rabbitmq.max_deliveries" for r in caplog.records)


async def test_on_reject_requeue_redelivers_until_max_deliveries_dead_letters(
    rabbitmq_url, rabbitmq_queues: RabbitQueues
) -> None:
    queue, dlq = await rabbitmq_queues.make(**{"x-queue-type": "quorum"})
    await rabbitmq_queues.publish(queue, [b"poison", {"kind": "a"}])
    trigger = RabbitMQMessageTrigger(
        url=rabbitmq_url,
        queue=queue,
        body_filter={"kind": "a"},
        on_reject="requeue",
        max_deliveries=3,
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(harness.run)
            await eventually(lambda: _ready_is(rabbitmq_queues, dlq, 1))
            await wait_until(_advanced(manager, 4))  # poison thrice, then the good one
    assert _bodies(harness) == [{"kind": "a"}]
    assert [m.body for m in await rabbitmq_queues.drain(dlq)] == [b"poison"]
    assert await rabbitmq_queues.ready(queue) == 0


async def test_a_multiple_ack_never_covers_an_earlier_unresolved_delivery(
    rabbitmq_url, rabbitmq_queues: RabbitQueues
) -> None:
    queue, _ = await rabbitmq_queues.make()
    await rabbitmq_queues.publish(queue, [{"n": n} for n in range(4)])
    producer = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue, lanes="routing_key")
    producer = producer.build_producer()
    clean = AdvanceOutcome(acked=1, failed=0)
    with anyio.fail_after(10):
        stream = producer.open_stream()
        try:
            deliveries = [(await anext(stream))[1] for _ in range(4)]
            # Tag 1 stays outstanding: acking 2..4 must not use multiple=True.
            await producer.advance([AdvanceItem(d, clean) for d in deliveries[1:]])
        finally:
            await stream.aclose()
            await producer.aclose()
    assert await eventually(lambda: _ready_is(rabbitmq_queues, queue, 1))
    assert [json.loads(m.body) for m in await rabbitmq_queues.drain(queue)] == [{"n": 0}]


async def test_filters_apply_function_and_partition_keys(
    rabbitmq_url, rabbitmq_queues: RabbitQueues
) -> None:
    queue, dlq = await rabbitmq_queues.make()
    await rabbitmq_queues.publish(
        queue, [{"n": n, "amount": 10 * n} for n in range(6)], headers={"region": "eu"}
    )
    await rabbitmq_queues.publish(queue, [{"n": 6, "amount": 60}])  # no region header
    here = __name__
    large = RabbitMQMessageTrigger(
        url=rabbitmq_url,
        queue=queue,
        apply_function=f"{here}.is_large",
        apply_function_kwargs={"threshold": 30},
        partition_key_header="region",
    )
    even = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue, apply_function=f"{here}.is_even")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            first = SubscriberHarness(manager, large, trigger_id=1)
            second = SubscriberHarness(manager, even, trigger_id=2)
            tg.start_soon(first.run)
            tg.start_soon(second.run)
            await first.wait_for_events(3)
            await second.wait_for_events(4)
            await wait_until(_advanced(manager, 7))
    assert [b["n"] for b in _bodies(first)] == [3, 4, 5]
    assert {e.partition_key for e in first.events} == {"eu"}
    assert [b["n"] for b in _bodies(second)] == [0, 2, 4, 6]
    [dead] = await rabbitmq_queues.drain(dlq)  # n=6 gives the keyed watcher no key
    assert json.loads(dead.body)["n"] == 6


@pytest.mark.parametrize("dedup", ["message_id", "payload"])
async def test_messages_without_message_id_are_keyed_as_chosen_and_it_is_said(
    rabbitmq_url, rabbitmq_queues: RabbitQueues, caplog, dedup
) -> None:
    queue, _ = await rabbitmq_queues.make()
    await rabbitmq_queues.publish(queue, [{"n": 1}, {"n": 2}], message_ids=False)
    trigger = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue, dedup=dedup)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(harness.run)
            await harness.wait_for_events(2)
    keys = [e.dedup_key for e in harness.events]
    if dedup == "payload":
        assert all(k.startswith(f"rabbitmq:{queue}:sha256:") for k in keys)
        assert len(set(keys)) == 2
    else:
        assert keys == [None, None]
    told = [r for r in caplog.records if getattr(r, "action", None) == "rabbitmq.no_message_id"]
    assert len(told) == 1  # once per trigger, not per message


async def test_the_broker_going_away_ends_the_stream_and_requeues_in_flight(
    rabbitmq_queues: RabbitQueues,
) -> None:
    queue, _ = await rabbitmq_queues.make()
    await rabbitmq_queues.publish(queue, [{"n": 1}])
    async with tcp_proxy(5672) as (port, cut):
        url = f"amqp://guest:guest@127.0.0.1:{port}/"
        producer = RabbitMQMessageTrigger(url=url, queue=queue).build_producer()
        with anyio.fail_after(10):
            stream = producer.open_stream()
            try:
                await anext(stream)
                assert await rabbitmq_queues.ready(queue) == 0  # in flight
                cut()
                with pytest.raises(BrokerUnavailable) as info:
                    await anext(stream)
            finally:
                await stream.aclose()
                await producer.aclose()
    assert info.value.address == f"amqp://127.0.0.1:{port} vhost '/'"
    assert "guest:guest" not in str(info.value)
    assert await eventually(lambda: _ready_is(rabbitmq_queues, queue, 1))


async def test_a_cancelled_wait_ends_promptly_and_close_leaves_no_consumer(
    rabbitmq_url, rabbitmq_queues: RabbitQueues
) -> None:
    queue, _ = await rabbitmq_queues.make()
    producer = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue).build_producer()
    with anyio.fail_after(5):
        stream = producer.open_stream()
        with anyio.move_on_after(0.3) as scope:
            await anext(stream)  # an empty queue: waits for a delivery
        assert scope.cancelled_caught
        assert await rabbitmq_queues.consumers(queue) == 1
        await stream.aclose()
        await producer.aclose()
        assert await rabbitmq_queues.consumers(queue) == 0
    assert "connected=False" in repr(producer)


async def test_an_unreachable_broker_raises_broker_unavailable_naming_it() -> None:
    port = free_port()
    trigger = RabbitMQMessageTrigger(url=f"amqp://guest:s3cr3t@127.0.0.1:{port}/", queue="q")
    with anyio.fail_after(10):
        producer = trigger.build_producer()
        try:
            with pytest.raises(BrokerUnavailable) as info:
                await anext(aiter(producer.open_stream()))
        finally:
            await producer.aclose()
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(harness.run)
            await harness.wait_finished()
    assert info.value.address == f"amqp://127.0.0.1:{port} vhost '/'"
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "s3cr3t" not in str(info.value)
    assert isinstance(harness.error, BrokerUnavailable)  # the subscriber fails: restarted


async def test_bad_credentials_missing_queue_and_bad_settings_are_clear_errors(
    rabbitmq_url, rabbitmq_queues: RabbitQueues
) -> None:
    queue, _ = await rabbitmq_queues.make()
    wrong = rabbitmq_url.replace("guest:guest", "guest:wrong")
    cases = [
        (RabbitMQMessageTrigger(url=wrong, queue=queue), BrokerRefused, "refused the login"),
        (
            RabbitMQMessageTrigger(url=rabbitmq_url, queue=rabbitmq_queues.name("absent")),
            ProducerConfigError,
            "declare=True",
        ),
        (
            RabbitMQMessageTrigger(
                url=rabbitmq_url,
                queue=queue,
                declare=True,
                queue_arguments={"x-max-length": 5},
            ),
            ProducerConfigError,
            "PRECONDITION_FAILED",
        ),
    ]
    with anyio.fail_after(10):
        for trigger, error, text in cases:
            producer = trigger.build_producer()
            try:
                with pytest.raises(error, match=text) as info:
                    await anext(aiter(producer.open_stream()))
            finally:
                await producer.aclose()
            assert "guest:wrong" not in str(info.value)
    for settings, text in [
        ({"lanes": "topic"}, "lanes="),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"queue_arguments": {"x-queue-type": "quorum"}}, "declare=True"),
        ({"dedup": "body"}, "dedup="),
        ({"apply_function": "no_dots"}, "dotted path"),
        ({"url": None}, "conn_id"),
    ]:
        with pytest.raises(ProducerConfigError, match=text):
            RabbitMQMessageTrigger(**{"url": rabbitmq_url, "queue": queue, **settings})


async def test_a_deleted_queue_ends_the_stream(rabbitmq_url, rabbitmq_queues: RabbitQueues) -> None:
    queue, _ = await rabbitmq_queues.make()
    producer = RabbitMQMessageTrigger(url=rabbitmq_url, queue=queue).build_producer()
    with anyio.fail_after(10):
        stream = producer.open_stream()
        try:
            async with anyio.create_task_group() as tg:

                async def next_message() -> None:
                    with pytest.raises(BrokerRequestFailed, match="cancelled the consumer"):
                        await anext(stream)

                tg.start_soon(next_message)
                await eventually(lambda: _consumers_is(rabbitmq_queues, queue, 1))
                await rabbitmq_queues.channel.queue_delete(queue)
        finally:
            await stream.aclose()
            await producer.aclose()


async def _consumers_is(queues: RabbitQueues, queue: str, count: int) -> bool:
    return await queues.consumers(queue) == count
