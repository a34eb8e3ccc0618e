"""The single persister: drains the outbox in batches, one transaction per batch.

The persister flushes as soon as the previous write finished (no fixed cadence), never on
the event-loop thread, and confirms the shared-stream sequence numbers of a batch right
after its commit (through the callback it was given), so the broker is advanced within
milliseconds of the events being stored.

It works in two stages: while one batch is written (in a worker thread), the next is taken
from the outbox and prepared (each watcher event's payload encoded to the JSON text that is
stored; in another worker thread unless the batch is small), so the writer goes from one
write to the next with no encoding between.
Batches are written one at a time, in the order they were taken. A batch of watcher events
only (the stream of a busy broker) is one statement, which on PostgreSQL costs one round
trip (``watcher_events.store_watcher_events``, ``Database.run_statement``); any other batch
is one transaction.

A batch that fails because the database is unavailable is retried with backoff and nothing is
lost; a batch that fails because of one bad item is bisected and the bad item is reported
(with its trigger id) and dropped; its shared-stream event is left unconfirmed, so the ack
timeout makes the broker redeliver it rather than lose it.

A watcher's event is stored under the ``dedup_key`` its ``FiredEvent`` carries (the trigger
computed it as the event was taken): once per key, so a redelivery is absorbed, and every
time when it has none; with the partition key its ``TriggerEvent`` carries. The persister
needs nothing from the triggerer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import anyio
import anyio.lowlevel
import anyio.to_thread

from engine.authoring.deferral import FAIL_METHOD
from engine.db.queries import assets, deferrals, watcher_events
from engine.db.queries import triggers as trigger_rows
from engine.db.queries.jobs import check_owner
from engine.exceptions import DatabaseError, DatabaseUnavailable, LeaseLost
from engine.metrics.readings import Buckets
from engine.states import TriggerKind
from engine.triggerer.outbox import FiredEvent, Outbox, OutboxItem, TriggerFailed
from triggers.base import BaseTaskEndEvent
from triggers.exceptions import SerializationError
from triggers.serde import json_text, serialize_value

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from anyio.abc import ObjectReceiveStream, ObjectSendStream
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

    from engine.db.database import Database
    from engine.db.queries.watcher_events import WatcherEventRow
    from triggers.base import TriggerEvent

logger = logging.getLogger(__name__)


BATCH_MAX_ITEMS: Final = 2000
PREPARE_ON_LOOP_MAX: Final = 32  # a batch this small is prepared on the event loop
RETRY_BACKOFF_S: Final = (0.2, 10.0)
COMMIT_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
BATCH_SIZE_BUCKETS: Final = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2000.0)


#: An outbox item with the JSON text of its payload when it is a watcher's event (the
#: (asset, watcher) it carries says so), else None.
Prepared: TypeAlias = "tuple[OutboxItem, str | None]"


@dataclass
class PersisterStats:
    batches: int = 0
    events: int = 0  # trigger events stored (refused ones are not)
    refused: int = 0  # trigger events refused: payload over the size limit
    asset_events: int = 0
    tasks_resumed: int = 0
    failures_recorded: int = 0
    dropped: int = 0
    last_batch_size: int = 0
    last_commit_s: float = 0.0
    commit_s: Buckets = field(default_factory=lambda: Buckets(COMMIT_BUCKETS_S), repr=False)
    batch_size: Buckets = field(default_factory=lambda: Buckets(BATCH_SIZE_BUCKETS), repr=False)


@dataclass(frozen=True, slots=True)
class BatchResult:
    seqs: list[int]
    asset_events: int
    tasks_resumed: int
    fired_task_triggers: list[int]
    refused_seqs: list[int] = field(default_factory=list)  # not stored (over the size limit)
    refused: int = 0  # trigger events not stored (over the size limit), with a seq or not
    fired: int = 0  # trigger events in the batch (stored or refused)
    failures: int = 0  # trigger failures in the batch


class Persister:
    def __init__(
        self,
        *,
        db: Database,
        outbox: Outbox,
        confirm: Callable[[Sequence[int]], None] | None = None,
        refuse: Callable[[Sequence[int]], None] | None = None,
        on_committed: Callable[[BatchResult], None] | None = None,
        max_payload_bytes: int | None = None,
        keep_events_while_paused: bool = True,
        owner: int | None = None,
        on_lease_lost: Callable[[str], None] | None = None,
    ) -> None:
        self._db = db
        #: the triggerer's job id: nothing is stored once its row is no longer running
        #: (``watcher_events``' owner guard); ``on_lease_lost(reason)`` is called, then
        #: ``LeaseLost`` raised, and the batch stays unconfirmed (the broker redelivers it)
        self.owner = owner
        self._on_lease_lost = on_lease_lost
        self._keep_events_while_paused = keep_events_while_paused
        self._max_payload_bytes = max_payload_bytes
        self._outbox = outbox
        self._confirm = confirm
        self._refuse = refuse
        self._on_committed = on_committed
        self._in_hand = 0  # batches taken from the outbox and not yet written
        self._held: dict[int, list[OutboxItem]] = {}  # those batches (``unwritten``)
        self._tokens = 0
        self._batch_done: anyio.Event | None = None
        self.stats = PersisterStats()

    def __repr__(self) -> str:
        return f"Persister(pending={len(self._outbox)}, stats={self.stats})"

    @property
    def outbox(self) -> Outbox:
        """The outbox this persister drains."""
        return self._outbox

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Drain the outbox until it is closed and empty.

        One task takes and prepares the next batch while this one writes the previous: at
        most one batch waits, prepared, behind the one being written.
        """
        send, receive = anyio.create_memory_object_stream[tuple[int, list[Prepared]]](0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._prepare_batches, send)
            task_status.started()
            await self._write_batches(receive)

    async def _prepare_batches(self, send: ObjectSendStream[tuple[int, list[Prepared]]]) -> None:
        async with send:
            while True:
                batch = await self._outbox.get_batch(BATCH_MAX_ITEMS)
                if not batch:
                    return
                self._in_hand += 1
                token = self._hold(batch)
                try:
                    # A few events are encoded in less time than a thread hop takes.
                    if len(batch) <= PREPARE_ON_LOOP_MAX:
                        prepared = self.prepare(batch)
                    else:
                        prepared = await anyio.to_thread.run_sync(self.prepare, batch)
                    if not prepared:  # every event of it was dropped: nothing to write
                        self._held.pop(token)
                        self._batch_written()
                        continue
                    await send.send((token, prepared))
                except BaseException:
                    self._batch_written()
                    raise

    async def _write_batches(
        self, receive: ObjectReceiveStream[tuple[int, list[Prepared]]]
    ) -> None:
        async with receive:
            async for token, prepared in receive:
                try:
                    await self._write_with_retry(prepared)
                    self._held.pop(token)  # written (or its bad items dropped and reported)
                finally:
                    self._batch_written()

    def _hold(self, batch: list[OutboxItem]) -> int:
        self._tokens += 1
        self._held[self._tokens] = batch
        return self._tokens

    def unwritten(self) -> list[OutboxItem]:
        """What this persister took from its outbox and did not write, oldest first: the
        batches it held when it was cancelled (a write cancelled in its worker thread may
        still have committed: their dedup keys absorb a second store)."""
        return [item for token in sorted(self._held) for item in self._held[token]]

    def _batch_written(self) -> None:
        self._in_hand -= 1
        if self._batch_done is not None:
            self._batch_done.set()

    def is_flushed(self) -> bool:
        """Nothing waits in the outbox and no batch is being prepared or written."""
        return self._in_hand == 0 and len(self._outbox) == 0

    async def wait_flushed(self) -> None:
        """Return once everything put in the outbox so far has been written."""
        while not self.is_flushed():
            self._batch_done = anyio.Event()
            await self._batch_done.wait()

    def prepare(self, batch: Sequence[OutboxItem]) -> list[Prepared]:
        """Each item with its payload's JSON text when it is a watcher's event (in a worker
        thread, but for a batch of a few events). Encoded once: the text measured against
        the size limit is the text stored. An event whose payload cannot be encoded
        (changed after the trigger built it) is dropped and reported, as a batch item the
        database refused would be."""
        prepared: list[Prepared] = []
        for item in batch:
            text = None
            if type(item) is FiredEvent and item.watcher is not None:
                event = item.event
                try:
                    text = json_text(event.payload, where="event payload", plain=event.plain)
                except (SerializationError, TypeError, ValueError, RecursionError) as exc:
                    self._drop(item, exc)
                    continue
            prepared.append((item, text))
        return prepared

    async def _write_with_retry(self, batch: list[Prepared]) -> None:
        delay = RETRY_BACKOFF_S[0]
        while True:
            try:
                await self._write(batch)
                return
            except LeaseLost as exc:
                if self._on_lease_lost is not None:
                    self._on_lease_lost(str(exc))
                raise
            except DatabaseUnavailable as exc:
                logger.warning(
                    "Metadata database unavailable, retrying %d event(s) in %.1fs: %s",
                    len(batch),
                    delay,
                    exc,
                    extra={"action": "persist_retry"},
                )
                await anyio.sleep(delay)
                delay = min(delay * 2, RETRY_BACKOFF_S[1])
            except DatabaseError as exc:  # refused: drop that one event, keep the others
                if len(batch) == 1:
                    self._drop(batch[0][0], exc)
                    return
                middle = len(batch) // 2
                await self._write_with_retry(batch[:middle])
                await self._write_with_retry(batch[middle:])
                return

    def _drop(self, item: OutboxItem, exc: BaseException) -> None:
        self.stats.dropped += 1
        logger.error(
            "Could not store the outcome of trigger %s, dropped it (an acked stream event will "
            "be redelivered after the ack timeout): %s",
            item.trigger_id,
            exc,
            extra={"action": "persist_drop", "trigger_id": item.trigger_id},
        )

    async def _write(self, batch: list[Prepared]) -> None:
        started = time.perf_counter()
        rows = self._plain_rows(batch)
        if rows is not None:
            result = await self._db.run_statement(
                lambda connection: self._store_rows(connection, *rows)
            )
        else:
            result = await self._db.run(lambda session: self.write_prepared(session, batch))
        elapsed = time.perf_counter() - started
        self._record(batch, result, elapsed)
        if self._confirm is not None and result.seqs:
            self._confirm(result.seqs)
        if self._refuse is not None and result.refused_seqs:
            self._refuse(result.refused_seqs)
        if self._on_committed is not None:
            self._on_committed(result)

    def _record(self, batch: list[Prepared], result: BatchResult, elapsed: float) -> None:
        stats = self.stats
        stats.batches += 1
        # Counted by the writer thread as it went through the batch: no pass on the loop.
        stats.events += result.fired - result.refused
        stats.refused += result.refused
        stats.failures_recorded += result.failures
        stats.asset_events += result.asset_events
        stats.tasks_resumed += result.tasks_resumed
        stats.last_batch_size = len(batch)
        stats.last_commit_s = elapsed
        stats.commit_s.observe(elapsed)
        stats.batch_size.observe(len(batch))

    def _plain_rows(
        self, batch: Sequence[Prepared]
    ) -> tuple[list[WatcherEventRow], list[int]] | None:
        """The rows and seqs of a batch of watcher events only, each within the size limit
        (the stream of a busy broker): stored by one statement. None for any other batch."""
        rows: list[WatcherEventRow] = []
        seqs: list[int] = []
        limit = self._max_payload_bytes
        for item, payload in batch:
            if payload is None or (limit is not None and len(payload) > limit):
                return None
            assert type(item) is FiredEvent and item.watcher is not None
            rows.append(_row(item, item.watcher, payload))
            if item.seq is not None:
                seqs.append(item.seq)
        return rows, seqs

    # --- the writes (run in a worker thread) ---------------------------------------------

    def _store_rows(
        self, connection: Connection, rows: list[WatcherEventRow], seqs: list[int]
    ) -> BatchResult:
        inserted = watcher_events.store_watcher_events(
            connection, rows, keep_while_paused=self._keep_events_while_paused, owner=self.owner
        )
        return BatchResult(seqs, inserted, 0, [], fired=len(rows))

    def write_prepared(self, session: Session, batch: Sequence[Prepared]) -> BatchResult:
        """Write any batch in ``session``'s transaction: watcher events (refusing those over
        the size limit), resumed or ended deferred tasks, and trigger failures; nothing once
        the owner's job row is no longer running (``LeaseLost``)."""
        if self.owner is not None:
            check_owner(session.connection(), self.owner)
        # A watcher's event carries the (asset, watcher) its trigger was claimed for, and a
        # watcher trigger serves one watcher for its whole life (an edit makes a new row):
        # only the other items (task triggers, failures) need the rows read.
        unknown = {item.trigger_id for item, payload in batch if payload is None}
        watchers = assets.watcher_assets(session, unknown) if unknown else {}
        rows: list[WatcherEventRow] = []
        seqs: list[int] = []  # confirmed after the commit, in firing order
        refused_seqs: list[int] = []  # over the payload limit: refused (dead-lettered)
        resumed, refused, done_task_triggers = 0, 0, set()
        limit = self._max_payload_bytes
        failures: list[TriggerFailed] = []
        for item, payload in batch:
            if not isinstance(item, FiredEvent):
                failures.append(item)
                continue
            # A watcher whose row was replaced meanwhile (its kwargs were edited) still
            # fired for its asset: the row is gone, the identity it was claimed with is not.
            watcher = item.watcher or watchers.get(item.trigger_id)
            if watcher is None:
                if item.trigger_id not in done_task_triggers:
                    resumed += self._finish_task_trigger(session, item.trigger_id, item.event)
                    done_task_triggers.add(item.trigger_id)
            else:
                if payload is None:  # a watcher's event that did not say so: rare
                    payload = json_text(item.event.payload, where="event payload")
                if limit is not None and len(payload) > limit:
                    self._reject_oversized(session, item, watcher[1], len(payload), limit)
                    refused += 1
                    if item.seq is not None:
                        refused_seqs.append(item.seq)
                    continue
                rows.append(_row(item, watcher, payload))
            if item.seq is not None:
                seqs.append(item.seq)
        for failure in failures:
            self._record_failure(session, failure, is_watcher=failure.trigger_id in watchers)
        inserted = watcher_events.store_watcher_events(
            session.connection(), rows, keep_while_paused=self._keep_events_while_paused
        )
        return BatchResult(
            seqs,
            inserted,
            resumed,
            sorted(done_task_triggers),
            refused_seqs,
            refused=refused,
            fired=len(batch) - len(failures),
            failures=len(failures),
        )

    @staticmethod
    def _reject_oversized(
        session: Session, item: FiredEvent, watcher: str, size: int, limit: int
    ) -> None:
        """Log, and record on the trigger row, an event whose payload is over the limit.

        ``[core] max_asset_event_payload_bytes`` keeps the database, the scheduler and every
        task context that receives the event from carrying megabytes per event. ``size`` is
        the length of the payload's JSON text (ASCII: characters are bytes).
        """
        reason = (
            f"rejected an event of trigger {item.trigger_id} (watcher {watcher!r}): its payload "
            f"is {size:,} bytes of JSON, over [core] max_asset_event_payload_bytes = {limit:,}; "
            "it is not stored. Put a reference in the payload (a path, a URL, an object key) "
            "rather than the data, or raise the limit"
        )
        logger.error(
            "%s",
            reason,
            extra={
                "action": "asset_event_payload_too_large",
                "trigger_id": item.trigger_id,
                "watcher": watcher,
                "payload_bytes": size,
                "limit_bytes": limit,
            },
        )
        trigger_rows.record_trigger_failure(session, item.trigger_id, reason)

    def _finish_task_trigger(self, session: Session, trigger_id: int, event: TriggerEvent) -> int:
        if isinstance(event, BaseTaskEndEvent):
            count = deferrals.end_deferred_tasks(
                session,
                trigger_id,
                state=event.task_instance_state,
                xcoms=_task_results(event),
                keep_while_paused=self._keep_events_while_paused,
            )
        else:
            # Each task resumes with the kwargs it gave defer(kwargs=...) plus the event.
            count = deferrals.resume_deferred_tasks_with_event(session, trigger_id, event.payload)
        trigger_rows.delete_trigger(session, trigger_id)
        return count

    @staticmethod
    def _record_failure(session: Session, item: TriggerFailed, *, is_watcher: bool) -> None:
        if is_watcher or item.kind is not TriggerKind.TASK:
            trigger_rows.record_trigger_failure(
                session,
                item.trigger_id,
                item.reason,
                unreachable_broker=item.unreachable_broker,
                unreachable_address=item.unreachable_address,
            )
            return
        deferrals.resume_deferred_tasks(
            session,
            item.trigger_id,
            next_method=FAIL_METHOD,
            next_kwargs={"error": item.reason, "traceback": item.traceback},
        )
        trigger_rows.delete_trigger(session, item.trigger_id)


def _row(item: FiredEvent, watcher: tuple[int, str], payload: str) -> WatcherEventRow:
    # The key the trigger gave when the event was taken; None is never merged.
    # The partition key travels with the event (checked when the trigger built it; an
    # event of a subclass whose __init__ skipped TriggerEvent's has none).
    key = item.dedup_key
    return (
        watcher[0],
        payload,
        None if key is None else key[:512],
        item.trigger_id,
        watcher[1],
        getattr(item.event, "partition_key", None),
    )


def _task_results(event: BaseTaskEndEvent) -> dict[str, Any] | None:
    """The ``xcoms`` of an ``end_from_trigger`` event in the shape the executor stores a
    returned value (``{"return_value": serialize_value(value)}``): tagged JSON per key, so
    the same reader sees both. None when there are none, as for a task returning None."""
    if not event.xcoms:
        return None
    return {
        name: serialize_value(value, where=f"xcom {name!r} of {type(event).__name__}")
        for name, value in event.xcoms.items()
    }
