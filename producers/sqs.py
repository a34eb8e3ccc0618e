"""SQS shared-stream producer (aiobotocore): long-poll, fan out, delete once resolved.

Theory of operation. ``open_stream`` opens the client, reads the queue's visibility timeout,
then loops: wait while ``max_in_flight`` messages are unresolved, long-poll up to ten
messages, yield each as ``(SqsMessage, SqsReceipt)``. Every yielded message stays *in
flight* until its advance. While a poll is waiting, a heartbeat task extends (one batch
call) the visibility of every in-flight message last made invisible half a visibility
timeout ago, so a slow subscriber never sees its message redelivered.

``advance`` takes one lane's resolved prefix (a lane is a FIFO ``MessageGroupId``; a
standard queue has one lane) and gives each message a disposition: clean -> deleted; any
reject -> the ``on_reject`` policy (``leave`` it for the redrive policy, make it
``visible`` now, or ``dead_letter`` it: send to the DLQ, then delete); failed or
zero-subscriber -> visible now (redelivered at once, not after the timeout). Batch
responses' ``Failed`` entries are retried when the broker says so, then raise
(deletes, DLQ sends) or are logged (visibility changes: the timeout still redelivers).
``aclose`` makes what is still in flight visible again and closes the client.

Every botocore / aiohttp error is translated here to ``producers.exceptions`` (the cause
kept); credentials are never logged nor shown in a ``repr``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.to_thread
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from producers.exceptions import BrokerRequestFailed, ProducerError
from producers.sqs_core import (
    BATCH_ATTEMPTS,
    BATCH_RETRY_BACKOFF_S,
    CLOSE_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    DEFAULT_MAX_IN_FLIGHT,
    HARMLESS_VISIBILITY_CODES,
    MAX_BATCH_ENTRIES,
    MAX_WAIT_TIME_S,
    READ_TIMEOUT_MARGIN_S,
    REQUEST_ATTEMPTS,
    Disposition,
    InFlight,
    InFlightMessages,
    OnReject,
    SqsConnection,
    SqsMessage,
    SqsReceipt,
    check_settings,
    disposition_of,
    parse_message,
)
from producers.sqs_errors import translated
from shared_stream.producer import SharedStreamProducer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

    from aiobotocore.session import AioSession

    from shared_stream.producer import AdvanceItem

__all__ = ("SqsConnection", "SqsMessage", "SqsReceipt", "SqsSharedStreamProducer")

logger = logging.getLogger(__name__)

# What a received message attribute carries that SendMessage takes back.
_ATTRIBUTE_VALUE_KEYS: Final = frozenset({"DataType", "StringValue", "BinaryValue"})


@functools.cache
def _session() -> AioSession:
    """One botocore session per process, its SQS models loaded (cached by its loader).

    Loading them takes 50-250 ms of file reads and JSON parsing: run it in a worker thread
    (``anyio.to_thread.run_sync(_session)``) so the event loop never blocks on it.
    """
    session = get_session()
    loader = session.get_component("data_loader")
    loader.list_available_services("service-2")
    loader.load_service_model("sqs", "service-2")
    loader.load_service_model("sqs", "endpoint-rule-set-1")
    for name in ("endpoints", "partitions", "sdk-default-configuration", "_retry"):
        loader.load_data(name)
    return session


def _chunks(entries: Sequence[InFlight]) -> Iterator[Sequence[InFlight]]:
    for start in range(0, len(entries), MAX_BATCH_ENTRIES):
        yield entries[start : start + MAX_BATCH_ENTRIES]


class SqsSharedStreamProducer(SharedStreamProducer):
    """One queue's ack-mode producer; see the module docstring for the model.

    ``visibility_timeout_s`` None uses the queue's own; ``wait_time_s`` is the long-poll
    wait; ``max_in_flight`` bounds received-but-unadvanced messages (back-pressure).
    """

    def __init__(
        self,
        connection: SqsConnection,
        *,
        on_reject: OnReject = "leave",
        dead_letter_queue_url: str | None = None,
        visibility_timeout_s: int | None = None,
        wait_time_s: int = MAX_WAIT_TIME_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        check_settings(
            on_reject=on_reject,
            dead_letter_queue_url=dead_letter_queue_url,
            visibility_timeout_s=visibility_timeout_s,
            wait_time_s=wait_time_s,
            max_in_flight=max_in_flight,
        )
        self.connection = connection
        self.on_reject: OnReject = on_reject
        self.dead_letter_queue_url = dead_letter_queue_url
        self.wait_time_s = wait_time_s
        self.max_in_flight = max_in_flight
        self.visibility_timeout_s = visibility_timeout_s
        self.in_flight = InFlightMessages()
        self._explicit_visibility = visibility_timeout_s is not None
        self._dlq_fifo = bool(dead_letter_queue_url and dead_letter_queue_url.endswith(".fifo"))
        self._client: Any = None
        self._exit_stack = contextlib.AsyncExitStack()
        self._visibility_lock = anyio.Lock()
        self._capacity_freed = anyio.Event()
        self._fenced = False

    @property
    def queue_url(self) -> str:
        return self.connection.queue_url

    # -- the producer ---------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[SqsMessage, SqsReceipt]]:
        client = await self._connect()
        while True:
            messages = await self._next_messages(client)
            now = anyio.current_time()
            for raw in messages:
                yield self._admit(raw, now)

    def get_advance_lane(self, broker_payload: Any) -> str | None:
        receipt: SqsReceipt = broker_payload
        return receipt.group_id

    def fence(self) -> None:
        """Never delete nor dead-letter again: the queue's new owner gets these messages
        (``aclose`` only makes the in-flight ones visible, which hands them over sooner)."""
        self._fenced = True
        logger.warning(
            "SQS consumer of %s fenced: deletes nothing more",
            self.queue_url,
            extra={"action": "sqs.fenced", "queue_url": self.queue_url},
        )

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        if self._fenced:
            raise ProducerError(f"SQS consumer of {self.queue_url} is fenced: nothing is deleted")
        plan: dict[Disposition, list[InFlight]] = {d: [] for d in Disposition}
        for receipt, outcome in batch:
            entry = self.in_flight.pop(receipt.receipt_handle)
            plan[disposition_of(outcome, self.on_reject)].append(entry)
        self._capacity_freed.set()
        async with self._visibility_lock:
            if plan[Disposition.DEAD_LETTER]:
                await self._send_to_dead_letter_queue(plan[Disposition.DEAD_LETTER])
            await self._delete(plan[Disposition.DELETE] + plan[Disposition.DEAD_LETTER])
            await self._change_visibility(plan[Disposition.MAKE_VISIBLE], 0)

    async def aclose(self) -> None:
        """Make every message still in flight visible again (best effort), close the client."""
        entries = self.in_flight.drain()
        try:
            if self._client is not None and entries:
                with anyio.move_on_after(CLOSE_TIMEOUT_S):
                    await self._change_visibility(entries, 0)
        except ProducerError as exc:
            logger.warning(
                "Could not make %d in-flight SQS message(s) of %s visible at close: %s; they "
                "are redelivered after their visibility timeout",
                len(entries),
                self.queue_url,
                exc,
                extra={"action": "sqs.release_failed", "queue_url": self.queue_url},
            )
        finally:
            self._client = None
            with anyio.move_on_after(CLOSE_TIMEOUT_S):
                await self._exit_stack.aclose()

    # -- polling --------------------------------------------------------------------------

    async def _connect(self) -> Any:
        if self._client is not None:
            raise RuntimeError(f"{self!r}: open_stream() runs once per producer")
        config = AioConfig(
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=self.wait_time_s + READ_TIMEOUT_MARGIN_S,
            retries={"max_attempts": REQUEST_ATTEMPTS, "mode": "standard"},
        )
        session = await anyio.to_thread.run_sync(_session)
        with translated("connect", self.queue_url):
            creator = session.create_client("sqs", config=config, **self.connection.client_kwargs())
            client = await self._exit_stack.enter_async_context(creator)
            self._client = client
            response = await client.get_queue_attributes(
                QueueUrl=self.queue_url, AttributeNames=["VisibilityTimeout"]
            )
        if not self._explicit_visibility:
            self.visibility_timeout_s = int(response["Attributes"]["VisibilityTimeout"])
            check_settings(visibility_timeout_s=self.visibility_timeout_s, where=self.queue_url)
        if self.dead_letter_queue_url is not None:
            with translated("GetQueueAttributes", self.dead_letter_queue_url):
                await client.get_queue_attributes(
                    QueueUrl=self.dead_letter_queue_url, AttributeNames=["QueueArn"]
                )
        logger.info(
            "SQS producer connected to %s (visibility timeout %ss, on_reject=%s)",
            self.queue_url,
            self.visibility_timeout_s,
            self.on_reject,
            extra={"action": "sqs.connected", "queue_url": self.queue_url},
        )
        return client

    async def _next_messages(self, client: Any) -> list[dict[str, Any]]:
        """Wait for capacity, then long-poll; the heartbeat runs meanwhile."""
        failures: list[ProducerError] = []
        messages: list[dict[str, Any]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._heartbeat, tg.cancel_scope, failures)
            while len(self.in_flight) >= self.max_in_flight:
                self._capacity_freed = anyio.Event()
                await self._capacity_freed.wait()
            messages = await self._receive(client)
            tg.cancel_scope.cancel()
        if failures:
            raise failures[0]
        return messages

    async def _receive(self, client: Any) -> list[dict[str, Any]]:
        request: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MaxNumberOfMessages": min(MAX_BATCH_ENTRIES, self.max_in_flight - len(self.in_flight)),
            "WaitTimeSeconds": self.wait_time_s,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
        }
        if self._explicit_visibility:
            request["VisibilityTimeout"] = self.visibility_timeout_s
        with translated("ReceiveMessage", self.queue_url):
            response = await client.receive_message(**request)
        messages: list[dict[str, Any]] = response.get("Messages", [])
        return messages

    def _admit(self, raw: dict[str, Any], now: float) -> tuple[SqsMessage, SqsReceipt]:
        message, receipt = parse_message(raw)
        entry = InFlight(receipt, raw["Body"], raw.get("MessageAttributes", {}), extended_at=now)
        self.in_flight.add(entry)
        return message, receipt

    async def _heartbeat(self, scope: anyio.CancelScope, failures: list[ProducerError]) -> None:
        """Extend in-flight messages' visibility before it expires; stop the poll on error."""
        assert self.visibility_timeout_s is not None
        every_s = self.visibility_timeout_s / 2
        try:
            while True:
                next_due = self.in_flight.next_due(every_s)
                if next_due is None:
                    await anyio.sleep_forever()
                    continue
                await anyio.sleep_until(next_due)
                async with self._visibility_lock:
                    now = anyio.current_time()
                    due = self.in_flight.due(now, every_s)
                    stale = await self._change_visibility(due, self.visibility_timeout_s)
                    self.in_flight.extended(due, now, stale=stale)
        except ProducerError as exc:
            failures.append(exc)
            scope.cancel()

    # -- batch calls ----------------------------------------------------------------------

    async def _delete(self, entries: Sequence[InFlight]) -> None:
        def request(entry: InFlight) -> dict[str, Any]:
            return {"ReceiptHandle": entry.receipt.receipt_handle}

        client = self._client
        failed = await self._batch(
            "DeleteMessageBatch", client.delete_message_batch, entries, request
        )
        if failed:
            raise BrokerRequestFailed(
                f"SQS DeleteMessageBatch on {self.queue_url} failed for "
                f"{_describe(failed)}; they are redelivered (deduplicated by message id)"
            )

    async def _send_to_dead_letter_queue(self, entries: Sequence[InFlight]) -> None:
        def request(entry: InFlight) -> dict[str, Any]:
            message: dict[str, Any] = {"MessageBody": entry.body}
            if entry.message_attributes:
                message["MessageAttributes"] = {
                    name: {k: v for k, v in value.items() if k in _ATTRIBUTE_VALUE_KEYS}
                    for name, value in entry.message_attributes.items()
                }
            if self._dlq_fifo:
                message["MessageGroupId"] = entry.receipt.group_id or "dead-letter"
                message["MessageDeduplicationId"] = entry.receipt.message_id
            return message

        dlq = self.dead_letter_queue_url
        assert dlq is not None
        failed = await self._batch(
            "SendMessageBatch", self._client.send_message_batch, entries, request, queue_url=dlq
        )
        if failed:
            raise BrokerRequestFailed(
                f"SQS SendMessageBatch to dead-letter queue {dlq} failed for "
                f"{_describe(failed)}; they stay in {self.queue_url} and are redelivered"
            )
        logger.info(
            "Moved %d rejected SQS message(s) from %s to %s",
            len(entries),
            self.queue_url,
            dlq,
            extra={"action": "sqs.dead_lettered", "queue_url": self.queue_url},
        )

    async def _change_visibility(
        self, entries: Sequence[InFlight], timeout_s: int
    ) -> list[InFlight]:
        """Set the visibility of ``entries``; returns (and logs) those it could not change."""

        def request(entry: InFlight) -> dict[str, Any]:
            return {"ReceiptHandle": entry.receipt.receipt_handle, "VisibilityTimeout": timeout_s}

        call = self._client.change_message_visibility_batch
        failed = await self._batch("ChangeMessageVisibilityBatch", call, entries, request)
        failed = [(e, f) for e, f in failed if f.get("Code") not in HARMLESS_VISIBILITY_CODES]
        if failed:
            logger.warning(
                "SQS ChangeMessageVisibilityBatch(%ss) on %s failed for %s; they keep their "
                "current visibility timeout",
                timeout_s,
                self.queue_url,
                _describe(failed),
                extra={"action": "sqs.visibility_failed", "queue_url": self.queue_url},
            )
        return [entry for entry, _ in failed]

    async def _batch(
        self,
        action: str,
        call: Callable[..., Awaitable[dict[str, Any]]],
        entries: Sequence[InFlight],
        request: Callable[[InFlight], dict[str, Any]],
        *,
        queue_url: str | None = None,
    ) -> list[tuple[InFlight, dict[str, Any]]]:
        """Run a batch action in chunks of ten; retry entries the broker may accept later.

        Returns the entries that still failed, each with its ``Failed`` record.
        """
        url = queue_url or self.queue_url
        pending = list(entries)
        refused: list[tuple[InFlight, dict[str, Any]]] = []  # the sender's fault: final
        for attempt in range(BATCH_ATTEMPTS):
            failed: list[tuple[InFlight, dict[str, Any]]] = []
            for chunk in _chunks(pending):
                ids = {str(index): entry for index, entry in enumerate(chunk)}
                body = [{"Id": key, **request(entry)} for key, entry in ids.items()]
                with translated(action, url):
                    response = await call(QueueUrl=url, Entries=body)
                failed.extend((ids[f["Id"]], f) for f in response.get("Failed", []))
            refused.extend((entry, f) for entry, f in failed if f.get("SenderFault"))
            retry = [(entry, f) for entry, f in failed if not f.get("SenderFault")]
            if not retry or attempt + 1 == BATCH_ATTEMPTS:
                return refused + retry
            pending = [entry for entry, _ in retry]
            await anyio.sleep(BATCH_RETRY_BACKOFF_S * 2**attempt)
        return refused

    def __repr__(self) -> str:
        return (
            f"<SqsSharedStreamProducer queue_url={self.queue_url!r} in_flight="
            f"{len(self.in_flight)} visibility_timeout_s={self.visibility_timeout_s} "
            f"on_reject={self.on_reject!r} connected={self._client is not None}>"
        )


def _describe(failed: Sequence[tuple[InFlight, dict[str, Any]]]) -> str:
    shown = ", ".join(f"{e.receipt.message_id} ({f.get('Code')})" for e, f in failed[:5])
    more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
    return f"{len(failed)} message(s): {shown}{more}"
