"""Kafka shared streams against a real broker (tansu): producer, trigger, triggerer."""

from __future__ import annotations

import contextlib
import json
import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import pytest
from aiokafka.errors import KafkaConnectionError
from cryptography.fernet import Fernet

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from producers import KafkaMessageTrigger
from producers.exceptions import BrokerRefused, BrokerUnavailable, UncleanEventError
from shared_stream import SharedStreamManager, SharedStreamTerminated
from shared_stream.subscriber import reject_shared_stream_event
from shared_stream.testing import SubscriberHarness
from tests.services_kafka import (
    FAST_GROUP,
    FILTERS_PLUGIN,
    asset_event_keys,
    committed_offsets,
    expected_keys,
    produce,
    read_topic,
    scenario_record,
    seed_watchers,
    watcher_specs,
)
from tests.waiting import eventually, wait_until
from triggers.base import TriggerEvent

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from producers.kafka_messages import KafkaMessage
    from tests.services_kafka import KafkaBroker

pytestmark = pytest.mark.integration


async def slowly(message: KafkaMessage) -> bool:
    await anyio.sleep(0.002)
    return True


def _kwargs(broker: KafkaBroker, topic: str, group: str, **extra: Any) -> dict[str, Any]:
    return {
        "topics": [topic],
        "bootstrap_servers": broker.bootstrap,
        "group_id": group,
        "auto_offset_reset": "earliest",
        **FAST_GROUP,
        **extra,
    }


async def _wait_committed(
    broker: KafkaBroker, group: str, topic: str, want: dict[int, int | None]
) -> None:
    async def reached() -> bool:
        return await committed_offsets(broker.bootstrap, group, topic, len(want)) == want

    await eventually(reached, within=20, step=0.05)


# -- producer and manager level ------------------------------------------------------------


async def test_slow_partition_head_does_not_hold_back_other_partitions(kafka: KafkaBroker) -> None:
    # A subscriber handles its raw events one after another, so a filter that blocks stalls
    # its whole stream; what a lane keeps local is a head whose trigger event is slow to be
    # persisted. Here the event of partition 0's first message is confirmed last.
    topic = kafka.create_topic(4)
    trigger = KafkaMessageTrigger(**_kwargs(kafka, topic, "slow"))
    key = trigger.shared_stream_key()
    held: list[int] = []
    order: list[tuple[int, int]] = []

    async def drive(stream: Any) -> None:
        with contextlib.suppress(SharedStreamTerminated):
            await confirm_all_but_the_head(stream)

    async def confirm_all_but_the_head(stream: Any) -> None:
        async for event in trigger.filter_shared_stream(stream):
            seq = manager.bind_pending_event(trigger_id=1, key=key)
            assert seq is not None
            order.append((event.payload["partition"], event.payload["offset"]))
            if order[-1] == (0, 0):
                held.append(seq)
            else:
                manager.confirm_persisted([seq])

    with anyio.fail_after(30):
        async with SharedStreamManager() as manager, anyio.create_task_group() as tg:
            tg.start_soon(drive, manager.subscribe(trigger_id=1, trigger=trigger, key=key))
            await produce(kafka.bootstrap, topic, [(0, None, b"{}", [])])
            await wait_until(lambda: held)
            await produce(kafka.bootstrap, topic, [(i % 4, None, b"{}", []) for i in range(1, 400)])
            await _wait_committed(kafka, "slow", topic, {0: None, 1: 100, 2: 100, 3: 100})
            assert order[0] == (0, 0) and len(order) == 400  # the others came after the head
            manager.confirm_persisted(held)
            await _wait_committed(kafka, "slow", topic, {0: 100, 1: 100, 2: 100, 3: 100})
            await manager.stop_all()


