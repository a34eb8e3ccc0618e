"""MQTT shared-stream producer (paho-mqtt 2): a persistent QoS 1 session, acked once resolved.

Theory of operation. ``open_stream`` connects one paho client with the trigger's stable
``client_id`` and a persistent session (MQTT 5: ``clean_start=False`` and a session expiry;
3.1.1: ``clean_session=False``), ``manual_ack=True`` so that paho sends no PUBACK by itself,
subscribes to the topic filters at QoS 1, then yields each delivery as
``(MqttMessage, MqttReceipt)``. ``advance`` PUBACKs each resolved message with
``client.ack(mid, 1)``; the stream is one lane, so the ledger's in-order prefixes give the
order of arrival MQTT requires of PUBACKs. A rejected message is published to
``dead_letter_topic`` (QoS 1, its PUBACK awaited) and then acked; without a dead-letter
topic it is handled as a failed one (below): kept by the broker, never dropped.

A *failed* message (an ack timeout, a full subscriber queue, no subscriber) cannot be
redelivered on demand: an MQTT broker redelivers an un-acked message only when the session
reconnects. ``advance`` acks the clean prefix before it, then raises ``UncleanEventError``:
the group ends, ``aclose`` disconnects without acking, and the watchers' restart reconnects
the session, which redelivers it (``dup``) together with every later un-acked message.
Nothing is acked that was not resolved, and nothing is dropped silently.

One connection per producer: paho's own reconnect is off. A connection that breaks ends
the stream with ``BrokerUnavailable`` (the triggerer warns once and restarts the group with
backoff), so a PUBACK is never sent for a packet id of an earlier connection, which the
broker may have given to another message since.

Why paho's network thread (``loop_start``) rather than driving paho from the event loop
(``loop_read`` / ``loop_write`` / ``loop_misc`` on socket callbacks): the thread keeps
paho's own keepalive, read and write handling as its authors run it, and the bridge is
three calls: callbacks post to the event loop with ``call_soon_threadsafe``, and paho's
``ack`` / ``publish`` are thread-safe (they queue a packet and wake the thread). The cost is
one thread per group. Back-pressure: MQTT 5's Receive Maximum (``max_in_flight``) stops the
broker past that many un-acked messages; under 3.1.1 (or for QoS 0 publishes, never
acked) the callback itself waits while ``max_in_flight`` messages are unadvanced, which
stops paho reading the socket.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from producers import mqtt_errors as errors
from producers.exceptions import BrokerRequestFailed, ProducerError, UncleanEventError
from producers.mqtt_core import (
    CLOSE_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    DEAD_LETTER_TOPIC_PROPERTY,
    PUBLISH_TIMEOUT_S,
    SUBSCRIBE_TIMEOUT_S,
    MqttMessage,
    MqttReceipt,
    MqttSettings,
    build_message,
    check_settings,
)
from shared_stream.producer import SharedStreamProducer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from shared_stream.producer import AdvanceItem, AdvanceOutcome

__all__ = ("MqttSharedStreamProducer",)

logger = logging.getLogger(__name__)

_OK = paho.MQTT_ERR_SUCCESS
_CAPACITY_POLL_S = 0.5  # how often a waiting callback rechecks that the producer is closing


class MqttSharedStreamProducer(SharedStreamProducer):
    """One MQTT subscription's ack-mode producer; see the module docstring for the model."""

    def __init__(self, settings: MqttSettings) -> None:
        check_settings(settings, where=f"MQTT producer on {settings.address}")
        self.settings = settings
        self.acked = 0
        self.dead_lettered = 0
        #: set once the broker granted the subscription (messages flow from then on)
        self.subscribed = False
        self._client: paho.Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: ProducerError | None = None
        self._inbox: deque[tuple[MqttMessage, MqttReceipt]] = deque()
        self._arrived: anyio.Event | None = None
        self._connack: tuple[Any, bool] | None = None
        self._suback: list[Any] | None = None
        self._answered: anyio.Event | None = None
        self._publish_waiters: dict[int, anyio.Event] = {}
        self._publish_results: dict[int, Any] = {}
        self._capacity = threading.Condition()
        self._unadvanced = 0
        self._closing = False
        self._deliveries = itertools.count(1)

    @property
    def in_flight(self) -> int:
        """Deliveries received and not advanced yet."""
        return self._unadvanced

    # -- the producer ---------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[MqttMessage, MqttReceipt]]:
        await self._connect()
        while True:
            if self._error is not None:
                raise self._error
            if self._inbox:
                yield self._inbox.popleft()
                continue
            self._arrived = anyio.Event()
            await self._arrived.wait()

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        done = 0
        try:
            for receipt, outcome in batch:
                if outcome.is_clean:
                    self._ack(receipt)
                elif outcome.rejected:
                    await self._dead_letter(receipt, outcome)
                    self._ack(receipt)
                else:
                    raise self._redelivery_needed(receipt, outcome)
                done += 1
        finally:
            self._release(done)

    async def aclose(self) -> None:
        """Disconnect without acking what is unresolved: the session keeps it for the next
        connect (MQTT's only redelivery); queued PUBACKs are written before DISCONNECT."""
        with self._capacity:
            self._closing = True
            self._capacity.notify_all()
        client, self._client = self._client, None
        if client is None:
            return
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            await anyio.to_thread.run_sync(_disconnect, client, abandon_on_cancel=True)

    # -- connecting -----------------------------------------------------------------------

    async def _connect(self) -> None:
        if self._client is not None or self._closing:
            raise RuntimeError(f"{self!r}: open_stream() runs once per producer")
        s = self.settings
        self._loop = asyncio.get_running_loop()
        self._arrived = anyio.Event()
        self._answered = anyio.Event()
        client = self._client = self._new_client()
        try:
            await anyio.to_thread.run_sync(self._send_connect, client)
        except (OSError, ValueError) as exc:
            raise errors.connect_failed(s, exc) from exc
        client.loop_start()
        await self._wait_answer(CONNECT_TIMEOUT_S, "no CONNACK")
        assert self._connack is not None
        reason, session_present = self._connack
        if reason.is_failure:
            raise errors.connect_refused(s, reason)
        self._raise_if_failed()
        await self._subscribe(client)
        logger.info(
            "MQTT producer connected to %s as %r (protocol %s, session %s, topics %s)",
            s.address,
            s.client_id,
            s.protocol,
            "resumed" if session_present else "new",
            list(s.topics),
            extra={"action": "mqtt.connected", "address": s.address},
        )

    def _new_client(self) -> paho.Client:
        s = self.settings
        v5 = s.protocol == "5"
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=s.client_id,
            clean_session=None if v5 else False,
            protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
            reconnect_on_failure=False,
            manual_ack=True,
        )
        client.connect_timeout = CONNECT_TIMEOUT_S
        if s.username is not None:
            client.username_pw_set(s.username, s.password)
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_disconnect = self._on_disconnect
        return client

    def _send_connect(self, client: paho.Client) -> None:
        """Open the socket and send CONNECT (blocking: runs in a worker thread)."""
        s = self.settings
        if s.protocol != "5":
            client.connect(s.host, s.port, keepalive=s.keepalive_s)
            return
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = s.session_expiry_s
        properties.ReceiveMaximum = s.max_in_flight
        client.connect(
            s.host, s.port, keepalive=s.keepalive_s, clean_start=False, properties=properties
        )

    async def _subscribe(self, client: paho.Client) -> None:
        s = self.settings
        self._answered = anyio.Event()
        if s.protocol == "5":
            rc, _ = client.subscribe([(t, SubscribeOptions(qos=s.qos)) for t in s.topics])
        else:
            rc, _ = client.subscribe([(t, s.qos) for t in s.topics])
        if rc != _OK:
            raise errors.not_connected(s, "SUBSCRIBE", rc)
        await self._wait_answer(SUBSCRIBE_TIMEOUT_S, "no SUBACK")
        for topic, reason in zip(s.topics, self._suback or (), strict=True):
            if reason.is_failure or reason.value < s.qos:
                raise errors.subscribe_refused(s, topic, reason)
        self.subscribed = True

    async def _wait_answer(self, timeout_s: float, what: str) -> None:
        assert self._answered is not None
        with anyio.move_on_after(timeout_s):
            await self._answered.wait()
        if not self._answered.is_set():
            raise errors.connect_failed(self.settings, TimeoutError(f"{what} in {timeout_s}s"))
        if self._connack is None or not self._connack[0].is_failure:
            self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    # -- advancing ------------------------------------------------------------------------

    def _ack(self, receipt: MqttReceipt) -> None:
        client = self._client
        rc = client.ack(receipt.mid, receipt.qos) if client is not None else None
        if rc != _OK:
            raise errors.not_connected(self.settings, "PUBACK", rc)
        self.acked += 1

    async def _dead_letter(self, receipt: MqttReceipt, outcome: AdvanceOutcome) -> None:
        s = self.settings
        if s.dead_letter_topic is None:
            raise UncleanEventError(
                f"a watcher rejected the MQTT message on {receipt.topic!r} (packet id "
                f"{receipt.mid}, {outcome.rejected} of {outcome.subscriber_count} rejected) and "
                "the trigger has no dead_letter_topic: it is not acked, the group restarts and "
                f"the session of client {s.client_id!r} redelivers it. Give the trigger a "
                "dead_letter_topic to move such messages aside"
            )
        await self._publish(s.dead_letter_topic, receipt)
        self.dead_lettered += 1
        logger.info(
            "Moved a rejected MQTT message from %r to %r",
            receipt.topic,
            s.dead_letter_topic,
            extra={"action": "mqtt.dead_lettered", "topic": receipt.topic},
        )

    async def _publish(self, topic: str, receipt: MqttReceipt) -> None:
        s = self.settings
        client = self._client
        properties = None
        if s.protocol == "5":
            properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            properties.UserProperty = [
                *receipt.user_properties,
                (DEAD_LETTER_TOPIC_PROPERTY, receipt.topic),
            ]
        if client is None:
            raise errors.not_connected(s, "PUBLISH", None)
        info = client.publish(topic, receipt.payload, qos=1, properties=properties)
        if info.rc != _OK:
            raise errors.not_connected(s, "PUBLISH", info.rc)
        waiter = self._publish_waiters[info.mid] = anyio.Event()
        with anyio.move_on_after(PUBLISH_TIMEOUT_S):
            await waiter.wait()
        self._publish_waiters.pop(info.mid, None)
        self._raise_if_failed()
        if not waiter.is_set():
            raise BrokerRequestFailed(
                f"MQTT broker {s.address} did not acknowledge the dead-letter publish to "
                f"{topic!r} within {PUBLISH_TIMEOUT_S}s; the message is redelivered"
            )
        reason = self._publish_results.pop(info.mid, None)
        if reason is not None and reason.is_failure:
            raise errors.publish_refused(s, topic, reason)

    def _redelivery_needed(self, receipt: MqttReceipt, outcome: AdvanceOutcome) -> ProducerError:
        return UncleanEventError(
            f"the MQTT message on {receipt.topic!r} (packet id {receipt.mid}) was not "
            f"processed by every watcher ({outcome.failed} failed of "
            f"{outcome.subscriber_count}); MQTT redelivers only on reconnect: the group "
            f"restarts and the session of client {self.settings.client_id!r} redelivers it "
            "with every later un-acked message"
        )

    def _release(self, count: int) -> None:
        with self._capacity:
            self._unadvanced -= count
            self._capacity.notify_all()

    # -- paho's thread: callbacks post to the event loop ----------------------------------

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the event loop closed: nobody waits any more
            pass

    def _on_connect(self, _c: Any, _u: Any, flags: Any, reason: Any, _p: Any) -> None:
        self._post(self._got_connack, reason, bool(flags.session_present))

    def _on_subscribe(self, _c: Any, _u: Any, _mid: int, reasons: list[Any], _p: Any) -> None:
        self._post(self._got_suback, list(reasons))

    def _on_publish(self, _c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
        self._post(self._got_puback, mid, reason)

    def _on_disconnect(self, _c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if not self._closing:
            self._post(self._fail, errors.connection_lost(self.settings, reason))

    def _on_message(self, _c: Any, _u: Any, msg: paho.MQTTMessage) -> None:
        with self._capacity:
            while self._unadvanced >= self.settings.max_in_flight and not self._closing:
                self._capacity.wait(_CAPACITY_POLL_S)
            if self._closing:
                return  # not acked: the session redelivers it
            self._unadvanced += 1
        self._post(self._got_message, _delivery(msg, next(self._deliveries)))

    # -- the event loop's side ------------------------------------------------------------

    def _got_connack(self, reason: Any, session_present: bool) -> None:
        self._connack = (reason, session_present)
        if self._answered is not None:
            self._answered.set()

    def _got_suback(self, reasons: list[Any]) -> None:
        self._suback = reasons
        if self._answered is not None:
            self._answered.set()

    def _got_puback(self, mid: int, reason: Any) -> None:
        waiter = self._publish_waiters.pop(mid, None)
        if waiter is not None:
            self._publish_results[mid] = reason
            waiter.set()

    def _got_message(self, item: tuple[MqttMessage, MqttReceipt]) -> None:
        self._inbox.append(item)
        if self._arrived is not None:
            self._arrived.set()

    def _fail(self, error: ProducerError) -> None:
        if self._error is None:
            self._error = error
        for event in (self._arrived, self._answered, *self._publish_waiters.values()):
            if event is not None:
                event.set()

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"<MqttSharedStreamProducer {s.address} client_id={s.client_id!r} "
            f"topics={list(s.topics)} in_flight={self._unadvanced} acked={self.acked} "
            f"dead_lettered={self.dead_lettered} connected={self._client is not None}>"
        )


def _delivery(msg: paho.MQTTMessage, delivery: int) -> tuple[MqttMessage, MqttReceipt]:
    """The raw event and the receipt of one PUBLISH paho received."""
    properties = getattr(msg, "properties", None)
    pairs = tuple((str(k), str(v)) for k, v in (getattr(properties, "UserProperty", None) or ()))
    message = build_message(
        topic=msg.topic,
        payload=bytes(msg.payload),
        qos=msg.qos,
        retain=bool(msg.retain),
        dup=bool(msg.dup),
        mid=msg.mid,
        user_properties=dict(pairs),
        content_type=getattr(properties, "ContentType", None),
    )
    receipt = MqttReceipt(delivery, msg.mid, msg.qos, msg.topic, message.payload, pairs)
    return message, receipt


def _disconnect(client: paho.Client) -> None:
    """Send DISCONNECT after the queued PUBACKs, stop paho's thread (a worker thread)."""
    client.disconnect()
    client.loop_stop()
