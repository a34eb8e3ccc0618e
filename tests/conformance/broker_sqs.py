"""The kit's SQS adapter: ``SqsMessageTrigger`` on moto (``tests/services_sqs.py``).

A stream is a fresh standard queue (one lane: a standard queue keeps no order) with a short
visibility timeout, so that a message an engine held when it died comes back within the
case, and a dead-letter queue. ``unresolved`` is what the queue still holds, visible or in
flight. ``dead_lettered`` receives and deletes what reached the dead-letter queue and keeps
it, so that each call returns everything seen so far. The private broker is a moto server of
the case's own; moto keeps nothing across a restart, so ``start`` has the server create the
case's queues before it serves its first request (same names: same URLs).
"""

from __future__ import annotations

import json
import uuid
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import anyio
from aiobotocore.session import get_session

from tests.services_sqs import SqsEndpoint, start_moto

if TYPE_CHECKING:
    import subprocess
    from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
    from pathlib import Path

    import pytest

KIND = "sqs"
VISIBILITY_S = 3  # what an engine that died held comes back after this


class SqsKitStream:
    """A standard queue and its dead-letter queue."""

    imports = "from producers import SqsMessageTrigger"
    lanes = 1

    def __init__(self, endpoint: SqsEndpoint) -> None:
        self.endpoint = endpoint
        self.name = f"kit-{uuid.uuid4().hex[:16]}"
        self.url = ""
        self.dlq = ""
        self._dead: list[bytes] = []
        self._open: tuple[AsyncExitStack, Any] | None = None

    @asynccontextmanager
    async def _client(self) -> AsyncIterator[Any]:
        """One client for the stream's life (making one costs the event loop ~0.2 s)."""
        if self._open is None:
            stack = AsyncExitStack()
            kwargs = self.endpoint.client_kwargs()
            self._open = (
                stack,
                await stack.enter_async_context(get_session().create_client("sqs", **kwargs)),
            )
        yield self._open[1]

    async def close_client(self) -> None:
        if self._open is not None:
            stack, self._open = self._open[0], None
            await stack.aclose()

    async def create_queues(self) -> None:
        await self.close_client()  # a restarted server: a new connection
        async with self._client() as client:
            attributes = {"VisibilityTimeout": str(VISIBILITY_S)}
            made = await client.create_queue(QueueName=self.name, Attributes=attributes)
            self.url = made["QueueUrl"]
            self.dlq = (await client.create_queue(QueueName=f"{self.name}-dlq"))["QueueUrl"]

    def watcher_source(
        self,
        *,
        match: Mapping[str, Any] | None = None,
        dead_letter: bool = True,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {
            "queue_url": self.url,
            **self.endpoint.client_kwargs(),
            "visibility_timeout_s": VISIBILITY_S,
            "wait_time_s": 1,
        }
        if match:
            kwargs["body_filter"] = dict(match)
        if dead_letter:
            kwargs.update(on_reject="dead_letter", dead_letter_queue_url=self.dlq)
        kwargs.update(options or {})
        return f"SqsMessageTrigger(**{kwargs!r})"

    async def publish(self, bodies: Sequence[Mapping[str, Any]], *, lane: int = 0) -> None:
        await self._send([json.dumps(dict(b)) for b in bodies])

    async def publish_raw(self, payload: bytes, *, lane: int = 0) -> None:
        await self._send([payload.decode("utf-8", errors="surrogateescape")])

    async def _send(self, bodies: list[str]) -> None:
        async with self._client() as client:
            for start in range(0, len(bodies), 10):
                chunk = bodies[start : start + 10]
                entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(chunk)]
                sent = await client.send_message_batch(QueueUrl=self.url, Entries=entries)
                assert not sent.get("Failed"), sent["Failed"]

    async def unresolved(self) -> int:
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        async with self._client() as client:
            got = await client.get_queue_attributes(QueueUrl=self.url, AttributeNames=names)
        return sum(int(got["Attributes"].get(name, 0)) for name in names)

    async def dead_lettered(self) -> list[bytes]:
        async with self._client() as client:
            while True:
                got = await client.receive_message(
                    QueueUrl=self.dlq, MaxNumberOfMessages=10, WaitTimeSeconds=0
                )
                messages = got.get("Messages", [])
                if not messages:
                    return list(self._dead)
                self._dead.extend(
                    m["Body"].encode("utf-8", errors="surrogateescape") for m in messages
                )
                entries = [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ]
                await client.delete_message_batch(QueueUrl=self.dlq, Entries=entries)

    async def aclose(self) -> None:
        try:
            async with self._client() as client:
                for url in (self.url, self.dlq):
                    await client.delete_queue(QueueUrl=url)
        finally:
            await self.close_client()


