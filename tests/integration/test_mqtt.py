"""The MQTT producer and ``MqttMessageTrigger`` against the machine's Mosquitto.

Most tests drive the real ``SharedStreamManager`` with ``SubscriberHarness`` subscribers (as
the triggerer does); what the broker still holds is read from its side by resuming the
persistent session up to a sentinel (``drain_session``). The last test runs three watchers
through the real triggerer on SQLite.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest
from cryptography.fernet import Fernet

from engine.crypto import KwargsCipher
from engine.db.database import Database
from producers import MqttMessageTrigger
from producers.exceptions import BrokerRefused, BrokerUnavailable, ProducerConfigError
from shared_stream import AckTimeout, SharedStreamManager
from shared_stream.testing import SubscriberHarness
from tests.services_mqtt import (
    Collector,
    drain_session,
    free_port,
    private_mosquitto,
    publish,
)
from tests.waiting import wait_until
from tests.watcher_rows import fast_triggerer, keyed_asset_events, seed_watchers

if TYPE_CHECKING:
    from tests.services_mqtt import MqttBroker, MqttNames

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-never-logged"


def _trigger(broker: MqttBroker, names: MqttNames, **kwargs: Any) -> MqttMessageTrigger:
    return MqttMessageTrigger(
        topic=names.topic,
        host=broker.host,
        port=broker.port,
        client_id=names.client_id,
        **kwargs,
    )


@pytest.fixture
def built(monkeypatch) -> list[Any]:
    """The producers the shared-stream groups build (recorded, not replaced)."""
    producers: list[Any] = []
    create = MqttMessageTrigger.create_shared_stream_producer.__func__  # type: ignore[attr-defined]

    def recording(cls: Any, kwargs: dict[str, Any]) -> Any:
        producer = create(cls, kwargs)
        producers.append(producer)
        return producer

    monkeypatch.setattr(MqttMessageTrigger, "create_shared_stream_producer", classmethod(recording))
    return producers


async def _subscribed(built: list[Any], count: int = 1) -> Any:
    await wait_until(lambda: len(built) >= count and built[count - 1].subscribed)
    return built[count - 1]


def _json(*bodies: Any) -> list[bytes]:
    return [json.dumps(body).encode() for body in bodies]


async def test_siblings_with_different_filters_share_one_session_and_everything_is_acked(
    mqtt_broker, mqtt_names, built
) -> None:
    orders = _trigger(mqtt_broker, mqtt_names, body_filter={"kind": "order"})
    eu = _trigger(mqtt_broker, mqtt_names, topic_filter=f"{mqtt_names.prefix}/eu/+")
    assert orders.shared_stream_key() == eu.shared_stream_key()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harnesses = [
                SubscriberHarness(manager, t, trigger_id=i) for i, t in enumerate((orders, eu))
            ]
            for harness in harnesses:
                tg.start_soon(harness.run)
            producer = await _subscribed(built)
            for n in range(12):
                region = ("eu", "us")[n % 2]
                kind = ("order", "refund", "noise")[n % 3]
                await publish(
                    mqtt_broker, f"{mqtt_names.prefix}/{region}/x", _json({"kind": kind, "n": n})
                )
            await harnesses[0].wait_for_events(4)
            await harnesses[1].wait_for_events(6)
            await wait_until(lambda: producer.acked == 12)
            tg.cancel_scope.cancel()
    assert [p["body"]["n"] for p in harnesses[0].payloads] == [0, 3, 6, 9]
    assert [p["body"]["n"] for p in harnesses[1].payloads] == [0, 2, 4, 6, 8, 10]
    assert {p["topic"] for p in harnesses[1].payloads} == {f"{mqtt_names.prefix}/eu/x"}
    assert all(e.dedup_key is None for e in harnesses[0].events)  # dedup="none"
    assert await drain_session(mqtt_broker, mqtt_names.client_id, f"{mqtt_names.prefix}/s") == []


async def test_nothing_is_acked_while_a_subscriber_has_not_resolved_and_close_keeps_it(
    mqtt_broker, mqtt_names, built
) -> None:
    trigger = _trigger(mqtt_broker, mqtt_names)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            fine = SubscriberHarness(manager, trigger, trigger_id=1)
            stuck = SubscriberHarness(manager, trigger, trigger_id=2, auto_confirm=False)
            tg.start_soon(fine.run)
            tg.start_soon(stuck.run)
            producer = await _subscribed(built)
            await publish(mqtt_broker, f"{mqtt_names.prefix}/a", _json(*range(3)))
            await fine.wait_for_events(3)
            await stuck.wait_for_events(3)
            # Every message reached both; one subscriber has not resolved any: no PUBACK.
            assert producer.acked == 0
            assert producer.in_flight == 3
            tg.cancel_scope.cancel()
    held = await drain_session(mqtt_broker, mqtt_names.client_id, f"{mqtt_names.prefix}/s")
    assert [json.loads(m.payload) for m in held] == [0, 1, 2]
    assert all(m.dup for m in held)  # the session redelivers what was never acked


async def test_a_failed_message_comes_back_when_the_session_reconnects_with_the_same_dedup_key(
    mqtt_broker, mqtt_names, built
) -> None:
    trigger = _trigger(mqtt_broker, mqtt_names, dedup="payload")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager(ack_timeout=0.3) as manager:
            fine = SubscriberHarness(manager, trigger, trigger_id=1)
            stuck = SubscriberHarness(manager, trigger, trigger_id=2, auto_confirm=False)
            tg.start_soon(fine.run)
            tg.start_soon(stuck.run)
            producer = await _subscribed(built)
            await publish(mqtt_broker, f"{mqtt_names.prefix}/a", _json({"n": 1}, {"n": 2}))
            await stuck.wait_finished()
            # The failed message and the one after it come again on a new connection.
            await fine.wait_for_events(4)
            await wait_until(lambda: producer.acked == 2)
            tg.cancel_scope.cancel()
    assert isinstance(stuck.error, AckTimeout)
    assert producer.reconnects == 1
    first, second, *again = fine.events
    assert [e.payload["body"] for e in again] == [{"n": 1}, {"n": 2}]
    assert all(e.payload["dup"] for e in again)
    # stored once: the redelivery is absorbed by its dedup key
    assert [e.dedup_key for e in again] == [first.dedup_key, second.dedup_key]
    assert first.dedup_key.startswith("mqtt:payload:")
    assert await drain_session(mqtt_broker, mqtt_names.client_id, f"{mqtt_names.prefix}/s") == []


async def test_a_rejected_message_without_dead_letter_topic_is_redelivered_not_dropped(
    mqtt_broker, mqtt_names, built
) -> None:
    picky = _trigger(mqtt_broker, mqtt_names, body_filter={"kind": "order"})
    every = _trigger(mqtt_broker, mqtt_names, dedup="payload")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harnesses = [
                SubscriberHarness(manager, t, trigger_id=i) for i, t in enumerate((picky, every))
            ]
            for harness in harnesses:
                tg.start_soon(harness.run)
            producer = await _subscribed(built)
            await publish(mqtt_broker, f"{mqtt_names.prefix}/a", [b"poison"])
            await harnesses[1].wait_for_events(3)  # delivered, then again after each reconnect
            tg.cancel_scope.cancel()
    assert producer.acked == 0
    assert producer.reconnects >= 2
    assert {e.dedup_key for e in harnesses[1].events} == {harnesses[1].events[0].dedup_key}
    held = await drain_session(mqtt_broker, mqtt_names.client_id, f"{mqtt_names.prefix}/s")
    assert [m.payload for m in held] == [b"poison"]  # still the broker's, never dropped


async def test_a_rejected_poison_message_is_dead_lettered_then_acked(
    mqtt_broker, mqtt_names, built, caplog
) -> None:
    dead = f"{mqtt_names.prefix}-dead"
    trigger = _trigger(
        mqtt_broker, mqtt_names, body_filter={"kind": "order"}, dead_letter_topic=dead
    )
    trigger.trigger_id = 7  # the runtime sets it; the harness does not
    collector = await anyio.to_thread.run_sync(Collector, mqtt_broker, dead)
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
                harness = SubscriberHarness(manager, trigger, trigger_id=7)
                tg.start_soon(harness.run)
                producer = await _subscribed(built)
                topic = f"{mqtt_names.prefix}/in"
                await publish(
                    mqtt_broker,
                    topic,
                    [*_json({"kind": "order", "n": 1}), b"not json", *_json({"kind": "order"})],
                    user_properties=[[], [("origin", "legacy")], []],
                )
                await harness.wait_for_events(2)
                await wait_until(lambda: producer.acked == 3)
                await wait_until(lambda: collector.messages)
                tg.cancel_scope.cancel()
    finally:
        await anyio.to_thread.run_sync(collector.close)
    assert [p["body"] for p in harness.payloads] == [{"kind": "order", "n": 1}, {"kind": "order"}]
    [letter] = collector.messages
    assert letter.payload == b"not json"
    properties = dict(letter.properties.UserProperty)
    assert properties == {"origin": "legacy", "sluice-original-topic": topic}
    assert producer.dead_lettered == 1
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "mqtt.message_rejected"]
    assert record.trigger_id == 7
    assert record.topic == topic


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_messages_come_in_publish_order_with_at_most_max_in_flight_unadvanced(
    mqtt_broker, mqtt_names, built, protocol
) -> None:
    trigger = _trigger(mqtt_broker, mqtt_names, protocol=protocol, max_in_flight=5)
    peak = 0
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
            harness = SubscriberHarness(manager, trigger, trigger_id=1, auto_confirm=False)
            tg.start_soon(harness.run)
            producer = await _subscribed(built)
            await publish(mqtt_broker, f"{mqtt_names.prefix}/a", _json(*range(40)))
            while len(harness.events) < 40:
                await wait_until(lambda: harness.unconfirmed)
                peak = max(peak, producer.in_flight)
                harness.confirm_all()
                await anyio.lowlevel.checkpoint()
            await wait_until(lambda: producer.acked == 40)
            tg.cancel_scope.cancel()
    assert [p["body"] for p in harness.payloads] == list(range(40))
    assert 1 <= peak <= 5


async def test_an_unreachable_broker_raises_broker_unavailable_naming_it() -> None:
    port = free_port()  # nothing listens there
    trigger = MqttMessageTrigger(topic="x/#", host="127.0.0.1", port=port)
    producer = trigger.build_producer()
    with anyio.fail_after(10):
        try:
            with pytest.raises(BrokerUnavailable, match="cannot reach the MQTT broker") as info:
                await anext(aiter(producer.open_stream()))
        finally:
            await producer.aclose()
    assert info.value.address == f"mqtt://127.0.0.1:{port}"


async def test_bad_credentials_are_refused_without_showing_the_password(caplog) -> None:
    with private_mosquitto(users={"sluice": "right"}) as broker:
        trigger = MqttMessageTrigger(
            topic="x/#", port=broker.port, username="sluice", password=SECRET, client_id="t-bad"
        )
        producer = trigger.build_producer()
        with anyio.fail_after(10):
            try:
                with pytest.raises(BrokerRefused, match=r"Not authorized|Bad user name") as info:
                    await anext(aiter(producer.open_stream()))
            finally:
                await producer.aclose()
    assert SECRET not in str(info.value)
    assert SECRET not in repr(trigger.settings)
    assert SECRET not in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"qos": 2}, "only QoS 1"),
        ({"topic": "a/#/b"}, "'#' must be the last level"),
        ({"topic": "a/b+"}, "a wildcard must be a whole level"),
        ({"protocol": "4"}, "protocol='4'"),
        ({"dedup": "broker"}, "dedup='broker'"),
        ({"dead_letter_topic": "s/dead"}, "matches a subscribed topic filter"),
        ({"dead_letter_topic": "d/+"}, "dead_letter_topic 'd/\\+' has a wildcard"),
        ({"max_in_flight": 0}, "max_in_flight=0"),
        ({"password": "p"}, "a password needs a username"),
        ({"apply_function": "nodots"}, "apply_function must be a dotted path"),
        ({"partition_key_field": "a", "partition_key_header": "b"}, "at most one"),
    ],
)
def test_settings_that_cannot_work_are_refused_at_construction(kwargs, problem) -> None:
    arguments = {"topic": "s/#", **kwargs}
    with pytest.raises(ProducerConfigError, match=problem):
        MqttMessageTrigger(**arguments)


def test_the_uri_form_of_a_connection_gives_the_client_settings() -> None:
    from engine.authoring.connections import Connection

    uri = f"mqtt://sluice:{SECRET}@broker.example:8883?protocol=3.1.1&keepalive_s=15"
    fields = Connection.from_uri("mqtt_default", uri).to_dict()
    connection = {"conn_id": "mqtt_default", **fields}
    settings = MqttMessageTrigger.connection_settings("conn_id", connection)
    assert settings == {
        "host": "broker.example",
        "port": 8883,
        "username": "sluice",
        "password": SECRET,
        "protocol": "3.1.1",
        "keepalive_s": 15,
    }
    trigger = MqttMessageTrigger(topic="s/#", conn_id="mqtt_default", **settings)
    unresolved = MqttMessageTrigger(topic="s/#", conn_id="mqtt_default")
    assert trigger.shared_stream_key() == unresolved.shared_stream_key()
    assert trigger.settings.client_id == unresolved.settings.client_id  # one session


# -- through the real triggerer ----------------------------------------------------------


async def test_three_filtered_watchers_through_the_real_triggerer_by_connection_id(
    mqtt_broker, mqtt_names, built, migrated_sqlite_url: str, monkeypatch, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    uri = f"mqtt://sluice:{SECRET}@{mqtt_broker.host}:{mqtt_broker.port}?protocol=5"
    monkeypatch.setenv("SLUICE_CONN_MQTT_TEST", uri)
    db = Database(migrated_sqlite_url)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    common = {"topic": mqtt_names.topic, "conn_id": "mqtt_test", "client_id": mqtt_names.client_id}
    triggers = {
        "orders": MqttMessageTrigger(**common, body_filter={"kind": "order"}, dedup="payload"),
        "eu": MqttMessageTrigger(
            **common,
            topic_filter=f"{mqtt_names.prefix}/eu/#",
            dedup_field="id",
            partition_key_field="kind",
        ),
        "urgent": MqttMessageTrigger(
            **common, user_property_filter={"priority": "high"}, dedup="payload"
        ),
    }
    assets = seed_watchers(db, cipher, triggers)
    triggerer = fast_triggerer(db, cipher)
    kinds, regions = ["order", "refund", "noise"], ["eu", "us"]
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            key = triggers["orders"].shared_stream_key()
            await wait_until(lambda: triggerer.shared_streams.subscriber_count(key) == 3)
            producer = await _subscribed(built)
            sent = []
            for n in range(30):
                body = {"kind": kinds[n % 3], "id": f"m{n}", "n": n}
                priority = [("priority", "high")] if n % 5 == 0 else []
                topic = f"{mqtt_names.prefix}/{regions[n % 2]}/x"
                await publish(mqtt_broker, topic, _json(body), user_properties=[priority])
                sent.append((topic, body, priority))
            await wait_until(lambda: producer.acked == 30, within=20)
            expected = sorted(
                (assets[name], f"mqtt:{kind}", part)
                for topic, body, priority in sent
                for name, hit, kind, part in (
                    ("orders", body["kind"] == "order", "payload", None),
                    ("eu", "/eu/" in topic, f"id:{body['id']}", body["kind"]),
                    ("urgent", bool(priority), "payload", None),
                )
                if hit
            )
            await wait_until(lambda: len(keyed_asset_events(db)) >= len(expected), within=20)
            # The same messages again (as a redelivery would bring them): absorbed.
            for topic, body, priority in sent[:6]:
                await publish(mqtt_broker, topic, _json(body), user_properties=[priority])
            await wait_until(lambda: producer.acked == 36, within=20)
            assert triggerer.shared_streams.group_keys == (key,)  # one session, three watchers
            triggerer.shutdown()
    stored = sorted((asset, _kind_of(key), part) for asset, key, part in keyed_asset_events(db))
    assert stored == expected  # every match once, the repeats added nothing
    assert SECRET not in caplog.text
    db.dispose()


def _kind_of(dedup_key: str) -> str:
    """``mqtt:payload`` for a payload digest key, the whole key for a field identity."""
    return "mqtt:payload" if dedup_key.startswith("mqtt:payload:") else dedup_key


def test_the_example_dag_file_declares_two_watchers_sharing_one_session(monkeypatch) -> None:
    import runpy
    from pathlib import Path

    monkeypatch.setenv("SLUICE_EXAMPLE_MQTT_PORT", "1884")
    path = Path(__file__).parents[2] / "dags" / "example_mqtt_watchers.py"
    namespace = runpy.run_path(str(path))
    triggers = [
        watcher.trigger
        for asset in (namespace["temperature"], namespace["humidity"])
        for watcher in asset.watchers
    ]
    assert len(triggers) == 2
    assert len({t.shared_stream_key() for t in triggers}) == 1
    assert {t.settings.port for t in triggers} == {1884}


async def test_a_broker_that_goes_away_ends_the_stream_and_its_session_redelivers_later() -> None:
    from tests.services_mqtt import open_session_sync

    with private_mosquitto() as private:
        broker = private.broker
        await anyio.to_thread.run_sync(open_session_sync, broker, "t-restart", "r/#")
        await publish(broker, "r/a", _json({"n": 1}, {"n": 2}))
        trigger = MqttMessageTrigger(topic="r/#", port=broker.port, client_id="t-restart")
        with anyio.fail_after(15):
            producer = trigger.build_producer()
            stream = producer.open_stream()
            try:
                message, _receipt = await anext(stream)
                assert message.body == {"n": 1}
                await anyio.to_thread.run_sync(private.stop)  # saves its sessions
                with pytest.raises(BrokerUnavailable, match="closed the connection") as info:
                    while True:
                        await anext(stream)
                assert info.value.address == f"mqtt://127.0.0.1:{broker.port}"
            finally:
                await stream.aclose()
                await producer.aclose()
            await anyio.to_thread.run_sync(private.start)
            again = trigger.build_producer()
            stream = again.open_stream()
            try:
                redelivered = [(await anext(stream))[0] for _ in range(2)]
            finally:
                await stream.aclose()
                await again.aclose()
    assert [m.body for m in redelivered] == [{"n": 1}, {"n": 2}]
    assert redelivered[0].dup  # delivered before the stop, never acked: sent again


def accept_odd(message: Any, modulus: int, *, poison: int) -> bool:
    """An ``apply_function``: odd ``n`` fire, ``poison`` raises (the message is rejected)."""
    if message.body["n"] == poison:
        raise ValueError("poison reading")
    return bool(message.body["n"] % modulus)


async def test_apply_function_and_a_user_property_partition_key(
    mqtt_broker, mqtt_names, built
) -> None:
    dead = f"{mqtt_names.prefix}-dead"
    odd = _trigger(
        mqtt_broker,
        mqtt_names,
        apply_function=f"{__name__}.accept_odd",
        apply_function_args=[2],
        apply_function_kwargs={"poison": 3},
        dead_letter_topic=dead,
    )
    keyed = _trigger(mqtt_broker, mqtt_names, partition_key_header="region")
    collector = await anyio.to_thread.run_sync(Collector, mqtt_broker, dead)
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg, SharedStreamManager() as manager:
                harnesses = [
                    SubscriberHarness(manager, t, trigger_id=i) for i, t in enumerate((odd, keyed))
                ]
                for harness in harnesses:
                    tg.start_soon(harness.run)
                producer = await _subscribed(built)
                regions = [[("region", r)] for r in ("eu", "us", "eu", "us", "ap")]
                await publish(
                    mqtt_broker,
                    f"{mqtt_names.prefix}/a",
                    _json(*({"n": n} for n in range(5))),
                    user_properties=regions,
                )
                await wait_until(lambda: producer.acked == 5)
                await wait_until(lambda: collector.messages)
                tg.cancel_scope.cancel()
    finally:
        await anyio.to_thread.run_sync(collector.close)
    assert [p["body"]["n"] for p in harnesses[0].payloads] == [1]
    assert [e.partition_key for e in harnesses[1].events] == ["eu", "us", "eu", "us", "ap"]
    assert [json.loads(m.payload) for m in collector.messages] == [{"n": 3}]