async def test_rejected_messages_go_to_the_dead_letter_topic_with_headers(
    kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    topic, dead = kafka.create_topic(2), kafka.create_topic(1, prefix="dlt")
    records = [scenario_record(i, 2) for i in (4240, 4241, 4242, 2500, 2501)]
    await produce(kafka.bootstrap, topic, records)
    common = _kwargs(kafka, topic, "dl", dead_letter_topic=dead)
    json_only = KafkaMessageTrigger(**common, value_format="json")
    fives = KafkaMessageTrigger(**common, apply_function="kafka_filters.multiple_of_five")
    json_only.trigger_id, fives.trigger_id = 11, 12  # as the runtime sets them
    with anyio.fail_after(30):
        async with SharedStreamManager() as manager, anyio.create_task_group() as tg:
            harnesses = [
                SubscriberHarness(manager, json_only, trigger_id=11),
                SubscriberHarness(manager, fives, trigger_id=12),
            ]
            for harness in harnesses:
                tg.start_soon(harness.run)
            await _wait_committed(kafka, "dl", topic, {0: 3, 1: 2})
            assert [h.error for h in harnesses] == [None, None]  # both kept running
            await manager.stop_all()
    assert sorted(e.payload["value"]["n"] for e in harnesses[0].events) == [2501, 4240, 4241, 4242]
    assert [e.payload["value"]["n"] for e in harnesses[1].events] == [4240]
    dead_letters = {
        r.value: dict(r.headers) for r in await read_topic(kafka.bootstrap, dead, expected=2)
    }
    garbage = dead_letters[b"\xff not json"]
    assert garbage["sluice.dead_letter.reason"] == b"rejected"
    assert garbage["sluice.dead_letter.rejected_by"] == b"11"
    assert garbage["sluice.dead_letter.source"] == f"{topic}/0/2".encode()
    assert garbage["parity"] == b"even"  # original headers kept
    boom = dead_letters[json.dumps({"n": 4242, "color": "red"}).encode()]
    assert boom["sluice.dead_letter.rejected_by"] == b"12"
    assert boom["sluice.dead_letter.outcome"] == b"acked=1 failed=0 rejected=1"
    assert "boom on 4242" in json.loads(boom["sluice.dead_letter.errors"])[0]["reason"]
    failed = [r for r in caplog.records if getattr(r, "action", None) == "kafka.filter_failed"]
    assert [r.trigger_id for r in failed] == [12]


class OddRefusingTrigger(KafkaMessageTrigger):
    """A user subclass with its own filter: it receives single messages (the batches of the
    consumer it shares, one message at a time) and refuses one with
    ``reject_shared_stream_event()``."""

    seen: list[Any]

    async def filter_shared_stream(self, shared_stream: Any) -> Any:
        self.seen = []
        async for message in shared_stream:
            self.seen.append(message)
            n = json.loads(message.value)["n"]
            if n % 2:
                message.note_rejection(self.trigger_id, "odd")
                reject_shared_stream_event()
            else:
                yield TriggerEvent({"n": n})


async def test_a_subclass_with_its_own_filter_shares_the_consumer_and_gets_single_messages(
    kafka: KafkaBroker,
) -> None:
    """Same group as a default watcher: one consumer (no partition split between two members
    of the group), the subclass fed the batches' messages one by one."""
    topic, dead = kafka.create_topic(1), kafka.create_topic(1, prefix="dlt")
    await produce(kafka.bootstrap, topic, [(0, None, b'{"n": %d}' % n, []) for n in range(6)])
    group = f"shared-{topic}"
    custom = OddRefusingTrigger(**_kwargs(kafka, topic, group, dead_letter_topic=dead))
    default = KafkaMessageTrigger(**_kwargs(kafka, topic, group, dead_letter_topic=dead))
    custom.trigger_id, default.trigger_id = 1, 2
    assert custom.shared_stream_key() == default.shared_stream_key()
    with anyio.fail_after(30):
        async with SharedStreamManager() as manager, anyio.create_task_group() as tg:
            harnesses = [
                SubscriberHarness(manager, custom, trigger_id=1),
                SubscriberHarness(manager, default, trigger_id=2),
            ]
            for harness in harnesses:
                tg.start_soon(harness.run)
            await _wait_committed(kafka, group, topic, {0: 6})
            assert len(manager.stats()) == 1  # one group: one consumer for both
            await manager.stop_all()
    assert [type(m).__name__ for m in custom.seen] == ["KafkaMessage"] * 6
    assert [e.payload["n"] for e in harnesses[0].events] == [0, 2, 4]
    assert [e.dedup_key for e in harnesses[1].events] == [f"kafka:{topic}:0:{n}" for n in range(6)]
    dead_letters = await read_topic(kafka.bootstrap, dead, expected=3)
    assert sorted(json.loads(r.value)["n"] for r in dead_letters) == [1, 3, 5]


@pytest.mark.parametrize(
    ("on_unclean", "committed", "error"), [("stop", 2, UncleanEventError), ("commit", 5, None)]
)
async def test_unclean_message_without_dead_letter_topic(
    kafka: KafkaBroker, on_unclean: str, committed: int, error: type[Exception] | None
) -> None:
    topic = kafka.create_topic(1)
    values = [b'{"n": 0}', b'{"n": 1}', b"not json", b'{"n": 3}', b'{"n": 4}']
    await produce(kafka.bootstrap, topic, [(0, None, v, []) for v in values])
    trigger = KafkaMessageTrigger(
        **_kwargs(kafka, topic, on_unclean, value_format="json", on_unclean=on_unclean)
    )
    with anyio.fail_after(30):
        async with SharedStreamManager() as manager, anyio.create_task_group() as tg:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            tg.start_soon(harness.run)
            await _wait_committed(kafka, on_unclean, topic, {0: committed})
            if error is not None:
                await harness.wait_finished()
                assert isinstance(harness.error, error)
                assert f"{topic}/0/2" in str(harness.error)
            assert harness.error is None or error is not None
            await manager.stop_all()


async def test_unreachable_broker_fails_the_group_with_broker_unavailable() -> None:
    trigger = KafkaMessageTrigger(topics=["t"], bootstrap_servers="127.0.0.1:1", group_id="g")
    with anyio.fail_after(10):
        async with SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1)
            await harness.run()
    assert isinstance(harness.error, BrokerUnavailable)
    assert isinstance(harness.error.__cause__, KafkaConnectionError)
    assert "127.0.0.1:1" in str(harness.error) and "unreachable" in str(harness.error)
    # aiokafka only logs why each server failed: the error says it
    assert "Connect call failed" in str(harness.error)


