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
reconnects. So ``advance`` acks the clean prefix before it, then reconnects the session
(DISCONNECT without acking, CONNECT with ``clean_start=False``): the broker redelivers it
(``dup``) with every later un-acked message, and the group goes on. A packet id means
something only on its connection (the broker reuses it once acked), so every receipt of an
earlier connection is *stale*: its advance acks nothing (its message comes again on the new
connection). Reconnects in a row back off (``REDELIVERY_BACKOFF_S``), so a message every
watcher keeps rejecting cannot spin. Nothing is acked that was not resolved, and nothing is
dropped silently.

paho's own reconnect is off: a connection that breaks by itself ends the stream with
``BrokerUnavailable`` (the triggerer warns once and restarts the group with backoff).

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
import logging
import threading
import uuid
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
from producers.exceptions import BrokerRequestFailed, ProducerError
from producers.mqtt_core import (
    CLOSE_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    DEAD_LETTER_TOPIC_PROPERTY,
    PUBLISH_TIMEOUT_S,
    REDELIVERY_BACKOFF_S,
    SUBSCRIBE_TIMEOUT_S,
    MqttMessage,
    MqttReceipt,
    MqttSettings,
    check_settings,
)
from producers.mqtt_link import Link, delivery, disconnect
from shared_stream.producer import SharedStreamProducer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from shared_stream.producer import AdvanceItem, AdvanceOutcome

__all__ = ("MqttSharedStreamProducer",)

logger = logging.getLogger(__name__)

_OK = paho.MQTT_ERR_SUCCESS
_CAPACITY_POLL_S = 0.5  # how often a waiting callback rechecks that its link is closing
FLUSH_TIMEOUT_S = 2.0  # for the UNSUBACK that says the broker read every PUBACK before it


