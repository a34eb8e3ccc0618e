"""The NATS JetStream producer and ``NatsJetStreamTrigger`` against the machine's nats-server.

Most tests drive the real ``SharedStreamManager`` with ``SubscriberHarness`` subscribers (as
the triggerer does); the last one runs watchers through the real triggerer on SQLite. Each
test has streams of its own (``nats_stream_name``), deleted afterwards; a test that needs
credentials or a broker that goes away runs a private nats-server.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from nats.js.errors import NotFoundError
from sqlalchemy import insert, select

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, AssetWatcher
from engine.db.queries import triggers as trigger_rows
from engine.states import TriggerKind
from engine.triggerer.triggerer import Triggerer, TriggererSettings
from producers import NatsJetStreamTrigger
from producers.exceptions import (
    BrokerRefused,
    BrokerUnavailable,
    ProducerConfigError,
    ProducerError,
)
from shared_stream import AckTimeout, AdvanceItem, AdvanceOutcome, SharedStreamManager
from shared_stream.testing import SubscriberHarness
from tests.services_nats import PrivateNats, connect, free_port, jetstream_streams, read_all
from tests.waiting import eventually, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-never-logged"


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Any]:
    client = await connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
async def streams(nc, nats_stream_name) -> AsyncIterator[tuple[str, str]]:
    async with jetstream_streams(nc, nats_stream_name) as (subjects, dlq):
        assert dlq is not None
        yield subjects, dlq


def _trigger(stream: str, **kwargs: Any) -> NatsJetStreamTrigger:
    kwargs.setdefault("durable", "sluice")
    return NatsJetStreamTrigger(stream=stream, **kwargs)


async def _publish(nc: Any, subject: str, *bodies: Any, headers: Any = None) -> list[int]:
    js = nc.jetstream()
    sequences = []
    for body in bodies:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        ack = await js.publish(subject, data, headers=headers)
        sequences.append(ack.seq)
    return sequences


def _settled(nc: Any, stream: str, durable: str = "sluice") -> Callable[[], Awaitable[bool]]:
    """Nothing left for the consumer: no pending message, no unacked delivery."""

    async def check() -> bool:
        try:
            info = await nc.jetstream().consumer_info(stream, durable)
        except NotFoundError:  # not (re)created yet
            return False
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)

    return check


async def _ack_pending(nc: Any, stream: str, durable: str = "sluice") -> int:
    info = await nc.jetstream().consumer_info(stream, durable)
    return int(info.num_ack_pending)


async def test_sibling_watchers_see_their_own_messages_and_all_are_acked(
    nc, nats_stream_name, streams, caplog
) -> None:
    name = nats_stream_name
    by_kind = _trigger(name, body_filter={"kind": "a"}, password=SECRET)
    by_header = _trigger(name, header_filter={"region": ["eu", "uk"]}, password=SECRET)
    sequences = []
    for n in range(12):
        headers = {"region": ("eu", "us", "uk")[n % 3]}
        sequences += await _publish(
            nc, f"{name}.orders", {"kind": "ab"[n % 2], "n": n}, headers=headers
        )
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            kinds = SubscriberHarness(manager, by_kind, trigger_id=1)
            regions = SubscriberHarness(manager, by_header, trigger_id=2)
            tg.start_soon(kinds.run)
            tg.start_soon(regions.run)
            await kinds.wait_for_events(6)
            await regions.wait_for_events(8)
            await eventually(_settled(nc, name))
            assert manager.group_keys == (by_kind.shared_stream_key(),)  # one consumer
            tg.cancel_scope.cancel()
    assert [p["body"]["n"] for p in kinds.payloads] == [0, 2, 4, 6, 8, 10]
    assert [p["body"]["n"] for p in regions.payloads] == [0, 2, 3, 5, 6, 8, 9, 11]
    assert [e.dedup_key for e in kinds.events] == [f"nats:{name}:{s}" for s in sequences[::2]]
    first = kinds.payloads[0]
    assert first["stream"] == name and first["subject"] == f"{name}.orders"
    assert first["headers"] == {"region": "eu"} and first["num_delivered"] == 1
    assert SECRET not in caplog.text


async def test_nothing_is_acked_until_every_subscriber_confirmed(
    nc, nats_stream_name, streams
) -> None:
    name = nats_stream_name
    await _publish(nc, f"{name}.x", *({"n": n} for n in range(5)))
    trigger = _trigger(name)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            quick = SubscriberHarness(manager, trigger, trigger_id=1)
            held = SubscriberHarness(manager, trigger, trigger_id=2, auto_confirm=False)
            tg.start_soon(quick.run)
            tg.start_soon(held.run)
            await quick.wait_for_events(5)
            await held.wait_for_events(5)
            assert await _ack_pending(nc, name) == 5  # one subscriber confirmed: not enough
            held.confirm_all()
            await eventually(_settled(nc, name))
            tg.cancel_scope.cancel()


async def test_a_failed_message_is_redelivered_at_once_with_the_same_dedup_key(
    nc, nats_stream_name, streams
) -> None:
    name = nats_stream_name
    [seq] = await _publish(nc, f"{name}.x", {"n": 1})
    trigger = _trigger(name, ack_wait_s=60)  # redelivered by the nak, not the ack wait
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager(ack_timeout=0.5) as manager:
            fine = SubscriberHarness(manager, trigger, trigger_id=1)
            stuck = SubscriberHarness(manager, trigger, trigger_id=2, auto_confirm=False)
            tg.start_soon(fine.run)
            tg.start_soon(stuck.run)
            await fine.wait_for_events(2)
            await stuck.wait_finished()
            await eventually(_settled(nc, name))
            tg.cancel_scope.cancel()
    assert isinstance(stuck.error, AckTimeout)
    assert [p["num_delivered"] for p in fine.payloads] == [1, 2]
    assert [e.dedup_key for e in fine.events] == [f"nats:{name}:{seq}"] * 2


async def test_a_rejected_poison_message_is_dead_lettered_and_terminated(
    nc, nats_stream_name, streams, caplog
) -> None:
    name = nats_stream_name
    _, dlq = streams
    trigger = _trigger(name, body_filter={"kind": "order"}, dead_letter_subject=dlq)
    trigger.trigger_id = 7  # the runtime sets it; the harness does not
    sequences = await _publish(
        nc, f"{name}.x", {"kind": "order", "n": 1}, b"not json", {"kind": "order", "n": 2}
    )
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=7)
            tg.start_soon(harness.run)
            await harness.wait_for_events(2)
            await eventually(_settled(nc, name))
            tg.cancel_scope.cancel()
    assert [p["body"]["n"] for p in harness.payloads] == [1, 2]
    [dead] = await read_all(nc, f"{name}_DLQ")
    assert dead.data == b"not json"
    assert dead.headers["Sluice-Dead-Letter-Cause"] == "rejected"
    assert dead.headers["Sluice-Original-Sequence"] == str(sequences[1])
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "nats.message_rejected"]
    assert record.trigger_id == 7 and record.message_id == f"nats:{name}:{sequences[1]}"


async def test_on_reject_nak_redelivers_a_rejected_message_then_dead_letters_it(
    nc, nats_stream_name, streams
) -> None:
    name = nats_stream_name
    _, dlq = streams
    [seq] = await _publish(nc, f"{name}.x", b"not json")
    common = {"on_reject": "nak", "max_deliver": 2, "dead_letter_subject": dlq}
    picky = _trigger(name, body_filter={"kind": "order"}, **common)
    catch_all = _trigger(name, **common)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harnesses = [
                SubscriberHarness(manager, t, trigger_id=i) for i, t in ((1, picky), (2, catch_all))
            ]
            for harness in harnesses:
                tg.start_soon(harness.run)
            await harnesses[1].wait_for_events(2)  # delivered twice: the nak redelivered it
            await eventually(_settled(nc, name))
            tg.cancel_scope.cancel()
    assert [e.dedup_key for e in harnesses[1].events] == [f"nats:{name}:{seq}"] * 2
    [dead] = await read_all(nc, f"{name}_DLQ")  # its last delivery was rejected too
    assert dead.data == b"not json" and dead.headers["Sluice-Dead-Letter-Cause"] == "rejected"


async def test_a_failure_on_the_last_delivery_is_dead_lettered_not_dropped(
    nc, nats_stream_name, streams
) -> None:
    name = nats_stream_name
    _, dlq = streams
    await _publish(nc, f"{name}.x", {"n": 1})
    trigger = _trigger(name, max_deliver=2, dead_letter_subject=dlq, ack_wait_s=60)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager(ack_timeout=0.3) as manager:
            fine = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(fine.run)
            for trigger_id in (2, 3):  # one stuck subscriber per delivery: both fail
                stuck = SubscriberHarness(
                    manager, trigger, trigger_id=trigger_id, auto_confirm=False
                )
                tg.start_soon(stuck.run)
                await stuck.wait_finished()
            await eventually(_settled(nc, name))
            tg.cancel_scope.cancel()
    [dead] = await read_all(nc, f"{name}_DLQ")
    assert dead.headers["Sluice-Dead-Letter-Cause"] == "max_deliver"
    assert json.loads(dead.data) == {"n": 1}


async def test_close_dead_letters_a_last_delivery_instead_of_releasing_it(
    nc, nats_stream_name, streams
) -> None:
    name = nats_stream_name
    _, dlq = streams
    await _publish(nc, f"{name}.x", {"n": 1})
    producer = _trigger(name, max_deliver=1, dead_letter_subject=dlq).build_producer()
    with anyio.fail_after(10):
        stream = producer.open_stream()
        message, _receipt = await anext(stream)  # its first delivery is its last
        await stream.aclose()
        await producer.aclose()
    [dead] = await read_all(nc, f"{name}_DLQ")  # a nak would have dropped it
    assert dead.headers["Sluice-Dead-Letter-Cause"] == "max_deliver"
    assert dead.headers["Sluice-Original-Sequence"] == str(message.sequence)
    assert await _settled(nc, name)()


async def test_a_last_delivery_another_consumer_never_acked_is_dead_lettered_by_the_advisory(
    nc, nats_stream_name, streams
) -> None:
    from nats.js.api import ConsumerConfig

    name = nats_stream_name
    _, dlq = streams
    js = nc.jetstream()
    # A consumer (an engine that then died) takes the message on its last delivery.
    config = ConsumerConfig(durable_name="sluice", ack_wait=1.0, max_deliver=1)
    await js.add_consumer(name, config)
    [seq] = await _publish(nc, f"{name}.x", {"n": 1})
    [held] = await (await js.pull_subscribe_bind("sluice", stream=name)).fetch(1, timeout=5)
    assert held.metadata.num_delivered == 1
    trigger = _trigger(name, max_deliver=1, ack_wait_s=1.0, dead_letter_subject=dlq)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(harness.run)
            await eventually(lambda: _dead_letter_count(nc, name, 1))
            tg.cancel_scope.cancel()
    [dead] = await read_all(nc, f"{name}_DLQ")
    assert dead.headers["Sluice-Original-Sequence"] == str(seq)
    assert dead.headers["Sluice-Dead-Letter-Cause"] == "max_deliver"
    assert harness.events == []  # JetStream never delivered it again


async def _dead_letter_count(nc: Any, stream: str, count: int) -> bool:
    info = await nc.jetstream().stream_info(f"{stream}_DLQ")
    return bool(info.state.messages == count)


async def test_subjects_are_lanes_that_advance_independently(nc, nats_stream_name, streams) -> None:
    name = nats_stream_name
    for n in range(6):
        for lane in ("a", "b"):
            await _publish(nc, f"{name}.{lane}", {"lane": lane, "n": n})
    trigger = _trigger(name)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1, auto_confirm=False)
            tg.start_soon(harness.run)
            await harness.wait_for_events(12)
            held = [
                s
                for s, e in zip(harness.seqs, harness.events, strict=True)
                if e.payload["body"]["lane"] == "a"
            ]
            manager.confirm_persisted([s for s in harness.unconfirmed if s not in held])
            await eventually(lambda: _only(nc, name, 6))  # lane b acked past lane a's wait
            manager.confirm_persisted(held)
            await eventually(_settled(nc, name))
            tg.cancel_scope.cancel()
    order = [(p["body"]["lane"], p["body"]["n"]) for p in harness.payloads]
    for lane in ("a", "b"):
        assert [n for ln, n in order if ln == lane] == list(range(6))


async def _only(nc: Any, stream: str, count: int) -> bool:
    return await _ack_pending(nc, stream) == count


async def test_the_ack_wait_is_extended_while_a_slow_subscriber_works(
    nc, nats_stream_name, streams
) -> None:
    name = nats_stream_name
    await _publish(nc, f"{name}.x", {"n": 1})
    trigger = _trigger(name, ack_wait_s=1.0)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1, auto_confirm=False)
            tg.start_soon(harness.run)
            await harness.wait_for_events(1)
            await anyio.sleep(2.5)  # the point: held for 2.5 ack waits, never redelivered
            info = await nc.jetstream().consumer_info(name, "sluice")
            assert info.num_redelivered == 0 and info.num_ack_pending == 1
            harness.confirm_all()
            await eventually(_settled(nc, name))
            tg.cancel_scope.cancel()
    assert len(harness.events) == 1


async def test_close_releases_what_is_in_flight_for_redelivery_at_once(
    nc, nats_stream_name, streams
) -> None:
    name = nats_stream_name
    await _publish(nc, f"{name}.x", {"n": 1}, {"n": 2})
    producer = _trigger(name, ack_wait_s=60).build_producer()
    with anyio.fail_after(10):
        stream = producer.open_stream()
        await anext(stream)
        await anext(stream)
        with anyio.move_on_after(0.3):  # a fetch left waiting on the server, then cancelled
            await anext(stream)
        await stream.aclose()
        await producer.aclose()
    assert len(producer.in_flight) == 0 and "connected=False" in repr(producer)
    subscription = await nc.jetstream().pull_subscribe_bind("sluice", stream=name)
    redelivered = await subscription.fetch(2, timeout=2)  # far below the 60 s ack wait
    assert [m.metadata.num_delivered for m in redelivered] == [2, 2]


async def test_a_fenced_producer_pulls_acks_and_dead_letters_nothing_more(
    nc, nats_stream_name, streams, caplog
) -> None:
    name = nats_stream_name
    _, dlq = streams
    await _publish(nc, f"{name}.x", {"n": 1})
    producer = _trigger(name, max_deliver=1, dead_letter_subject=dlq).build_producer()
    with anyio.fail_after(10):
        stream = producer.open_stream()
        _message, receipt = await anext(stream)  # its last delivery
        async with anyio.create_task_group() as tg:
            tg.start_soon(anext, stream)  # polling when the fence comes
            await wait_until(lambda: producer._poll_scope is not None)
            producer.fence()
            await _publish(nc, f"{name}.x", {"n": 2})
            with anyio.move_on_after(0.5) as idle:  # the poll stopped: nothing more comes
                await anyio.sleep_forever()
            assert idle.cancelled_caught
            tg.cancel_scope.cancel()
        with pytest.raises(ProducerError, match="fenced"):
            await producer.advance([AdvanceItem(receipt, AdvanceOutcome(acked=1, failed=0))])
        await stream.aclose()
        await producer.aclose()
    assert await _dead_letter_count(nc, name, 0)  # released (nak), never dead-lettered
    info = await nc.jetstream().consumer_info(name, "sluice")
    assert info.num_pending == 1  # message 2 was never pulled
    assert [r.action for r in caplog.records if r.name == "producers.nats"][-1:] == ["nats.fenced"]


async def test_create_stream_makes_a_missing_stream(nc, nats_stream_name) -> None:
    name = nats_stream_name
    trigger = _trigger(name, create_stream=True, stream_subjects=[f"{name}.>"])
    producer = trigger.build_producer()
    try:
        with anyio.fail_after(10):
            stream = producer.open_stream()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_publish_when_ready, nc, name)
                message, _receipt = await anext(stream)
            await stream.aclose()
        assert message.body == {"n": 1}
    finally:
        await producer.aclose()
        await nc.jetstream().delete_stream(name)


async def _publish_when_ready(nc: Any, name: str) -> None:
    async def ready() -> bool:
        try:
            await nc.jetstream().consumer_info(name, "sluice")
        except Exception:
            return False
        return True

    await eventually(ready)
    await _publish(nc, f"{name}.x", {"n": 1})


async def test_an_unreachable_server_raises_broker_unavailable_naming_it() -> None:
    address = f"nats://127.0.0.1:{free_port()}"
    trigger = _trigger("S", servers=address)
    with anyio.fail_after(10):
        producer = trigger.build_producer()
        try:
            with pytest.raises(BrokerUnavailable, match="cannot reach the servers") as info:
                await anext(aiter(producer.open_stream()))
        finally:
            await producer.aclose()
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(harness.run)
            await harness.wait_finished()
    assert info.value.address == address
    assert type(info.value.__cause__).__module__.startswith("nats")
    assert isinstance(harness.error, BrokerUnavailable)  # the subscriber fails: restarted


async def test_a_server_that_goes_away_ends_the_group_with_broker_unavailable(
    private_nats: PrivateNats,
) -> None:
    client = await connect(private_nats.url)
    await client.jetstream().add_stream(name="S", subjects=["s.>"])
    await client.close()
    trigger = _trigger("S", servers=private_nats.url)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(harness.run)
            await wait_until(lambda: manager.group_keys)
            private_nats.stop()
            await harness.wait_finished()
    assert isinstance(harness.error, BrokerUnavailable)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"user": "alice", "password": "wrong"}, BrokerRefused, "refused"),
        ({"user": "alice", "password": SECRET, "stream": "NOPE"}, ProducerConfigError, "NOPE"),
        (
            {"user": "alice", "password": SECRET, "dead_letter_subject": "nowhere"},
            ProducerConfigError,
            "no JetStream stream",
        ),
    ],
)
async def test_bad_credentials_and_settings_are_clear_errors(kwargs, error, match, caplog) -> None:
    server = PrivateNats(user="alice", password=SECRET)
    server.start()
    try:
        client = await connect(server.url, user="alice", password=SECRET)
        await client.jetstream().add_stream(name="S", subjects=["s.>"])
        await client.close()
        kwargs = dict(kwargs)
        trigger = _trigger(kwargs.pop("stream", "S"), servers=server.url, **kwargs)
        producer = trigger.build_producer()
        with anyio.fail_after(10):
            try:
                with pytest.raises(error, match=match):
                    await anext(aiter(producer.open_stream()))
            finally:
                await producer.aclose()
    finally:
        server.remove()
    assert SECRET not in caplog.text


def test_settings_that_cannot_work_fail_at_construction() -> None:
    with pytest.raises(ProducerConfigError, match="would come back"):
        _trigger("S", subjects="s.>", dead_letter_subject="s.dead")
    with pytest.raises(ProducerConfigError, match="create_stream=True needs"):
        _trigger("S", create_stream=True)
    with pytest.raises(ProducerConfigError, match="max_deliver"):
        _trigger("S", max_deliver=0)


# -- through the real triggerer ----------------------------------------------------------


def _seed_watchers(
    db: Database, cipher: KwargsCipher, triggers: dict[str, NatsJetStreamTrigger]
) -> dict[str, int]:
    def seed(session: Any) -> dict[str, int]:
        assets = {}
        for name, trigger in triggers.items():
            asset_id = session.execute(
                insert(Asset).values(name=name, uri=f"test://{name}", extra={}).returning(Asset.id)
            ).scalar_one()
            classpath, kwargs = trigger.serialize()
            tid = trigger_rows.add_trigger_row(
                session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )
            assets[name] = asset_id
        return assets

    return db.call(seed)


def _asset_events(db: Database) -> list[tuple[int, str]]:
    return db.call(
        lambda s: [(e.asset_id, e.dedup_key) for e in s.execute(select(AssetEvent)).scalars()]
    )


async def _run_triggerer(
    db: Database, cipher: KwargsCipher, key: Any, until: Callable[[], Awaitable[bool]]
) -> None:
    triggerer = Triggerer(
        db=db,
        cipher=cipher,
        settings=TriggererSettings(
            capacity=10, heartbeat_s=1, claim_idle_interval_s=0.05, shutdown_grace_s=5
        ),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(triggerer.run)
        await wait_until(lambda: triggerer.shared_streams.subscriber_count(key) == 2)
        await eventually(until, within=20)
        assert triggerer.shared_streams.group_keys == (key,)  # one consumer for both
        triggerer.shutdown()


async def test_two_watchers_through_the_real_triggerer_by_connection_uri(
    nc, nats_stream_name, streams, migrated_sqlite_url: str, monkeypatch
) -> None:
    name = nats_stream_name
    monkeypatch.setenv("SLUICE_CONN_NATS_LOCAL", "nats://127.0.0.1:4222")
    db = Database(migrated_sqlite_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    triggers = {
        "orders": _trigger(name, conn_id="nats_local", body_filter={"kind": "order"}),
        "eu": _trigger(name, conn_id="nats_local", header_filter={"region": "eu"}),
    }
    assets = _seed_watchers(db, cipher, triggers)
    key = triggers["orders"].shared_stream_key()
    expected = []
    for n in range(60):
        kind, region = ("order", "refund")[n % 2], ("eu", "us", "uk")[n % 3]
        [seq] = await _publish(nc, f"{name}.x", {"kind": kind, "n": n}, headers={"region": region})
        expected += [(assets["orders"], f"nats:{name}:{seq}")] * (kind == "order")
        expected += [(assets["eu"], f"nats:{name}:{seq}")] * (region == "eu")

    async def stored_and_acked() -> bool:
        return len(_asset_events(db)) >= len(expected) and await _settled(nc, name)()

    with anyio.fail_after(40):
        await _run_triggerer(db, cipher, key, stored_and_acked)
        assert sorted(_asset_events(db)) == sorted(expected)  # every match once, nothing else
        # Every message again (the durable recreated from the stream's start): all absorbed.
        await nc.jetstream().delete_consumer(name, "sluice")
        await _run_triggerer(db, cipher, key, _settled(nc, name))
    assert sorted(_asset_events(db)) == sorted(expected)
    db.dispose()