@contextlib.asynccontextmanager
async def _not_a_tls_broker() -> AsyncIterator[str]:
    """A TCP server on localhost answering every connection with plain text (no TLS)."""

    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.send(b"HTTP/1.0 400 Bad Request\r\n\r\n")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, answer)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        yield f"127.0.0.1:{port}"
        tg.cancel_scope.cancel()


async def test_a_failed_tls_handshake_is_a_refusal_with_its_cause_not_unreachable() -> None:
    async with _not_a_tls_broker() as address:
        trigger = KafkaMessageTrigger(
            topics=["t"], bootstrap_servers=address, group_id="g", security_protocol="SSL"
        )
        with anyio.fail_after(20):
            async with SharedStreamManager() as manager:
                harness = SubscriberHarness(manager, trigger, trigger_id=1)
                await harness.run()
    assert isinstance(harness.error, BrokerRefused)
    assert harness.error.address == address
    assert "SSL" in str(harness.error) and address in str(harness.error)
    assert "unreachable" not in str(harness.error)


async def test_rebalance_neither_loses_nor_moves_commits_back(
    kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="producers.kafka")
    topic = kafka.create_topic(4)
    await produce(kafka.bootstrap, topic, [(i % 4, None, b"{}", []) for i in range(2000)])
    trigger = KafkaMessageTrigger(
        **_kwargs(kafka, topic, "rb", apply_function=f"{__name__}.slowly")
    )
    with anyio.fail_after(40):
        async with (
            SharedStreamManager(max_subscriber_queue=10_000) as first,
            SharedStreamManager(max_subscriber_queue=10_000) as second,
            anyio.create_task_group() as tg,
        ):
            a = SubscriberHarness(first, trigger, trigger_id=1)
            tg.start_soon(a.run)
            await a.wait_for_events(200)
            b = SubscriberHarness(
                second, KafkaMessageTrigger(**trigger.serialize()[1]), trigger_id=2
            )
            tg.start_soon(b.run)
            await _wait_committed(kafka, "rb", topic, dict.fromkeys(range(4), 500))
            await first.stop_all()
            await second.stop_all()
    seen = {(e.payload["partition"], e.payload["offset"]) for e in a.events + b.events}
    assert seen == {(p, o) for p in range(4) for o in range(500)}  # nothing lost
    assert b.events, "the second member never got a partition"
    commits: dict[int, list[int]] = defaultdict(list)
    for r in caplog.records:
        if getattr(r, "action", None) == "kafka.commit" and r.topic == topic:
            commits[r.partition].append(r.offset)
    assert all(offsets == sorted(offsets) for offsets in commits.values()), commits
    assert any(getattr(r, "action", None) == "kafka.partitions_revoked" for r in caplog.records)