class MqttSharedStreamProducer(SharedStreamProducer):
    """One MQTT subscription's ack-mode producer; see the module docstring for the model."""

    def __init__(self, settings: MqttSettings) -> None:
        check_settings(settings, where=f"MQTT producer on {settings.address}")
        self.settings = settings
        self.acked = 0
        self.dead_lettered = 0
        self.reconnects = 0
        #: set once the broker granted the subscription (messages flow from then on)
        self.subscribed = False
        self._link: Link | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: ProducerError | None = None
        self._inbox: deque[tuple[MqttMessage, MqttReceipt]] = deque()
        self._arrived: anyio.Event | None = None
        self._connack: tuple[Any, bool] | None = None
        self._suback: list[Any] | None = None
        self._answered: anyio.Event | None = None
        self._publish_waiters: dict[int, anyio.Event] = {}
        self._publish_results: dict[int, Any] = {}
        self._unsubscribe_waiters: dict[int, anyio.Event] = {}
        self._capacity = threading.Condition()
        self._unadvanced = 0
        self._closed = False
        self._redelivery_streak = 0

    @property
    def in_flight(self) -> int:
        """Deliveries received and not advanced yet (stale ones included)."""
        return self._unadvanced

    @property
    def connection(self) -> int:
        """The number of the current connection (0 before the first)."""
        return 0 if self._link is None else self._link.number

    # -- the producer ---------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[MqttMessage, MqttReceipt]]:
        if self._link is not None or self._closed:
            raise RuntimeError(f"{self!r}: open_stream() runs once per producer")
        self._loop = asyncio.get_running_loop()
        self._arrived = anyio.Event()
        await self._open_link(1)
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
                done += 1
                if receipt.connection != self.connection:
                    continue  # stale: the broker redelivers it on the current connection
                if outcome.is_clean:
                    self._ack(receipt)
                    self._redelivery_streak = 0
                elif outcome.rejected and self.settings.dead_letter_topic is not None:
                    await self._dead_letter(receipt, self.settings.dead_letter_topic)
                    self._ack(receipt)
                else:
                    await self._redeliver(receipt, outcome)
        finally:
            self._release(done)

    async def aclose(self) -> None:
        """Disconnect without acking what is unresolved: the session keeps it for the next
        connect (MQTT's only redelivery); queued PUBACKs are written before DISCONNECT."""
        self._closed = True
        link, self._link = self._link, None
        if link is not None:
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                await self._close_link(link)

    # -- connecting -----------------------------------------------------------------------

    async def _open_link(self, number: int) -> None:
        s = self.settings
        link = self._link = Link(number)
        self._connack, self._suback, self._answered = None, None, anyio.Event()
        client = link.client = self._new_client(link)
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

    async def _close_link(self, link: Link) -> None:
        with self._capacity:
            link.closing = True
            self._capacity.notify_all()
        if link.client is None:
            return
        if self._error is None:
            await self._flush(link.client)
        await anyio.to_thread.run_sync(disconnect, link.client, abandon_on_cancel=True)

    async def _flush(self, client: paho.Client) -> None:
        """Wait until the broker processed every PUBACK written so far: it answers packets in
        order, so the UNSUBACK of a filter nobody uses comes after them. A close right after
        DISCONNECT may otherwise reset the connection before the broker read the PUBACKs
        (their messages would come again)."""
        rc, mid = client.unsubscribe(f"sluice-flush/{uuid.uuid4().hex}")
        if rc != _OK or mid is None:
            return  # the connection is gone: nothing more reaches the broker anyway
        waiter = self._unsubscribe_waiters[mid] = anyio.Event()
        with anyio.move_on_after(FLUSH_TIMEOUT_S):
            await waiter.wait()
        self._unsubscribe_waiters.pop(mid, None)

    def _new_client(self, link: Link) -> paho.Client:
        s = self.settings
        v5 = s.protocol == "5"
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=s.client_id,
            clean_session=None if v5 else False,
            userdata=link,
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
        client.on_unsubscribe = self._on_unsubscribe
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
        client = self._link.client if self._link is not None else None
        rc = client.ack(receipt.mid, receipt.qos) if client is not None else None
        if rc != _OK:
            raise errors.not_connected(self.settings, "PUBACK", rc)
        self.acked += 1

    async def _redeliver(self, receipt: MqttReceipt, outcome: AdvanceOutcome) -> None:
        """Reconnect the session: the broker redelivers ``receipt``'s message and every
        later un-acked one; what is still in the inbox is dropped (it comes again)."""
        low_s, high_s = REDELIVERY_BACKOFF_S
        delay_s = min(high_s, low_s * 2**self._redelivery_streak)
        self._redelivery_streak += 1
        logger.warning(
            "The MQTT message on %r (packet id %s) was not processed by every watcher "
            "(%d failed, %d rejected of %d%s); reconnecting the session of %r in %.2fs so "
            "that the broker redelivers it with every later un-acked message",
            receipt.topic,
            receipt.mid,
            outcome.failed,
            outcome.rejected,
            outcome.subscriber_count,
            ", no dead_letter_topic" if outcome.rejected else "",
            self.settings.client_id,
            delay_s,
            extra={"action": "mqtt.redelivery", "topic": receipt.topic},
        )
        old = self._link
        assert old is not None
        with self._capacity:
            old.closing = True  # its callbacks deliver nothing more
            self._capacity.notify_all()
        await anyio.sleep(delay_s)
        dropped = len(self._inbox)
        self._inbox.clear()
        self._release(dropped)
        await self._close_link(old)
        self.reconnects += 1
        await self._open_link(old.number + 1)

    async def _dead_letter(self, receipt: MqttReceipt, topic: str) -> None:
        await self._publish(topic, receipt)
        self.dead_lettered += 1
        logger.info(
            "Moved a rejected MQTT message from %r to %r",
            receipt.topic,
            topic,
            extra={"action": "mqtt.dead_lettered", "topic": receipt.topic},
        )

    async def _publish(self, topic: str, receipt: MqttReceipt) -> None:
        s = self.settings
        client = self._link.client if self._link is not None else None
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

    def _on_connect(self, _c: Any, link: Link, flags: Any, reason: Any, _p: Any) -> None:
        self._post(self._got_connack, link, reason, bool(flags.session_present))

    def _on_subscribe(self, _c: Any, link: Link, _m: int, reasons: list[Any], _p: Any) -> None:
        self._post(self._got_suback, link, list(reasons))

    def _on_publish(self, _c: Any, link: Link, mid: int, reason: Any, _p: Any) -> None:
        self._post(self._got_puback, link, mid, reason)

    def _on_unsubscribe(self, _c: Any, _l: Link, mid: int, _r: Any, _p: Any) -> None:
        self._post(self._got_unsuback, mid)

    def _on_disconnect(self, _c: Any, link: Link, _f: Any, reason: Any, _p: Any) -> None:
        if not link.closing:
            self._post(self._lost, link, errors.connection_lost(self.settings, reason), reason)

    def _on_message(self, _c: Any, link: Link, msg: paho.MQTTMessage) -> None:
        with self._capacity:
            while self._unadvanced >= self.settings.max_in_flight and not link.closing:
                self._capacity.wait(_CAPACITY_POLL_S)
            if link.closing:
                return  # not acked: the session redelivers it
            self._unadvanced += 1
        self._post(self._got_message, link, delivery(msg, link.number))

    # -- the event loop's side: what a link that is not the current one says is ignored ---

    def _got_connack(self, link: Link, reason: Any, session_present: bool) -> None:
        if link is self._link:
            self._connack = (reason, session_present)
            if self._answered is not None:
                self._answered.set()

    def _got_suback(self, link: Link, reasons: list[Any]) -> None:
        if link is self._link:
            self._suback = reasons
            if self._answered is not None:
                self._answered.set()

    def _got_puback(self, link: Link, mid: int, reason: Any) -> None:
        waiter = self._publish_waiters.pop(mid, None) if link is self._link else None
        if waiter is not None:
            self._publish_results[mid] = reason
            waiter.set()

    def _got_unsuback(self, mid: int) -> None:
        waiter = self._unsubscribe_waiters.pop(mid, None)
        if waiter is not None:
            waiter.set()

    def _got_message(self, link: Link, item: tuple[MqttMessage, MqttReceipt]) -> None:
        if link is not self._link or link.closing:
            self._release(1)  # redelivered on the current connection
            return
        self._inbox.append(item)
        if self._arrived is not None:
            self._arrived.set()

    def _lost(self, link: Link, error: ProducerError, reason: Any) -> None:
        if link is not self._link or link.closing:
            return
        if int(getattr(reason, "value", 0)) == errors.SESSION_TAKEN_OVER:
            logger.warning(
                "Another client took over the MQTT session %r on %s; this consumer stops",
                self.settings.client_id,
                self.settings.address,
                extra={"action": "mqtt.session_taken_over", "address": self.settings.address},
            )
        self._fail(error)

    def _fail(self, error: ProducerError) -> None:
        if self._error is None:
            self._error = error
        waiters = (*self._publish_waiters.values(), *self._unsubscribe_waiters.values())
        for event in (self._arrived, self._answered, *waiters):
            if event is not None:
                event.set()

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"<MqttSharedStreamProducer {s.address} client_id={s.client_id!r} "
            f"topics={list(s.topics)} in_flight={self._unadvanced} acked={self.acked} "
            f"dead_lettered={self.dead_lettered} reconnects={self.reconnects} "
            f"connection={self.connection} connected={self._link is not None}>"
        )
