"""``KafkaSharedStreamProducer``: one consumer-group member shared by sibling Kafka watchers.

Theory of operation
-------------------
``open_stream`` starts an ``AIOKafkaConsumer`` (auto-commit off: only ``advance`` commits)
and yields ``(KafkaMessage, KafkaOffset(topic, partition, offset))`` for every record; or,
with ``batch_messages`` set (batch mode), ``(KafkaMessageBatch, KafkaOffset(topic, partition,
last offset))`` for every run of at most ``batch_messages`` consecutive records of one
partition from one fetch: the shared-stream machinery (fan-out, ack ledger, subscriber
queues, advance) then works once per batch instead of once per message, while each
subscriber still judges, and fires for, every message. Each ``(topic, partition)`` is its
own advance lane, so a slow message holds back commits of its partition only. ``advance``
receives a partition's contiguous resolved prefix and commits ``offset + 1`` of its last
message (Kafka commits are cumulative). Once ``max_inflight_messages`` yielded messages
wait for their advance, no more are fetched until advances catch up: the backlog held in
memory behind the consumer stays bounded (its ``max_poll_interval_ms`` defaults to an hour,
so that a consumer waiting so does not leave its group).

Non-clean items (a subscriber rejected or failed the message, or nobody was subscribed) are
handled by ``on_unclean``, a choice the user makes explicitly:

- ``"dead_letter"`` (the default when ``dead_letter_topic`` is set): the message is copied to
  the dead-letter topic with ``sluice.dead_letter.*`` headers (reason, outcome counts,
  rejecting trigger ids and their errors, source coordinates), then committed past;
- ``"stop"`` (the default without a dead-letter topic): the clean prefix before it is
  committed, then ``UncleanEventError`` is raised: the shared-stream group ends, the
  watchers fail and restart, and the broker redelivers from that message;
- ``"commit"``: committed past like a clean message, with a warning.

In batch mode a message is non-clean when its batch is (every message of it then is: a
subscriber failed it, e.g. ack timeout, overflow, a crashed filter, or the store refused an
event derived from it), or when a subscriber refused that message alone
(``KafkaMessage.note_rejection``, what ``KafkaMessageTrigger`` does for a filter that
raises or a value that does not decode): the other messages of its batch stay clean.

Rebalances. Every message (or batch) yielded is remembered per partition, with the *epoch*
of the partition's assignment, until its advance. On revocation the producer stops yielding
the revoked partitions' records, waits (at most ``revoke_drain_timeout_ms``) for what was
yielded there to be advanced and committed, then gives them up: advances that arrive later
for an older epoch commit nothing (the new owner gets those messages again; deduplication
keys absorb the repeats). A commit never moves a partition's offset backwards.

A broker that stays unreachable (aiokafka retries it in silence) is noticed after a fetch that
returned nothing (``producers.kafka_liveness``): ``BrokerUnavailable``, the watchers restart.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    TopicPartition,
)
from aiokafka import errors as kafka_errors

from producers.exceptions import BrokerUnavailable, ProducerConfigError
from producers.kafka_bootstrap import capture_bootstrap_errors
from producers.kafka_errors import stop_client, translate_kafka_error
from producers.kafka_liveness import BrokerLiveness, lost_after_default
from producers.kafka_messages import (
    KafkaMessage,
    KafkaMessageBatch,
    KafkaOffset,
    message_from_record,
)
from producers.kafka_partitions import PartitionBook
from producers.kafka_settings import (
    DEFAULT_ADVANCE_TIMEOUT_S,
    DEFAULT_MAX_INFLIGHT_MESSAGES,
    DEFAULT_MAX_POLL_RECORDS,
    FETCH_WAIT_MS,
)
from producers.kafka_unclean import (
    outcome_text,
    per_message,
    send_dead_letters,
    unclean_stop_error,
)
from shared_stream.producer import AdvanceItem, SharedStreamProducer

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Iterator, Sequence

    from producers.kafka_settings import KafkaSettings

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class KafkaProducerStats:
    """Counters of one producer (read them in tests and benchmarks)."""

    messages: int = 0
    commits: int = 0
    dead_lettered: int = 0
    committed_unclean: int = 0
    dropped_after_revoke: int = 0
    rebalances: int = 0


class KafkaSharedStreamProducer(SharedStreamProducer):
    """Consumes the topics of ``settings`` as a member of its group; commits per partition in
    ``advance``. The tuning keywords are the producer's own, not trigger settings.

    See the module docstring for lanes, ``on_unclean`` and rebalances. The consumer and the
    dead-letter producer are opened in ``open_stream`` and closed in ``aclose``.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        revoke_drain_timeout_ms: int | None = None,
        max_poll_records: int = DEFAULT_MAX_POLL_RECORDS,
        max_inflight_messages: int = DEFAULT_MAX_INFLIGHT_MESSAGES,
        advance_timeout_s: float = DEFAULT_ADVANCE_TIMEOUT_S,
        batch_messages: int | None = None,
        broker_lost_after_s: float | None = None,
    ) -> None:
        if not settings.bootstrap_servers:  # unresolved: its connection was not looked up
            raise ProducerConfigError(
                f"Kafka group {settings.group_id!r} has no bootstrap servers: a trigger's "
                "connection (kafka_config_id) is looked up before its consumer is built"
            )
        self.settings = settings
        self.group_id = settings.group_id
        self.topics = settings.topics
        self.dead_letter_topic = settings.dead_letter_topic
        self.on_unclean = settings.effective_on_unclean
        self.settings_digest = settings.digest()
        self._consumer_kwargs = settings.consumer_kwargs()
        drain_ms = (
            settings.rebalance_timeout_ms // 2
            if revoke_drain_timeout_ms is None
            else revoke_drain_timeout_ms
        )
        self._revoke_drain_s = drain_ms / 1000
        self._max_poll_records = max_poll_records
        if max_inflight_messages < 1:
            raise ValueError(f"max_inflight_messages must be >= 1, got {max_inflight_messages}")
        self._max_inflight = max_inflight_messages
        if batch_messages is not None and batch_messages < 1:
            raise ValueError(f"batch_messages must be >= 1 or None, got {batch_messages}")
        self.batch_messages = batch_messages
        self.advance_timeout_s = advance_timeout_s
        self.liveness = BrokerLiveness(
            broker_lost_after_s or lost_after_default(settings.session_timeout_ms)
        )
        self._consumer: Any = None
        self._dead_letters: Any = None
        self._book = PartitionBook()
        self._progress: anyio.Event | None = None
        self._opened = False
        self._closing = False
        self._fenced = False
        self._consumer_started = False  # consumer.start() returned: it has a coordinator
        self.stats = KafkaProducerStats()

    @property
    def address(self) -> str:
        """The bootstrap servers, ``host:port[,host:port]``: where the broker is."""
        return self.settings.servers_text

    @property
    def where(self) -> str:
        """``servers group=... topics=...``, for messages."""
        return f"{self.address} group={self.group_id!r} topics={list(self.topics)}"

    # -- the stream -----------------------------------------------------------------------

    async def open_stream(
        self,
    ) -> AsyncGenerator[tuple[KafkaMessage | KafkaMessageBatch, KafkaOffset], None]:
        if self._opened:
            raise RuntimeError(f"{self!r}: open_stream() runs once per producer")
        self._opened = True
        self._progress = anyio.Event()
        consumer = await self._start_clients()
        book = self._book
        while True:
            if book.inflight >= self._max_inflight:  # backpressure: let advances catch up
                await self._wait_for(lambda: self._closing or book.inflight < self._max_inflight)
            try:
                fetched = await consumer.getmany(
                    timeout_ms=FETCH_WAIT_MS, max_records=self._max_poll_records
                )
            except (kafka_errors.KafkaError, kafka_errors.ConsumerStoppedError) as exc:
                raise translate_kafka_error(
                    exc, doing="fetching", where=self.where, address=self.address
                ) from exc
            if not fetched:  # a quiet topic, or a broker gone (aiokafka retries in silence)
                await self.liveness.check(consumer, where=self.where, address=self.address)
                continue
            self.liveness.alive()
            logger.debug(
                "Fetched %d record(s) from %d partition(s)",
                sum(len(records) for records in fetched.values()),
                len(fetched),
                extra={"action": "kafka.fetched", "group_id": self.group_id},
            )
            for tp, records in fetched.items():
                if self.batch_messages is None:
                    for item in self._admit(tp, records):
                        yield item
                else:
                    for batch in self._admit_batches(tp, records):
                        yield batch

    def _admit_batches(
        self, tp: Any, records: list[Any]
    ) -> Iterator[tuple[KafkaMessageBatch, KafkaOffset]]:
        """Yield the records of ``tp`` in batches while this epoch owns the partition."""
        key = (tp.topic, tp.partition)
        epoch = self._book.yielding_epoch(key)
        if epoch is None:
            return
        digest = self.settings_digest
        topic, partition = key
        size = self.batch_messages
        assert size is not None
        for start in range(0, len(records), size):
            chunk = records[start : start + size]
            batch = KafkaMessageBatch(
                topic, partition, [message_from_record(record, digest) for record in chunk]
            )
            if not self._book.record(key, epoch, batch):
                return  # revoked meanwhile: the next owner reads these again
            self.stats.messages += len(chunk)
            yield batch, tuple.__new__(KafkaOffset, (topic, partition, chunk[-1].offset))

    def _admit(self, tp: Any, records: list[Any]) -> Iterator[tuple[KafkaMessage, KafkaOffset]]:
        """Yield (message, offset) for the records of ``tp`` while this epoch owns it."""
        key = (tp.topic, tp.partition)
        epoch = self._book.yielding_epoch(key)
        if epoch is None:
            return
        digest = self.settings_digest
        topic, partition = key
        for record in records:
            message = message_from_record(record, digest)
            if not self._book.record(key, epoch, message):
                return  # revoked meanwhile: the next owner reads these again
            self.stats.messages += 1
            # tuple.__new__: a NamedTuple's own __new__ is a Python function, per record.
            yield message, tuple.__new__(KafkaOffset, (topic, partition, record.offset))

    async def _start_clients(self) -> Any:
        client_kwargs = self.settings.client_kwargs()
        consumer = self._consumer = AIOKafkaConsumer(**client_kwargs, **self._consumer_kwargs)
        consumer.subscribe(topics=list(self.topics), listener=_RebalanceListener(self))
        with capture_bootstrap_errors() as bootstrap:
            try:
                await consumer.start()
                self._consumer_started = True
                if self._fenced:  # fenced while it joined: leave at once
                    consumer.unsubscribe()
                if self.dead_letter_topic is not None:
                    self._dead_letters = AIOKafkaProducer(
                        **client_kwargs, acks="all", enable_idempotence=False
                    )
                    await self._dead_letters.start()
            except kafka_errors.KafkaError as exc:
                await self._stop_clients()
                raise translate_kafka_error(
                    exc,
                    doing="connecting",
                    where=self.where,
                    address=self.address,
                    bootstrap=bootstrap,
                ) from exc
        self.liveness.alive()
        logger.info(
            "Kafka consumer started for %s (on_unclean=%s, dead_letter_topic=%s)",
            self.where,
            self.on_unclean,
            self.dead_letter_topic,
            extra={"action": "kafka.consumer_started", "group_id": self.group_id},
        )
        return consumer

    def get_advance_lane(self, broker_payload: Any) -> tuple[str, int]:
        return broker_payload[0], broker_payload[1]

    # -- advancing ------------------------------------------------------------------------

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        if not batch:
            return
        topic, partition, _ = batch[0].broker_payload
        key = (topic, partition)
        try:
            dropped_before = self._book.dropped
            live = self._book.begin_advance(key, batch)
            dropped = self._book.dropped - dropped_before
            if dropped:
                self._dropped(key, dropped)
            if live:
                await self._settle(key, live)
        finally:
            self._book.end_advance(key)
            self._notify()

    def _dropped(self, key: tuple[str, int], count: int) -> None:
        self.stats.dropped_after_revoke += count
        logger.debug(
            "Not committing %d message(s) of %s/%d: the partition was revoked since; its new "
            "owner reads them again",
            count,
            key[0],
            key[1],
            extra={"action": "kafka.dropped_after_revoke", "topic": key[0]},
        )

    async def _settle(
        self, key: tuple[str, int], raws: list[tuple[AdvanceItem, KafkaMessage | KafkaMessageBatch]]
    ) -> None:
        live = per_message(raws)
        unclean = [index for index, (item, _) in enumerate(live) if not item.outcome.is_clean]
        if unclean and self.on_unclean == "stop":
            first = unclean[0]
            if first > 0:
                await self._commit(key, live[first - 1][1].offset + 1)
            raise unclean_stop_error(live[first], self.where)
        if unclean and self.on_unclean == "dead_letter":
            await self._dead_letter([live[index] for index in unclean])
        elif unclean:
            self.stats.committed_unclean += len(unclean)
            for index in unclean:
                item, message = live[index]
                logger.warning(
                    "Committing past Kafka message %s that was not cleanly delivered (%s), "
                    "as on_unclean='commit' says",
                    message.coordinates,
                    outcome_text(item),
                    extra={"action": "kafka.committed_unclean", "group_id": self.group_id},
                )
        await self._commit(key, live[-1][1].offset + 1)

    async def _commit(self, key: tuple[str, int], offset: int) -> None:
        consumer = self._consumer
        if consumer is None or self._fenced or not self._book.may_commit(key, offset):
            return
        topic, partition = key
        try:
            with anyio.fail_after(self.advance_timeout_s):
                await consumer.commit({TopicPartition(topic, partition): offset})
        except TimeoutError as exc:
            raise BrokerUnavailable(
                f"committing offset {offset} of {topic}/{partition} at {self.where} took more "
                f"than {self.advance_timeout_s}s; the broker is unreachable or overloaded",
                address=self.address,
            ) from exc
        except (kafka_errors.CommitFailedError, kafka_errors.IllegalStateError) as exc:
            logger.warning(
                "Commit of %s/%d at offset %d refused after a rebalance (%s); the partition's "
                "new owner reads the messages again",
                topic,
                partition,
                offset,
                exc,
                extra={"action": "kafka.commit_after_rebalance", "topic": topic},
            )
            return
        except kafka_errors.KafkaError as exc:
            raise translate_kafka_error(
                exc, doing="committing", where=self.where, address=self.address
            ) from exc
        self._book.committed(key, offset)
        self.stats.commits += 1
        logger.debug(
            "Committed %s/%d offset %d",
            topic,
            partition,
            offset,
            extra={
                "action": "kafka.commit",
                "topic": topic,
                "partition": partition,
                "offset": offset,
                "group_id": self.group_id,
            },
        )

    async def _dead_letter(self, items: list[tuple[AdvanceItem, KafkaMessage]]) -> None:
        await send_dead_letters(self, self._dead_letters, items)
        self.stats.dead_lettered += len(items)
        for item, message in items:
            logger.warning(
                "Kafka message %s was not cleanly delivered (%s); sent to dead-letter topic %s",
                message.coordinates,
                outcome_text(item),
                self.dead_letter_topic,
                extra={"action": "kafka.dead_lettered", "group_id": self.group_id},
            )

    # -- rebalances (called from aiokafka's coordinator task) -----------------------------

    def _assigned(self, assigned: set[Any]) -> None:
        self._book.assign((tp.topic, tp.partition) for tp in assigned)
        self.stats.rebalances += 1
        logger.info(
            "Kafka partitions assigned to %s: %s",
            self.where,
            _partition_list(assigned),
            extra={"action": "kafka.partitions_assigned", "group_id": self.group_id},
        )

    async def _revoked(self, revoked: set[Any]) -> None:
        keys = self._book.begin_revoke((tp.topic, tp.partition) for tp in revoked)
        if not keys:
            return
        try:
            with anyio.move_on_after(self._revoke_drain_s):
                await self._wait_for(lambda: self._closing or self._book.is_drained(keys))
        finally:  # even if the wait is cancelled: never commit on a partition we gave up
            left = self._book.end_revoke(keys)
        logger.info(
            "Kafka partitions revoked from %s: %s; %d unresolved message(s) left to the new owner",
            self.where,
            _partition_list(revoked),
            left,
            extra={"action": "kafka.partitions_revoked", "group_id": self.group_id},
        )

    def _notify(self) -> None:
        progress = self._progress
        if progress is not None:
            self._progress = anyio.Event()
            progress.set()

    async def _wait_for(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            assert self._progress is not None
            await self._progress.wait()

    # -- closing --------------------------------------------------------------------------

    def fence(self) -> None:
        """Never commit again, and leave the consumer group now: ``unsubscribe`` clears the
        assignment and asks the coordinator to leave, so a resumed process (a zombie) never
        rejoins the group nor holds a partition its group's new owner should have."""
        self._fenced = self._closing = True
        self._notify()
        consumer = self._consumer
        if consumer is not None and self._consumer_started:
            # (before start() returns there is no coordinator to leave: start's caller does)
            consumer.unsubscribe()
        logger.warning(
            "Kafka consumer of %s fenced: left the group, commits nothing more",
            self.where,
            extra={"action": "kafka.fenced", "group_id": self.group_id},
        )

    async def aclose(self) -> None:
        self._closing = True
        self._notify()
        await self._stop_clients()

    async def _stop_clients(self) -> None:
        clients = (self._consumer, self._dead_letters)
        self._consumer = self._dead_letters = None
        self._consumer_started = False
        for client in clients:
            if client is not None:
                await stop_client(client, where=self.where, group_id=self.group_id)

    def __repr__(self) -> str:
        return (
            f"<KafkaSharedStreamProducer {self.where} on_unclean={self.on_unclean} "
            f"book={self._book!r} closing={self._closing} stats={self.stats} "
            f"liveness={self.liveness!r}>"
        )


class _RebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]  # untyped aiokafka
    def __init__(self, producer: KafkaSharedStreamProducer) -> None:
        self._producer = producer

    async def on_partitions_revoked(self, revoked: set[Any]) -> None:
        await self._producer._revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[Any]) -> None:
        self._producer._assigned(assigned)


def _partition_list(tps: set[Any]) -> list[str]:
    return sorted(f"{tp.topic}/{tp.partition}" for tp in tps)
