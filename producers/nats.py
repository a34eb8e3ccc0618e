"""NATS JetStream shared-stream producer (nats-py): pull, fan out, ack once resolved.

Theory of operation. ``open_stream`` connects (no automatic reconnect: a lost connection
ends the group, and the triggerer restarts it with backoff), checks the stream (creates it
when asked), creates or updates the durable pull consumer (explicit ack, ``ack_wait``,
``max_deliver``, ``max_ack_pending`` = ``max_in_flight``), then loops: wait while
``max_in_flight`` deliveries are unresolved, fetch up to that many (at most
``MAX_FETCH_BATCH``), yield each as ``(NatsMessage, NatsReceipt)``. Every yielded delivery
stays *in flight* until its advance. While a fetch waits, a heartbeat task sends
``in_progress`` (``+WPI``) for every delivery whose ack wait restarted half an ack wait ago,
so a slow subscriber never sees its message redelivered.

``advance`` takes one lane's resolved prefix (a lane is a subject) and gives each delivery a
disposition (``nats_core.disposition_of``): clean -> ``ack``; rejected -> a copy published
to ``dead_letter_subject`` (stored by the stream that captures it, ``Nats-Msg-Id``
``<stream>:<sequence>`` so a retried copy is one message) then ``term``, or ``term`` alone
without one; failed / no subscriber -> ``nak`` (redelivered at once), but on its last
delivery (``num_delivered == max_deliver``) dead-lettered instead, as JetStream would drop
it with only a MAX_DELIVERIES advisory. The batch ends with one ``flush`` (a PING / PONG
round trip): when ``advance`` returns, the server has processed every ack. ``ack_sync``
per message is not needed: a lost ack only means a redelivery, absorbed by the dedup key
``nats:<stream>:<sequence>``. ``aclose`` naks what is still in flight (redelivered at once
to the next consumer), except a delivery that was its last one, which is dead-lettered
(JetStream would never deliver it again), and closes the connection. While polling, the
producer also follows the consumer's MAX_DELIVERIES advisory and dead-letters what it names
(``producers.nats_dead_letters``): a last delivery whose ack wait ran out in an engine that
died or stalled.

Every nats-py error is translated here to ``producers.exceptions`` (the cause kept);
credentials are never logged nor shown in a ``repr``.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from producers.exceptions import ProducerError
from producers.nats_core import (
    API_TIMEOUT_S,
    CLOSE_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    DEFAULT_ACK_WAIT_S,
    DEFAULT_MAX_DELIVER,
    DEFAULT_MAX_IN_FLIGHT,
    FETCH_WAIT_S,
    MAX_FETCH_BATCH,
    PULL_EXPIRY_MARGIN_S,
    Disposition,
    InFlight,
    InFlightMessages,
    NatsConnection,
    NatsMessage,
    NatsReceipt,
    OnReject,
    check_settings,
    decode_body,
    disposition_of,
)
from shared_stream.producer import SharedStreamProducer
from triggers.extras import importing_extra

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription
    from nats.js.client import JetStreamContext

    from producers.nats_dead_letters import DeadLetters
    from shared_stream.producer import AdvanceItem

__all__ = ("NatsJetStreamSharedStreamProducer",)

logger = logging.getLogger(__name__)


@functools.cache
def _load_client() -> None:
    """Import nats-py (it pulls aiohttp in: 0.3-0.4 s of imports) and its error translation.

    Run it in a worker thread (``anyio.to_thread.run_sync(_load_client)``) so the
    triggerer's event loop never blocks on it; every later import of these is a lookup.
    """
    for module in ("nats.aio.client", "producers.nats_dead_letters", "producers.nats_setup"):
        importlib.import_module(module)


def parse_message(msg: Msg) -> tuple[NatsMessage, NatsReceipt]:
    """The raw event and broker payload of one JetStream delivery."""
    meta = msg.metadata
    sequence = int(meta.sequence.stream)
    stamp = meta.timestamp
    message = NatsMessage(
        stream=meta.stream,
        sequence=sequence,
        subject=msg.subject,
        body=decode_body(msg.data),
        raw_body=msg.data,
        headers=dict(msg.headers or {}),
        num_delivered=int(meta.num_delivered),
        published_at=stamp.isoformat() if stamp is not None else None,
    )
    return message, NatsReceipt(msg.reply, sequence, msg.subject, int(meta.num_delivered))


def _stranded(subscription: JetStreamContext.PullSubscription) -> list[Msg]:
    """Deliveries a cancelled fetch left in the subscription's inbox (nats-py has no public
    way to read them: its ``fetch`` takes them first, and there is no fetch after close)."""
    queue = getattr(getattr(subscription, "_sub", None), "_pending_queue", None)
    stranded = []
    while queue is not None and not queue.empty():
        msg = queue.get_nowait()
        if (msg.reply or "").startswith("$JS.ACK."):  # not a status message
            stranded.append(msg)
    return stranded


async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: its errors surface as exceptions of the calls that meet
    them; log them at debug level only (the default callback logs every one as an error)."""
    logger.debug("nats-py reported %r", exc, extra={"action": "nats.client_error"})


