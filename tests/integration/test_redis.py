"""The Redis Streams producer and ``RedisStreamTrigger`` against the machine's Redis.

Most tests drive the real ``SharedStreamManager`` with ``SubscriberHarness`` subscribers (as
the triggerer does), or the producer alone; the last ones run watchers through the real
triggerer on SQLite. Each test has its own stream names (``redis_stream_name``), deleted
afterwards with their dead streams.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet

from engine.crypto import KwargsCipher
from engine.db.database import Database
from producers import RedisStreamTrigger
from producers.exceptions import (
    BrokerRefused,
    BrokerUnavailable,
    ProducerConfigError,
    ProducerError,
)
from shared_stream import AckTimeout, AdvanceItem, AdvanceOutcome, SharedStreamManager
from shared_stream.testing import SubscriberHarness
from tests.waiting import eventually, wait_until
from tests.watcher_rows import asset_events, fast_triggerer, seed_watchers

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

pytestmark = pytest.mark.integration

GROUP = "sluice"
CLEAN = AdvanceOutcome(acked=1, failed=0)
FAILED = AdvanceOutcome(acked=0, failed=1)


def _trigger(url: str, streams: str | Sequence[str], **kwargs: Any) -> RedisStreamTrigger:
    kwargs.setdefault("block_ms", 500)
    names = [streams] if isinstance(streams, str) else list(streams)
    return RedisStreamTrigger(streams=names, group=GROUP, url=url, **kwargs)


async def _publish(client: Any, stream: str, *bodies: Any, **fields: str) -> list[str]:
    ids = []
    for body in bodies:
        raw = body if isinstance(body, bytes | str) else json.dumps(body)
        ids.append((await client.xadd(stream, {"body": raw, **fields})).decode())
    return ids


async def _pending(client: Any, stream: str) -> int:
    return int((await client.xpending(stream, GROUP))["pending"])


def _all_acked(client: Any, *streams: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        for stream in streams:
            if await _pending(client, stream):
                return False
            [info] = [g for g in await client.xinfo_groups(stream) if g["name"].decode() == GROUP]
            if info["last-delivered-id"].decode() != (await _last_id(client, stream)):
                return False
        return True

    return check


async def _last_id(client: Any, stream: str) -> str:
    [(entry_id, _)] = await client.xrevrange(stream, count=1)
    return str(entry_id.decode())


async def _dead(client: Any, stream: str) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in await client.xrange(f"{stream}:dead")
    ]


async def test_sibling_watchers_with_different_filters_share_one_consumer(
    redis_streams_url, redis_client, redis_stream_name, caplog
) -> None:
    stream = redis_stream_name
    kinds = ["a", "b", "c"]
    ids = await _publish(redis_client, stream, *({"kind": kinds[n % 3], "n": n} for n in range(30)))
    by_body = _trigger(redis_streams_url, stream, body_filter={"kind": ["a", "b"]})
    by_field = _trigger(
        "redis://127.0.0.1:6379/11",
        stream,
        field_filter={"body": json.dumps({"kind": "c", "n": 2})},
    )
    assert by_body.shared_stream_key() == by_field.shared_stream_key()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            subscribers = [
                SubscriberHarness(manager, trigger, trigger_id=i)
                for i, trigger in enumerate((by_body, by_field))
            ]
            for harness in subscribers:
                tg.start_soon(harness.run)
            await subscribers[0].wait_for_events(20)
            await subscribers[1].wait_for_events(1)
            await eventually(_all_acked(redis_client, stream))
            assert manager.group_keys == (by_body.shared_stream_key(),)
            tg.cancel_scope.cancel()
    first, second = subscribers
    assert [p["body"]["n"] for p in first.payloads] == [n for n in range(30) if n % 3 != 2]
    assert [e.dedup_key for e in first.events] == [
        f"redis:{stream}:{ids[n]}" for n in range(30) if n % 3 != 2
    ]
    [only] = second.payloads
    assert only == {
        "stream": stream,
        "entry_id": ids[2],
        "fields": {"body": json.dumps({"kind": "c", "n": 2})},
        "body": {"kind": "c", "n": 2},
        "body_format": "json",
        "delivery_count": 1,
    }


async def test_nothing_is_acked_until_every_subscriber_resolved_it(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    stream = redis_stream_name
    await _publish(redis_client, stream, *({"n": n} for n in range(5)))
    trigger = _trigger(redis_streams_url, stream)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            fast = SubscriberHarness(manager, trigger, trigger_id=1)
            held = SubscriberHarness(manager, trigger, trigger_id=2, auto_confirm=False)
            tg.start_soon(fast.run)
            tg.start_soon(held.run)
            await fast.wait_for_events(5)
            await held.wait_for_events(5)
            assert await _pending(redis_client, stream) == 5  # the held ones: none acked
            held.confirm_all()
            await eventually(_all_acked(redis_client, stream))
            tg.cancel_scope.cancel()


async def test_a_failed_entry_is_read_again_at_once_without_waiting_for_the_block(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    stream = redis_stream_name
    [entry_id] = await _publish(redis_client, stream, {"n": 1})
    # A 30 s block: the entry comes back within the bound only because advance interrupts it.
    trigger = _trigger(redis_streams_url, stream, block_ms=30_000)
    with anyio.fail_after(8):
        async with anyio.create_task_group() as tg, SharedStreamManager(ack_timeout=0.5) as manager:
            fine = SubscriberHarness(manager, trigger, trigger_id=1)
            stuck = SubscriberHarness(manager, trigger, trigger_id=2, auto_confirm=False)
            tg.start_soon(fine.run)
            tg.start_soon(stuck.run)
            await fine.wait_for_events(2)
            await stuck.wait_finished()
            await eventually(_all_acked(redis_client, stream))
            tg.cancel_scope.cancel()
    assert isinstance(stuck.error, AckTimeout)
    assert [(p["entry_id"], p["delivery_count"]) for p in fine.payloads] == [
        (entry_id, 1),
        (entry_id, 2),
    ]
    assert {e.dedup_key for e in fine.events} == {f"redis:{stream}:{entry_id}"}  # one event


async def test_a_rejected_entry_and_a_poison_body_go_to_the_dead_stream(
    redis_streams_url, redis_client, redis_stream_name, caplog
) -> None:
    stream = redis_stream_name
    ids = await _publish(redis_client, stream, {"kind": "order", "n": 1}, b"\xffnot json")
    ids += await _publish(redis_client, stream, {"kind": "order", "n": 2})
    trigger = _trigger(redis_streams_url, stream, body_filter={"kind": "order"})
    trigger.trigger_id = 7  # the runtime sets it; the harness does not
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=7)
            tg.start_soon(harness.run)
            await harness.wait_for_events(2)
            await eventually(_all_acked(redis_client, stream))
            tg.cancel_scope.cancel()
    assert [p["entry_id"] for p in harness.payloads] == [ids[0], ids[2]]
    [dead] = await redis_client.xrange(f"{stream}:dead")
    fields = dead[1]
    assert fields[b"body"] == b"\xffnot json"  # the bytes as they were
    assert fields[b"sluice.original_id"].decode() == ids[1]
    assert fields[b"sluice.original_stream"].decode() == stream
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "redis.entry_rejected"]
    assert (record.trigger_id, record.entry_id) == (7, ids[1])


async def test_an_entry_delivered_more_than_max_deliveries_times_is_dead_lettered(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    stream = redis_stream_name
    [entry_id] = await _publish(redis_client, stream, {"n": 1})
    producer = _trigger(redis_streams_url, stream, max_deliveries=2).build_producer()
    counts = []
    with anyio.fail_after(8):
        stream_iter = producer.open_stream()
        try:
            for _ in range(2):
                entry, ref = await anext(stream_iter)
                counts.append(entry.delivery_count)
                await producer.advance([AdvanceItem(ref, FAILED)])
            await eventually(lambda: _dead_soon(redis_client, stream, stream_iter))
        finally:
            await stream_iter.aclose()
            await producer.aclose()
    assert counts == [1, 2]
    [dead] = await _dead(redis_client, stream)
    assert dead["sluice.original_id"] == entry_id
    assert "max_deliveries=2" in dead["sluice.reason"]
    assert await _pending(redis_client, stream) == 0


async def _dead_soon(client: Any, stream: str, stream_iter: Any) -> bool:
    """Let the producer run one more round (it yields nothing: the entry is dead)."""
    with anyio.move_on_after(0.2):
        await anext(stream_iter)
    return bool(await client.exists(f"{stream}:dead"))


async def test_each_stream_is_a_lane_acked_on_its_own_in_order(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    held, free = f"{redis_stream_name}-held", f"{redis_stream_name}-free"
    for stream in (held, free):
        await _publish(redis_client, stream, *({"lane": stream, "n": n} for n in range(6)))
    trigger = _trigger(redis_streams_url, [held, free])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1, auto_confirm=False)
            tg.start_soon(harness.run)
            await harness.wait_for_events(12)
            manager.confirm_persisted(
                [
                    seq
                    for seq, event in zip(harness.seqs, harness.events, strict=True)
                    if event.payload["stream"] == free and seq is not None
                ]
            )
            await eventually(_all_acked(redis_client, free))
            assert await _pending(redis_client, held) == 6  # its lane waits, the other went on
            harness.confirm_all()
            await eventually(_all_acked(redis_client, held, free))
            tg.cancel_scope.cancel()
    for stream in (held, free):
        ns = [p["body"]["n"] for p in harness.payloads if p["stream"] == stream]
        assert ns == list(range(6))


async def test_a_restarted_consumer_reads_its_own_pending_entries_first(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    stream = redis_stream_name
    ids = await _publish(redis_client, stream, *({"n": n} for n in range(3)))
    trigger = _trigger(redis_streams_url, stream, consumer_name="engine-1")
    with anyio.fail_after(8):
        first = trigger.build_producer()
        reader = first.open_stream()
        held = [await anext(reader) for _ in range(3)]
        await first.advance([AdvanceItem(held[0][1], CLEAN)])
        await reader.aclose()
        await first.aclose()  # two left pending for engine-1
        again = trigger.build_producer()
        reader = again.open_stream()
        try:
            redelivered = [await anext(reader) for _ in range(2)]
            await again.advance([AdvanceItem(ref, CLEAN) for _, ref in redelivered])
        finally:
            await reader.aclose()
            await again.aclose()
    assert [(e.entry_id, e.delivery_count) for e, _ in redelivered] == [(ids[1], 2), (ids[2], 2)]
    assert await _pending(redis_client, stream) == 0


async def test_an_entry_trimmed_before_its_ack_is_reported_lost_and_acked(
    redis_streams_url, redis_client, redis_stream_name, caplog
) -> None:
    stream = redis_stream_name
    ids = await _publish(redis_client, stream, {"n": 0}, {"n": 1})
    trigger = _trigger(redis_streams_url, stream, consumer_name="engine-1")
    with anyio.fail_after(8):
        first = trigger.build_producer()
        reader = first.open_stream()
        [await anext(reader) for _ in range(2)]
        await reader.aclose()
        await first.aclose()
        await redis_client.xdel(stream, ids[0])  # trimmed while pending
        again = trigger.build_producer()
        reader = again.open_stream()
        try:
            entry, ref = await anext(reader)
            await again.advance([AdvanceItem(ref, CLEAN)])
        finally:
            await reader.aclose()
            await again.aclose()
    assert entry.entry_id == ids[1]
    assert await _pending(redis_client, stream) == 0
    [lost] = [r for r in caplog.records if getattr(r, "action", None) == "redis.entries_lost"]
    assert ids[0] in lost.getMessage()


async def test_a_dead_consumer_s_entries_are_claimed_after_claim_idle_ms(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    stream = redis_stream_name
    [entry_id] = await _publish(redis_client, stream, {"n": 1})
    await redis_client.xgroup_create(stream, GROUP, "0")
    await redis_client.xreadgroup(GROUP, "dead-engine", {stream: ">"})  # then it died
    trigger = _trigger(redis_streams_url, stream, claim_idle_ms=300, consumer_name="survivor")
    producer = trigger.build_producer()
    with anyio.fail_after(8):
        reader = producer.open_stream()
        try:
            entry, ref = await anext(reader)
            await producer.advance([AdvanceItem(ref, CLEAN)])
        finally:
            await reader.aclose()
            await producer.aclose()
    assert (entry.entry_id, entry.delivery_count) == (entry_id, 2)
    assert await _pending(redis_client, stream) == 0
    consumers = [c["name"].decode() for c in await redis_client.xinfo_consumers(stream, GROUP)]
    assert consumers == ["survivor"]  # the dead one, holding nothing now, was deleted


async def test_entries_in_flight_are_kept_from_other_consumers_claims(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    stream = redis_stream_name
    await _publish(redis_client, stream, {"n": 1})
    producer = _trigger(redis_streams_url, stream, claim_idle_ms=300).build_producer()
    got: list[Any] = []

    async def consume() -> None:
        async for item in producer.open_stream():
            got.append(item)  # noqa: PERF401 - seen one by one while it runs

    with anyio.fail_after(8):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await wait_until(lambda: got)
            # While it holds the entry the producer keeps resetting its idle time: watch Redis
            # see that happen twice (the idle time going down), then try to claim it.
            seen = {"idle": 0, "resets": 0}

            async def reset_twice() -> bool:
                [entry] = await redis_client.xpending_range(stream, GROUP, "-", "+", 1)
                idle = int(entry["time_since_delivered"])
                seen["resets"] += idle < seen["idle"]
                seen["idle"] = idle
                return seen["resets"] >= 2

            await eventually(reset_twice, within=6, step=0.02)
            _, claimed, _ = await redis_client.xautoclaim(stream, GROUP, "thief", 300, count=10)
            assert claimed == []
            await producer.advance([AdvanceItem(got[0][1], CLEAN)])
            tg.cancel_scope.cancel()
        await producer.aclose()
    assert await _pending(redis_client, stream) == 0


async def test_on_reject_leave_redelivers_a_rejected_entry_until_max_deliveries(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    stream = redis_stream_name
    ids = await _publish(redis_client, stream, "not json", {"kind": "order"})
    trigger = _trigger(
        redis_streams_url,
        stream,
        body_filter={"kind": "order"},
        on_reject="leave",
        claim_idle_ms=200,
        max_deliveries=2,
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(harness.run)
            await harness.wait_for_events(1)
            await eventually(lambda: _dead_exists(redis_client, stream))
            await eventually(_all_acked(redis_client, stream))
            tg.cancel_scope.cancel()
    [dead] = await _dead(redis_client, stream)
    assert (dead["body"], dead["sluice.original_id"]) == ("not json", ids[0])
    assert "max_deliveries=2" in dead["sluice.reason"]  # rejected twice, then dead


async def _dead_exists(client: Any, stream: str) -> bool:
    return bool(await client.exists(f"{stream}:dead"))


async def test_close_releases_what_is_in_flight_to_the_next_claim_at_once(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    stream = redis_stream_name
    [entry_id] = await _publish(redis_client, stream, {"n": 1})
    # A claim idle time of a minute: only the release makes the entry claimable now.
    first = _trigger(redis_streams_url, stream, consumer_name="old", claim_idle_ms=60_000)
    second = _trigger(redis_streams_url, stream, consumer_name="new", claim_idle_ms=60_000)
    with anyio.fail_after(8):
        producer = first.build_producer()
        reader = producer.open_stream()
        await anext(reader)
        await reader.aclose()
        await producer.aclose()
        producer = second.build_producer()
        reader = producer.open_stream()
        try:
            entry, ref = await anext(reader)
            await producer.advance([AdvanceItem(ref, CLEAN)])
        finally:
            await reader.aclose()
            await producer.aclose()
    assert entry.entry_id == entry_id
    assert await _pending(redis_client, stream) == 0


async def test_a_fenced_producer_sends_nothing_more_to_the_group(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    stream = redis_stream_name
    await _publish(redis_client, stream, {"n": 0}, {"n": 1})
    producer = _trigger(redis_streams_url, stream, consumer_name="zombie").build_producer()
    with anyio.fail_after(8):
        reader = producer.open_stream()
        _, ref = await anext(reader)
        producer.fence()
        with pytest.raises(ProducerError, match="fenced"):
            await producer.advance([AdvanceItem(ref, CLEAN)])
        with pytest.raises(ProducerError, match="fenced"):
            while True:
                await anext(reader)  # what the last read returned, then no read more
        await producer.aclose()
    [zombie] = await redis_client.xinfo_consumers(stream, GROUP)
    assert (zombie["name"], zombie["pending"]) == (b"zombie", 2)  # not acked, not released
    [ours] = await redis_client.xpending_range(stream, GROUP, "-", "+", 1)
    assert ours["time_since_delivered"] < 60_000  # no release: claimed after claim_idle_ms


async def test_max_in_flight_bounds_what_the_producer_holds(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    streams = [f"{redis_stream_name}-{i}" for i in range(3)]
    for stream in streams:
        await _publish(redis_client, stream, *({"n": n} for n in range(5)))
    producer = _trigger(redis_streams_url, streams, max_in_flight=4).build_producer()
    got: list[Any] = []

    async def consume() -> None:
        async for item in producer.open_stream():
            got.append(item)  # noqa: PERF401 - seen one by one while it runs

    with anyio.fail_after(8):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await wait_until(lambda: len(got) == 4)
            # A negative check needs a window: the consumer asks for more, none may come.
            await anyio.sleep(0.3)
            assert len(got) == len(producer.in_flight) == 4
            assert sum([await _pending(redis_client, s) for s in streams]) == 4  # none read
            await producer.advance([AdvanceItem(got[0][1], CLEAN)])
            await wait_until(lambda: len(got) == 5)  # capacity freed: the next one comes
            tg.cancel_scope.cancel()
        await producer.aclose()


async def test_a_cancelled_blocking_read_ends_promptly(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    producer = _trigger(redis_streams_url, redis_stream_name, block_ms=20_000).build_producer()
    with anyio.fail_after(3):  # far below the 20 s block
        reader = producer.open_stream()
        with anyio.move_on_after(0.3) as scope:
            await anext(reader)
        assert scope.cancelled_caught
        await reader.aclose()
        await producer.aclose()
    assert "connected=False" in repr(producer)
    assert await redis_client.exists(redis_stream_name)  # the group made it (MKSTREAM)


async def test_an_unreachable_server_raises_broker_unavailable_naming_it() -> None:
    trigger = RedisStreamTrigger(stream="s", group="g", url="redis://:hunter2@127.0.0.1:9/3")
    with anyio.fail_after(10):
        producer = trigger.build_producer()
        try:
            with pytest.raises(BrokerUnavailable, match="cannot reach the server") as info:
                await anext(aiter(producer.open_stream()))
        finally:
            await producer.aclose()
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(harness.run)
            await harness.wait_finished()
    assert info.value.address == "redis://127.0.0.1:9/3"
    assert "hunter2" not in str(info.value)
    assert type(info.value.__cause__).__module__.startswith("redis")
    assert isinstance(harness.error, BrokerUnavailable)  # the subscriber fails: restarted


async def test_a_wrong_password_is_refused_and_a_wrong_key_type_is_a_config_error(
    redis_streams_url, redis_client, redis_stream_name
) -> None:
    bad = RedisStreamTrigger(
        stream=redis_stream_name, group="g", url="redis://nobody:hunter2@127.0.0.1:6379/11"
    )
    await redis_client.set(redis_stream_name, "a string, not a stream")
    wrong_type = _trigger(redis_streams_url, redis_stream_name)
    with anyio.fail_after(10):
        for trigger, error, match in (
            (bad, BrokerRefused, "refused the login"),
            (wrong_type, ProducerConfigError, "WRONGTYPE"),
        ):
            producer = trigger.build_producer()
            try:
                with pytest.raises(error, match=match) as info:
                    await anext(aiter(producer.open_stream()))
            finally:
                await producer.aclose()
            assert "hunter2" not in str(info.value)


def test_settings_that_cannot_work_are_refused_when_the_dag_file_is_parsed() -> None:
    with pytest.raises(ProducerConfigError, match="max_in_flight=0") as info:
        RedisStreamTrigger(stream="s", group="g", max_in_flight=0, url="http://x")
    assert "url must start with" in str(info.value)
    with pytest.raises(ProducerConfigError, match="streams or stream"):
        RedisStreamTrigger(stream="s", streams=["t"], group="g")


# -- through the real triggerer ----------------------------------------------------------


async def test_watchers_by_connection_id_through_the_real_triggerer_absorb_a_redelivery(
    redis_streams_url, redis_client, redis_stream_name, migrated_sqlite_url, monkeypatch, caplog
) -> None:
    caplog.set_level(logging.INFO)
    stream = redis_stream_name
    # The URI form of a connection, with a password the server ignores (none configured).
    monkeypatch.setenv("SLUICE_CONN_REDIS_EVENTS", "redis://127.0.0.1:6379/11")
    db = Database(migrated_sqlite_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())

    def watcher(**kwargs: Any) -> RedisStreamTrigger:
        return RedisStreamTrigger(
            stream=stream, group=GROUP, conn_id="redis_events", block_ms=500, **kwargs
        )

    triggers = {
        "orders": watcher(body_filter={"kind": "order"}),
        "refunds": watcher(body_filter={"kind": ["refund", "chargeback"]}),
        "eu": watcher(field_filter={"region": "eu"}, partition_key_entry_field="region"),
    }
    assets = seed_watchers(db, cipher, triggers)
    kinds, regions = ["order", "refund", "chargeback", "noise"], ["eu", "us", "apac"]
    triggerer = fast_triggerer(db, cipher)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            key = triggers["orders"].shared_stream_key()
            await wait_until(lambda: triggerer.shared_streams.subscriber_count(key) == 3)
            ids = []
            for n in range(60):
                body = json.dumps({"kind": kinds[n % 4], "n": n})
                ids.append(
                    (
                        await redis_client.xadd(stream, {"body": body, "region": regions[n % 3]})
                    ).decode()
                )
            expected = sorted(
                (assets[name], f"redis:{stream}:{ids[n]}")
                for n in range(60)
                for name, hit in (
                    ("orders", kinds[n % 4] == "order"),
                    ("refunds", kinds[n % 4] in ("refund", "chargeback")),
                    ("eu", regions[n % 3] == "eu"),
                )
                if hit
            )
            await wait_until(lambda: len(asset_events(db)) >= len(expected), within=20)
            await eventually(_all_acked(redis_client, stream))
            # A redelivery of everything (the group rewound): no second asset event.
            await redis_client.xgroup_setid(stream, GROUP, "0")
            await eventually(_all_acked(redis_client, stream))
            assert triggerer.shared_streams.group_keys == (key,)  # one consumer, three watchers
            triggerer.shutdown()
    assert sorted(asset_events(db)) == expected  # every match once, nothing else
    db.dispose()