async def test_standalone_run_commits_a_message_once_moved_past(kafka: KafkaBroker) -> None:
    topic = kafka.create_topic(1)
    await produce(kafka.bootstrap, topic, [(0, b"k", b"%d" % i, []) for i in range(10)])
    trigger = KafkaMessageTrigger(**_kwargs(kafka, topic, "alone"))
    events = []
    with anyio.fail_after(20):
        run = trigger.run()
        async for event in run:
            events.append(event)
            if len(events) == 10:
                break
        await run.aclose()
        assert await committed_offsets(kafka.bootstrap, "alone", topic, 1) == {0: 9}
    assert [e.payload["value"] for e in events] == list(range(10))
    assert events[3].dedup_key == f"kafka:{topic}:0:3"


# -- through the real triggerer ------------------------------------------------------------


@pytest.fixture
def plugins(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "kafka_filters.py").write_text(FILTERS_PLUGIN)
    return folder


@pytest.fixture(autouse=True)
def _filters_importable(plugins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(plugins))


async def test_three_watchers_share_one_consumer_through_the_triggerer(
    kafka: KafkaBroker, migrated_sqlite_url: str, plugins: Path
) -> None:
    count, partitions = 5000, 4
    topic, dead = kafka.create_topic(partitions), kafka.create_topic(1, prefix="dlt")
    db = Database(migrated_sqlite_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    assets = seed_watchers(db, cipher, watcher_specs(kafka.bootstrap, topic, "wg", dead))
    triggerer = Triggerer(
        db=db,
        cipher=cipher,
        settings=TriggererSettings(
            capacity=10,
            heartbeat_s=1,
            health_check_threshold_s=2.1,
            plugins_folder=plugins,
            claim_idle_interval_s=0.05,
            shutdown_grace_s=5,
        ),
    )
    key = ("kafka", kafka.bootstrap, "wg", (topic,))
    with anyio.fail_after(45):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await wait_until(lambda: triggerer.shared_streams.subscriber_count(key) == 3)
            assert triggerer.shared_streams.group_keys == (key,)  # one consumer for all three
            await produce(
                kafka.bootstrap, topic, [scenario_record(i, partitions) for i in range(count)]
            )
            per_partition = dict.fromkeys(range(partitions), count // partitions)
            await _wait_committed(kafka, "wg", topic, per_partition)
            triggerer.shutdown()
    got = asset_event_keys(db, assets)
    want = expected_keys(topic, count, partitions)
    for name in assets:
        assert len(got[name]) == len(set(got[name])), f"{name}: duplicated asset events"
        assert set(got[name]) == want[name], name
    dead_letters = await read_topic(kafka.bootstrap, dead, expected=2)
    by_source = {
        dict(r.headers)["sluice.dead_letter.source"]: dict(r.headers) for r in dead_letters
    }
    assert set(by_source) == {f"{topic}/0/625".encode(), f"{topic}/2/1060".encode()}
    assert all(h["sluice.dead_letter.reason"] == b"rejected" for h in by_source.values())
    db.dispose()


async def test_unreachable_broker_fails_the_watchers_and_the_runtime_restarts_them(
    migrated_sqlite_url: str, plugins: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = Database(migrated_sqlite_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    down = {"topics": ["t"], "bootstrap_servers": "127.0.0.1:1", "group_id": "g"}
    seed_watchers(db, cipher, {"a": down, "b": down})
    triggerer = Triggerer(
        db=db,
        cipher=cipher,
        settings=TriggererSettings(capacity=10, plugins_folder=plugins, shutdown_grace_s=5),
    )

    caplog.set_level(logging.DEBUG, logger="engine.triggerer.runtime")

    def failures() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "action", None) == "trigger_failed"]

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await wait_until(lambda: len(failures()) >= 4)  # both failed, restarted, failed again
            triggerer.shutdown()
    assert all(r.will_restart for r in failures())
    assert all("BrokerUnavailable" in r.getMessage() for r in failures())
    assert all("unreachable" in r.getMessage() for r in failures())
    # One warning per watcher naming the broker, then quiet retries; never a traceback.
    by_trigger: dict[int, list[str]] = {}
    for record in failures():
        by_trigger.setdefault(record.trigger_id, []).append(record.levelname)
    assert all(levels[0] == "WARNING" for levels in by_trigger.values())
    assert all(set(levels[1:]) <= {"DEBUG"} for levels in by_trigger.values())
    # the one warning says why aiokafka could not bootstrap
    assert all("Connect call failed" in r.getMessage() for r in failures())
    assert all(r.address == "127.0.0.1:1" for r in failures())
    assert not [r for r in caplog.records if "Traceback" in r.getMessage()]
    db.dispose()