class NatsJetStreamSharedStreamProducer(SharedStreamProducer):
    """One durable pull consumer's ack-mode producer; see the module docstring."""

    def __init__(
        self,
        connection: NatsConnection,
        *,
        stream: str,
        durable: str,
        subjects: Sequence[str] = (),
        create_stream: bool = False,
        stream_subjects: Sequence[str] = (),
        ack_wait_s: float = DEFAULT_ACK_WAIT_S,
        max_deliver: int = DEFAULT_MAX_DELIVER,
        dead_letter_subject: str | None = None,
        on_reject: OnReject = "term",
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        deliver_policy: str = "all",
    ) -> None:
        check_settings(
            on_reject=on_reject,
            stream=stream,
            durable=durable,
            subjects=subjects,
            create_stream=create_stream,
            stream_subjects=stream_subjects,
            ack_wait_s=ack_wait_s,
            max_deliver=max_deliver,
            dead_letter_subject=dead_letter_subject,
            max_in_flight=max_in_flight,
            deliver_policy=deliver_policy,
        )
        self.connection = connection
        self.stream = stream
        self.durable = durable
        self.subjects = tuple(subjects)
        self.create_stream = create_stream
        self.stream_subjects = tuple(stream_subjects) or self.subjects
        self.ack_wait_s = ack_wait_s
        self.max_deliver = max_deliver
        self.dead_letter_subject = dead_letter_subject
        self.on_reject: OnReject = on_reject
        self.max_in_flight = max_in_flight
        self.deliver_policy = deliver_policy
        self.in_flight = InFlightMessages()
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._advisories: Subscription | None = None
        self._subscription: JetStreamContext.PullSubscription | None = None
        self._pull_expires_at = 0.0  # when the last pull request ends on the server
        self._dead_letters: DeadLetters | None = None
        self._capacity_freed = anyio.Event()
        self._poll_scope: anyio.CancelScope | None = None
        self._fenced = False

    @property
    def address(self) -> str:
        return self.connection.address

    # -- the producer ---------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[NatsMessage, NatsReceipt]]:
        self._subscription = subscription = await self._connect()
        while not self._fenced:
            for entry in await self._next_deliveries(subscription):
                if self._fenced:
                    break
                yield entry
        await anyio.sleep_forever()  # fenced: pull nothing more until the group closes

    def fence(self) -> None:
        """Pull, extend, ack and dead-letter nothing more: another engine owns the durable
        now. The poll stops at once (its fetch, heartbeat and advisory watch are cancelled);
        ``aclose`` only naks what is still in flight, which hands it over sooner."""
        self._fenced = True
        if self._poll_scope is not None:
            self._poll_scope.cancel()
        logger.warning(
            "NATS consumer %s of stream %s on %s fenced: pulls and acks nothing more",
            self.durable,
            self.stream,
            self.address,
            extra={"action": "nats.fenced", "stream": self.stream},
        )

    def get_advance_lane(self, broker_payload: Any) -> str:
        receipt: NatsReceipt = broker_payload
        return receipt.subject

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        if self._fenced:
            raise ProducerError(f"{self!r} is fenced: nothing is acked")
        from producers.nats_errors import translated  # loaded by open_stream

        with translated("advance", self.address):
            for receipt, outcome in batch:
                entry = self.in_flight.pop(receipt.reply)
                disposition = disposition_of(
                    outcome,
                    num_delivered=receipt.num_delivered,
                    max_deliver=self.max_deliver,
                    dead_letter=self.dead_letter_subject is not None,
                    on_reject=self.on_reject,
                )
                await self._carry_out(entry, disposition, rejected=outcome.rejected > 0)
                self._capacity_freed.set()
            assert self._nc is not None
            await self._nc.flush(timeout=int(API_TIMEOUT_S))

    async def aclose(self) -> None:
        """Release every delivery still in flight (best effort), close the connection.

        A pull request of this connection may still wait on the server (pulls live
        ``FETCH_WAIT_S``): it would take nak-ed messages straight back (lost until their ack
        wait, counted against ``max_deliver``), and once the connection is gone
        nats-server 2.9 mishandles a redelivery to it (one stuck until the ack wait, another
        delivered twice). So the naks ask for a redelivery just after that request expired,
        and what the request left in the inbox is released with the rest.
        """
        entries = self.in_flight.drain()
        nc, self._nc, self._js = self._nc, None, None
        subscription, self._subscription = self._subscription, None
        if nc is None:
            return
        import nats.errors  # loaded by open_stream, which made ``nc``

        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            try:
                if nc.is_connected and subscription is not None:
                    entries += [
                        InFlight(parse_message(m)[1], m, extended_at=0.0)
                        for m in _stranded(subscription)
                    ]
                if entries and nc.is_connected:
                    await self._release(entries)
                    await nc.flush(timeout=int(CLOSE_TIMEOUT_S))
            except (nats.errors.Error, OSError) as exc:
                logger.warning(
                    "Could not release %d in-flight NATS message(s) of stream %s at close: %r; "
                    "they are redelivered after their ack wait (%ss)",
                    len(entries),
                    self.stream,
                    exc,
                    extra={"action": "nats.release_failed", "stream": self.stream},
                )
            finally:
                await nc.close()

    async def _release(self, entries: Sequence[InFlight]) -> None:
        """Nak each delivery for redelivery once the last pull request expired; one on its
        last delivery would never come back (JetStream drops it with a MAX_DELIVERIES
        advisory): dead-letter it instead."""
        delay_s = self._pull_expires_at + PULL_EXPIRY_MARGIN_S - anyio.current_time()
        for entry in entries:
            if self._may_dead_letter() and self._is_last_delivery(entry):
                await self._dead_letter(entry, "max_deliver")
                await entry.message.term()
            else:
                await entry.message.nak(delay=delay_s if delay_s > 0 else None)

    def _may_dead_letter(self) -> bool:
        return self.dead_letter_subject is not None and not self._fenced

    def _is_last_delivery(self, entry: InFlight) -> bool:
        return 0 < self.max_deliver <= entry.receipt.num_delivered

    # -- connecting -----------------------------------------------------------------------

    async def _connect(self) -> JetStreamContext.PullSubscription:
        if self._nc is not None:
            raise RuntimeError(f"{self!r}: open_stream() runs once per producer")
        with importing_extra("NatsJetStreamTrigger"):  # a missing nats-py names the extra
            await anyio.to_thread.run_sync(_load_client)
        from nats.aio.client import Client

        from producers.nats_dead_letters import DeadLetters
        from producers.nats_errors import translated
        from producers.nats_setup import ConsumerSetup

        self._dead_letters = dead_letters = DeadLetters(
            stream=self.stream,
            durable=self.durable,
            subject=self.dead_letter_subject,
            max_deliver=self.max_deliver,
        )
        self._nc = nc = Client()  # held before it connects: aclose closes a failed attempt
        with translated("connect", self.address):
            await nc.connect(
                **self.connection.client_kwargs(),
                name=f"sluice:{self.stream}:{self.durable}",
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0,  # two attempts at once, then NoServersError
                connect_timeout=int(CONNECT_TIMEOUT_S),
                error_cb=_quiet,
            )
            self._js = dead_letters.js = nc.jetstream(timeout=API_TIMEOUT_S)
            self._advisories = await nc.subscribe(dead_letters.advisory_subject)
            subscription = await ConsumerSetup(
                address=self.address,
                stream=self.stream,
                durable=self.durable,
                subjects=self.subjects,
                create_stream=self.create_stream,
                stream_subjects=self.stream_subjects,
                ack_wait_s=self.ack_wait_s,
                max_deliver=self.max_deliver,
                dead_letter_subject=self.dead_letter_subject,
                max_in_flight=self.max_in_flight,
                deliver_policy=self.deliver_policy,
            ).prepare(nc, self._js)
        logger.info(
            "NATS JetStream producer connected to %s: stream %s, durable %s (ack wait %ss, "
            "max_deliver %s)",
            self.address,
            self.stream,
            self.durable,
            self.ack_wait_s,
            self.max_deliver,
            extra={"action": "nats.connected", "stream": self.stream},
        )
        return subscription

    # -- fetching -------------------------------------------------------------------------

    async def _next_deliveries(
        self, subscription: JetStreamContext.PullSubscription
    ) -> list[tuple[NatsMessage, NatsReceipt]]:
        """Wait for capacity, then fetch; the heartbeat runs meanwhile."""
        failures: list[ProducerError] = []
        fetched: list[Msg] = []
        async with anyio.create_task_group() as tg:
            self._poll_scope = tg.cancel_scope
            tg.start_soon(self._heartbeat, tg.cancel_scope, failures)
            tg.start_soon(self._watch_advisories, tg.cancel_scope, failures)
            try:
                while len(self.in_flight) >= self.max_in_flight:
                    self._capacity_freed = anyio.Event()
                    await self._capacity_freed.wait()
                fetched = await self._fetch(subscription)
            except ProducerError as exc:  # raised below, alone: not in an exception group
                failures.append(exc)
            tg.cancel_scope.cancel()
        if failures:
            raise failures[0]
        now = anyio.current_time()
        deliveries = [parse_message(msg) for msg in fetched]
        for (_message, receipt), msg in zip(deliveries, fetched, strict=True):
            self.in_flight.add(InFlight(receipt, msg, extended_at=now))
        return deliveries

    async def _fetch(self, subscription: JetStreamContext.PullSubscription) -> list[Msg]:
        import nats.errors

        from producers.nats_errors import translated

        batch = min(MAX_FETCH_BATCH, self.max_in_flight - len(self.in_flight))
        self._pull_expires_at = anyio.current_time() + FETCH_WAIT_S
        with translated("fetch", self.address):
            try:
                return await subscription.fetch(batch, timeout=FETCH_WAIT_S)
            except TimeoutError:  # nats-py's, or asyncio's from some paths of its fetch
                if self._nc is None or self._nc.is_closed:
                    raise nats.errors.ConnectionClosedError from None
                return []

    async def _heartbeat(self, scope: anyio.CancelScope, failures: list[ProducerError]) -> None:
        """Restart the ack wait of in-flight deliveries before it ends; stop on error."""
        from producers.nats_errors import translated

        every_s = self.ack_wait_s / 2
        try:
            while True:
                next_due = self.in_flight.next_due(every_s)
                if next_due is None:
                    await anyio.sleep_forever()
                    continue
                await anyio.sleep_until(next_due)
                now = anyio.current_time()
                due = self.in_flight.due(now, every_s)
                with translated("in_progress", self.address):
                    for entry in due:
                        await entry.message.in_progress()
                self.in_flight.extended(due, now)
        except ProducerError as exc:
            failures.append(exc)
            scope.cancel()

    async def _watch_advisories(
        self, scope: anyio.CancelScope, failures: list[ProducerError]
    ) -> None:
        """Dead-letter what JetStream gave up on (``DeadLetters.watch``); stop on error."""
        assert self._advisories is not None and self._dead_letters is not None
        try:
            await self._dead_letters.watch(self._advisories, self.address)
        except ProducerError as exc:
            failures.append(exc)
            scope.cancel()

    # -- dispositions ---------------------------------------------------------------------

    async def _carry_out(
        self, entry: InFlight, disposition: Disposition, *, rejected: bool
    ) -> None:
        message: Msg = entry.message
        if disposition is Disposition.ACK:
            await message.ack()
        elif disposition is Disposition.NAK:
            if self._is_last_delivery(entry) and self._dead_letters is not None:
                self._dead_letters.warn_lost(entry.receipt.sequence, "failed its last delivery")
            await message.nak()
        elif disposition is Disposition.TERM:
            await message.term()
        else:
            await self._dead_letter(entry, "rejected" if rejected else "max_deliver")
            await message.term()

    async def _dead_letter(self, entry: InFlight, cause: str) -> None:
        assert self._dead_letters is not None
        message: Msg = entry.message
        receipt = entry.receipt
        await self._dead_letters.publish(
            message.data,
            message.headers,
            sequence=receipt.sequence,
            subject=receipt.subject,
            cause=cause,
        )

    def __repr__(self) -> str:
        return (
            f"<NatsJetStreamSharedStreamProducer servers={self.address!r} stream="
            f"{self.stream!r} durable={self.durable!r} in_flight={len(self.in_flight)} "
            f"connected={self._nc is not None}>"
        )