@asynccontextmanager
async def _stream(endpoint: SqsEndpoint, made: list[SqsKitStream]) -> AsyncIterator[Any]:
    stream = SqsKitStream(endpoint)
    await stream.create_queues()
    made.append(stream)
    try:
        yield stream
    finally:
        made.remove(stream)
        await stream.aclose()


class PrivateMoto:
    """A moto server of one case's own, restarted on its port (queues created again)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.endpoint: SqsEndpoint | None = None
        self._port: int | None = None
        self._streams: list[SqsKitStream] = []

    def stream(self, *, lanes: int = 1) -> Any:
        assert self.endpoint is not None
        return _stream(self.endpoint, self._streams)

    async def stop(self) -> None:
        """Kill the server (a terminated moto waits seconds for its clients' keep-alive
        connections; moto keeps nothing anyway)."""
        assert self.process is not None
        self.process.kill()
        await anyio.to_thread.run_sync(self.process.wait)

    async def start(self) -> None:
        """Start it; the streams' queues exist before it takes a request (a durable broker
        kept them), but their messages are gone: the cases drain a stream before a stop."""
        queues = {
            name: {"VisibilityTimeout": str(VISIBILITY_S)}
            for stream in self._streams
            for name in (stream.name, f"{stream.name}-dlq")
        }
        self.process, url = await anyio.to_thread.run_sync(
            lambda: start_moto(self.log, port=self._port, queues=queues)
        )
        self._port = int(url.rsplit(":", 1)[1])
        self.endpoint = SqsEndpoint(url=url)
        for stream in self._streams:
            await stream.create_queues()  # they exist: a new client, the same URLs


class SqsKit:
    kind = KIND
    cannot: Mapping[str, str] = {}

    def __init__(self, endpoint: SqsEndpoint, tmp: Path) -> None:
        self.endpoint = endpoint
        self.tmp = tmp
        self._streams: list[SqsKitStream] = []

    def stream(self, *, lanes: int = 1) -> Any:
        return _stream(self.endpoint, self._streams)

    @asynccontextmanager
    async def private(self) -> AsyncIterator[PrivateMoto]:
        private = PrivateMoto(self.tmp / f"moto-{uuid.uuid4().hex[:8]}.log")
        await private.start()
        try:
            yield private
        finally:
            if private.process is not None and private.process.poll() is None:
                await private.stop()

    #: a consumer connected to the queue; a message was moved to the dead-letter queue
    consumer_actions = frozenset({"sqs.connected", "sqs.dead_lettered"})

    def payload_n(self, payload: Mapping[str, Any]) -> int:
        return int(payload["body"]["n"])

    def dedup_prefix(self) -> str:
        return "sqs:"


@contextmanager
def kit_broker(request: pytest.FixtureRequest) -> Iterator[SqsKit]:
    """The kit's SQS broker: the session's moto server."""
    tmp = request.getfixturevalue("tmp_path_factory").mktemp("kit-sqs")
    yield SqsKit(request.getfixturevalue("sqs_endpoint"), tmp)
