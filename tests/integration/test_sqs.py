"""The SQS producer and ``SqsMessageTrigger`` against a real (moto) SQS server.

Most tests drive the real ``SharedStreamManager`` with ``SubscriberHarness`` subscribers (as
the triggerer does); the last one runs three watchers through the real triggerer on SQLite.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from aiobotocore.session import get_session
from cryptography.fernet import Fernet

from engine.crypto import KwargsCipher
from engine.db.database import Database
from producers import SqsMessageTrigger
from producers.exceptions import BrokerRequestFailed, BrokerUnavailable, ProducerConfigError
from shared_stream import (
    AckTimeout,
    AdvanceItem,
    AdvanceOutcome,
    SharedStreamManager,
    SubscriberOverflow,
)
from shared_stream.testing import SubscriberHarness
from tests.services_sqs import (
    create_queue,
    queue_arn,
    queue_counts,
    receive_all,
    send_messages,
)
from tests.waiting import eventually, wait_until
from tests.watcher_rows import asset_events, fast_triggerer, seed_watchers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from tests.services_sqs import SqsEndpoint

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-never-logged"


@pytest.fixture
async def sqs(sqs_endpoint: SqsEndpoint) -> AsyncIterator[Any]:
    async with get_session().create_client("sqs", **sqs_endpoint.client_kwargs()) as client:
        yield client


def _trigger(endpoint: SqsEndpoint, url: str, **kwargs: Any) -> SqsMessageTrigger:
    return SqsMessageTrigger(
        queue_url=url,
        endpoint_url=endpoint.url,
        region_name=endpoint.region_name,
        aws_access_key_id=endpoint.aws_access_key_id,
        aws_secret_access_key=SECRET,
        wait_time_s=1,
        **kwargs,
    )


def _empty(sqs: Any, url: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await queue_counts(sqs, url) == (0, 0)

    return check


def _json(*bodies: Any) -> list[dict[str, Any]]:
    return [{"MessageBody": json.dumps(body)} for body in bodies]


async def test_clean_messages_are_deleted_once_every_subscriber_resolved_them(
    sqs_endpoint, sqs, sqs_queue_name, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    url = await create_queue(sqs, sqs_queue_name)
    ids = await send_messages(sqs, url, _json(*({"n": n} for n in range(25))))
    trigger = _trigger(sqs_endpoint, url)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            subscribers = [SubscriberHarness(manager, trigger, trigger_id=i) for i in (1, 2)]
            for harness in subscribers:
                tg.start_soon(harness.run)
            for harness in subscribers:
                await harness.wait_for_events(25)
            await eventually(_empty(sqs, url))
    for harness in subscribers:
        assert [p["message_id"] for p in harness.payloads] == ids
        assert [p["body"] for p in harness.payloads] == [{"n": n} for n in range(25)]
        assert [e.dedup_key for e in harness.events] == [f"sqs:{i}" for i in ids]
    assert SECRET not in caplog.text


async def test_a_timed_out_message_is_visible_again_at_once(
    sqs_endpoint, sqs, sqs_queue_name
) -> None:
    url = await create_queue(sqs, sqs_queue_name, VisibilityTimeout=60)
    [message_id] = await send_messages(sqs, url, _json({"n": 1}))
    trigger = _trigger(sqs_endpoint, url)
    # Redelivered well before the 60 s visibility timeout: made visible at once.
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager(ack_timeout=0.5) as manager:
            fine = SubscriberHarness(manager, trigger, trigger_id=1)
            stuck = SubscriberHarness(manager, trigger, trigger_id=2, auto_confirm=False)
            tg.start_soon(fine.run)
            tg.start_soon(stuck.run)
            await fine.wait_for_events(2)
            await stuck.wait_finished()
            await eventually(_empty(sqs, url))
    assert isinstance(stuck.error, AckTimeout)
    assert [p["message_id"] for p in fine.payloads] == [message_id, message_id]
    assert [p["attributes"]["ApproximateReceiveCount"] for p in fine.payloads] == ["1", "2"]


async def test_an_overflowed_subscriber_s_messages_are_redelivered_to_the_others(
    sqs_endpoint, sqs, sqs_queue_name
) -> None:
    url = await create_queue(sqs, sqs_queue_name, VisibilityTimeout=60)
    ids = await send_messages(sqs, url, _json(*range(6)))
    trigger = _trigger(sqs_endpoint, url)
    with anyio.fail_after(15):
        async with (
            anyio.create_task_group() as tg,
            SharedStreamManager(max_subscriber_queue=2) as manager,
        ):
            steady = SubscriberHarness(manager, trigger, trigger_id=1)
            slow = SubscriberHarness(manager, trigger, trigger_id=2)
            slow.pause()  # takes one event, then stops pulling: its queue fills
            tg.start_soon(steady.run)
            tg.start_soon(slow.run)
            await slow.wait_for_events(1)
            await eventually(_empty(sqs, url))
            slow.resume()
            await slow.wait_finished()
    assert isinstance(slow.error, SubscriberOverflow)
    delivered = [p["message_id"] for p in steady.payloads]
    assert set(delivered) == set(ids)
    assert len(delivered) > len(ids)  # what the slow one failed came back to the steady one


async def _redrive_queues(sqs: Any, name: str) -> tuple[str, str]:
    dlq = await create_queue(sqs, f"{name}-dlq")
    policy = {"deadLetterTargetArn": await queue_arn(sqs, dlq), "maxReceiveCount": 1}
    url = await create_queue(sqs, name, VisibilityTimeout=60, RedrivePolicy=policy)
    return url, dlq


@pytest.mark.parametrize("policy", ["visible", "dead_letter"])
async def test_a_rejected_message_reaches_the_dead_letter_queue(
    sqs_endpoint, sqs, sqs_queue_name, policy, caplog
) -> None:
    url, dlq = await _redrive_queues(sqs, sqs_queue_name)
    extra = {"dead_letter_queue_url": dlq} if policy == "dead_letter" else {}
    trigger = _trigger(sqs_endpoint, url, body_filter={"kind": "order"}, on_reject=policy, **extra)
    bad_attributes = {"origin": {"DataType": "String", "StringValue": "legacy"}}
    ids = await send_messages(
        sqs,
        url,
        [
            *_json({"kind": "order", "n": 1}),
            {"MessageBody": "not json", "MessageAttributes": bad_attributes},
            *_json({"kind": "order", "n": 2}),
        ],
    )
    trigger.trigger_id = 7  # the runtime sets it; the harness does not
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=7)
            tg.start_soon(harness.run)
            await harness.wait_for_events(2)
            await eventually(_empty(sqs, url))
    assert [p["message_id"] for p in harness.payloads] == [ids[0], ids[2]]
    [dead] = await receive_all(sqs, dlq)
    assert dead["Body"] == "not json"
    assert dead["MessageAttributes"]["origin"]["StringValue"] == "legacy"
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "sqs.message_rejected"]
    assert record.trigger_id == 7
    assert record.message_id == ids[1]


async def test_on_reject_leave_leaves_the_message_for_the_redrive_policy(
    sqs_endpoint, sqs, sqs_queue_name
) -> None:
    url, dlq = await _redrive_queues(sqs, sqs_queue_name)
    trigger = _trigger(sqs_endpoint, url, body_filter={"kind": "order"}, on_reject="leave")
    await send_messages(sqs, url, [{"MessageBody": "not json"}, *_json({"kind": "order"})])
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(harness.run)
            await harness.wait_for_events(1)

            async def only_the_rejected_one_in_flight() -> bool:
                return await queue_counts(sqs, url) == (0, 1)

            await eventually(only_the_rejected_one_in_flight)
    assert await receive_all(sqs, dlq) == []  # not moved, not visible: left to its timeout


async def test_fifo_order_is_kept_per_group_and_groups_advance_independently(
    sqs_endpoint, sqs, sqs_queue_name
) -> None:
    url = await create_queue(sqs, f"{sqs_queue_name}.fifo", VisibilityTimeout=60)
    entries = [
        {
            "MessageBody": json.dumps({"group": g, "n": n}),
            "MessageGroupId": g,
            "MessageDeduplicationId": f"{g}-{n}",
        }
        for n in range(8)
        for g in ("a", "b", "c")
    ]
    await send_messages(sqs, url, entries)
    trigger = _trigger(sqs_endpoint, url)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1, auto_confirm=False)
            tg.start_soon(harness.run)
            # Group "a" stays unconfirmed (in flight); "b" and "c" are confirmed as they come.
            # With one shared lane, "a" would hold back every later message of the others.
            while True:
                await wait_until(lambda: harness.unconfirmed, within=10)
                keep = []
                for seq, event in zip(harness.seqs, harness.events, strict=True):
                    if seq in harness.unconfirmed:
                        if event.payload["body"]["group"] == "a":
                            keep.append(seq)
                        else:
                            manager.confirm_persisted([seq])
                harness.unconfirmed = keep
                by_group = _groups(harness.payloads)
                if len(by_group.get("b", [])) == 8 and len(by_group.get("c", [])) == 8:
                    break
                await anyio.sleep(0.02)

            async def only_group_a_left() -> bool:
                visible, in_flight = await queue_counts(sqs, url)
                return visible + in_flight == 8

            await eventually(only_group_a_left)
            harness.auto_confirm = True
            harness.confirm_all()
            await harness.wait_for_events(24)
            await eventually(_empty(sqs, url))
    by_group = _groups(harness.payloads)
    assert by_group == {g: list(range(8)) for g in ("a", "b", "c")}


def _groups(payloads: list[dict[str, Any]]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for payload in payloads:
        groups.setdefault(payload["body"]["group"], []).append(payload["body"]["n"])
    return groups


async def test_visibility_is_extended_while_a_slow_subscriber_works(
    sqs_endpoint, sqs, sqs_queue_name
) -> None:
    url = await create_queue(sqs, sqs_queue_name, VisibilityTimeout=3)
    await send_messages(sqs, url, _json({"n": 1}))
    trigger = _trigger(sqs_endpoint, url)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1, auto_confirm=False)
            tg.start_soon(harness.run)
            await harness.wait_for_events(1)
            # Held for 2.5 visibility timeouts: it must stay invisible the whole time.
            held_until = anyio.current_time() + 7.5
            while anyio.current_time() < held_until:
                assert await queue_counts(sqs, url) == (0, 1)
                await anyio.sleep(0.25)
            assert len(harness.events) == 1
            harness.confirm_all()
            await eventually(_empty(sqs, url))
    assert len(harness.events) == 1


async def test_a_cancelled_long_poll_ends_promptly(sqs_endpoint, sqs, sqs_queue_name) -> None:
    url = await create_queue(sqs, sqs_queue_name)
    producer = SqsMessageTrigger(queue_url=url, wait_time_s=20, **sqs_endpoint.client_kwargs())
    producer = producer.build_producer()
    with anyio.fail_after(3):  # far below the 20 s long poll
        stream = producer.open_stream()
        with anyio.move_on_after(0.3) as scope:
            await anext(stream)
        assert scope.cancelled_caught
        await stream.aclose()
        await producer.aclose()
    assert "connected=False" in repr(producer)


async def test_close_makes_what_is_in_flight_visible_at_once(
    sqs_endpoint, sqs, sqs_queue_name
) -> None:
    url = await create_queue(sqs, sqs_queue_name, VisibilityTimeout=60)
    await send_messages(sqs, url, _json({"n": 1}))
    producer = _trigger(sqs_endpoint, url).build_producer()
    with anyio.fail_after(5):
        stream = producer.open_stream()
        await anext(stream)  # received, then the stream stops: no poll is left outstanding
        assert await queue_counts(sqs, url) == (0, 1)
        await stream.aclose()
        await producer.aclose()
    assert len(producer.in_flight) == 0
    assert await queue_counts(sqs, url) == (1, 0)  # visible again, not after 60 s


@pytest.mark.parametrize(
    ("outcome", "raises"),
    [(AdvanceOutcome(acked=1, failed=0), True), (AdvanceOutcome(acked=0, failed=1), False)],
)
async def test_failed_batch_entries_raise_for_deletes_and_are_logged_for_visibility(
    sqs_endpoint, sqs, sqs_queue_name, caplog, outcome, raises
) -> None:
    url = await create_queue(sqs, sqs_queue_name)
    await send_messages(sqs, url, _json({"n": 1}))
    producer = _trigger(sqs_endpoint, url).build_producer()
    with anyio.fail_after(10):
        stream = producer.open_stream()
        try:
            _message, receipt = await anext(stream)
            await sqs.purge_queue(QueueUrl=url)  # its receipt handle is now invalid
            if raises:
                with pytest.raises(BrokerRequestFailed, match="ReceiptHandleIsInvalid"):
                    await producer.advance([AdvanceItem(receipt, outcome)])
            else:
                await producer.advance([AdvanceItem(receipt, outcome)])
                [record] = [
                    r
                    for r in caplog.records
                    if getattr(r, "action", None) == "sqs.visibility_failed"
                ]
                assert receipt.message_id in record.getMessage()
        finally:
            await stream.aclose()
            await producer.aclose()


async def test_an_unreachable_endpoint_raises_broker_unavailable_and_ends_the_group() -> None:
    trigger = SqsMessageTrigger(
        queue_url="http://127.0.0.1:9/000000000000/nowhere",
        endpoint_url="http://127.0.0.1:9",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="y",
    )
    with anyio.fail_after(20):
        producer = trigger.build_producer()
        try:
            with pytest.raises(BrokerUnavailable, match="cannot reach the endpoint") as info:
                await anext(aiter(producer.open_stream()))
        finally:
            await producer.aclose()
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(harness.run)
            await harness.wait_finished()
    assert type(info.value.__cause__).__module__.startswith("botocore")
    assert isinstance(harness.error, BrokerUnavailable)  # the subscriber fails: restarted


async def test_a_missing_queue_is_a_configuration_error(sqs_endpoint) -> None:
    url = f"{sqs_endpoint.url}/123456789012/no-such-queue"
    producer = _trigger(sqs_endpoint, url).build_producer()
    with anyio.fail_after(10):
        try:
            with pytest.raises(ProducerConfigError, match="no-such-queue"):
                await anext(aiter(producer.open_stream()))
        finally:
            await producer.aclose()


# -- through the real triggerer ----------------------------------------------------------


async def test_three_filtered_watchers_through_the_real_triggerer(
    sqs_endpoint, sqs, sqs_queue_name, migrated_sqlite_url: str, caplog
) -> None:
    url = await create_queue(sqs, sqs_queue_name)
    db = Database(migrated_sqlite_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    triggers = {
        "orders": _trigger(sqs_endpoint, url, body_filter={"kind": "order"}),
        "refunds": _trigger(sqs_endpoint, url, body_filter={"kind": ["refund", "chargeback"]}),
        "eu": _trigger(sqs_endpoint, url, attribute_filter={"region": "eu"}),
    }
    assets = seed_watchers(db, cipher, triggers)
    kinds = ["order", "refund", "chargeback", "noise"]
    regions = ["eu", "us", None]
    entries = []
    for n in range(120):
        entry: dict[str, Any] = {"MessageBody": json.dumps({"kind": kinds[n % 4], "n": n})}
        if (region := regions[n % 3]) is not None:
            entry["MessageAttributes"] = {"region": {"DataType": "String", "StringValue": region}}
        entries.append(entry)
    triggerer = fast_triggerer(db, cipher)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            key = triggers["orders"].shared_stream_key()
            await wait_until(lambda: triggerer.shared_streams.subscriber_count(key) == 3)
            ids = await send_messages(sqs, url, entries)
            expected = sorted(
                (assets[name], f"sqs:{ids[n]}")
                for n in range(120)
                for name, hit in (
                    ("orders", kinds[n % 4] == "order"),
                    ("refunds", kinds[n % 4] in ("refund", "chargeback")),
                    ("eu", regions[n % 3] == "eu"),
                )
                if hit
            )
            await wait_until(lambda: len(asset_events(db)) >= len(expected), within=20)
            await eventually(_empty(sqs, url))
            assert triggerer.shared_streams.group_keys == (key,)  # one poll for three watchers
            triggerer.shutdown()
    assert sorted(asset_events(db)) == expected  # every match once, nothing else
    assert SECRET not in caplog.text
    db.dispose()
