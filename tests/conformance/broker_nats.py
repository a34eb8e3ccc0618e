"""The kit's NATS JetStream adapter: ``NatsJetStreamTrigger`` on the machine's nats-server.

A stream is a fresh JetStream stream on ``<name>.>`` whose lanes are subjects
(``<name>.l0``, ``<name>.l1``: JetStream orders a stream, the watchers advance per subject),
with a dead-letter stream of its own on ``dlq.<name>``. The watchers share the durable pull
consumer ``kit`` with a short ack wait, so that what an engine held when it died comes back
within the case. ``unresolved`` is the consumer's pending plus unacked messages (the whole
stream before the consumer exists); ``dead_lettered`` reads the dead-letter stream, which
keeps every copy. Without a dead-letter place a rejected message is ``nak``-ed
(``on_reject="nak"``): JetStream delivers it again. The private broker is a
``nats-server -js`` of the case's own (``tests.services_nats.PrivateNats``), whose store
directory keeps the streams and the consumer across a restart on the same port.
"""

from __future__ import annotations

import json
import uuid
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import nats
from nats.js.errors import NotFoundError

from tests.services_nats import PrivateNats

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping, Sequence

    import pytest

KIND = "nats"
DURABLE = "kit"
ACK_WAIT_S = 3.0  # what an engine that died held comes back after this


class NatsKitStream:
    """A JetStream stream of ``lanes`` subjects and its dead-letter stream."""

    imports = "from producers import NatsJetStreamTrigger"

    def __init__(self, url: str, *, lanes: int = 1) -> None:
        self.url = url
        self.lanes = lanes
        self.name = f"KIT{uuid.uuid4().hex[:16]}"
        self.dead_letter_stream = f"{self.name}_DLQ"
        self.dead_letter_subject = f"dlq.{self.name}"
        self._nc: Any = None

    async def _js(self) -> Any:
        """A JetStream context on a live connection (a restarted server: a new one)."""
        if self._nc is None or self._nc.is_closed:
            self._nc = await nats.connect(self.url, allow_reconnect=False)
        return self._nc.jetstream()

    async def create(self) -> None:
        js = await self._js()
        await js.add_stream(name=self.name, subjects=[f"{self.name}.>"])
        await js.add_stream(name=self.dead_letter_stream, subjects=[self.dead_letter_subject])

    def watcher_source(
        self,
        *,
        match: Mapping[str, Any] | None = None,
        dead_letter: bool = True,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {
            "servers": self.url,
            "stream": self.name,
            "subjects": f"{self.name}.>",
            "durable": DURABLE,
            "ack_wait_s": ACK_WAIT_S,
        }
        if match:
            kwargs["body_filter"] = dict(match)
        if dead_letter:
            kwargs["dead_letter_subject"] = self.dead_letter_subject
        else:
            kwargs["on_reject"] = "nak"
        kwargs.update(options or {})
        return f"NatsJetStreamTrigger(**{kwargs!r})"

    async def publish(self, bodies: Sequence[Mapping[str, Any]], *, lane: int = 0) -> None:
        for body in bodies:
            await self.publish_raw(json.dumps(dict(body)).encode(), lane=lane)

    async def publish_raw(self, payload: bytes, *, lane: int = 0) -> None:
        assert 0 <= lane < self.lanes, lane
        js = await self._js()
        await js.publish(f"{self.name}.l{lane}", payload)  # returns once stored (its PubAck)

    async def unresolved(self) -> int:
        js = await self._js()
        try:
            info = await js.consumer_info(self.name, DURABLE)
        except NotFoundError:  # no watcher started yet: everything is still to deliver
            return int((await js.stream_info(self.name)).state.messages)
        return int(info.num_pending + info.num_ack_pending)

    async def dead_lettered(self) -> list[bytes]:
        js = await self._js()
        state = (await js.stream_info(self.dead_letter_stream)).state
        if state.messages == 0:
            return []
        return [
            (await js.get_msg(self.dead_letter_stream, seq)).data or b""
            for seq in range(state.first_seq, state.last_seq + 1)
        ]

    async def aclose(self) -> None:
        try:
            js = await self._js()
            for name in (self.name, self.dead_letter_stream):
                try:
                    await js.delete_stream(name)
                except NotFoundError:
                    pass
        finally:
            if self._nc is not None:
                await self._nc.close()


@asynccontextmanager
async def _stream(url: str, lanes: int) -> AsyncIterator[NatsKitStream]:
    stream = NatsKitStream(url, lanes=lanes)
    await stream.create()
    try:
        yield stream
    finally:
        await stream.aclose()


class PrivateNatsBroker:
    """A nats-server of one case's own; its streams outlive ``stop`` / ``start``."""

    def __init__(self) -> None:
        self.server = PrivateNats()

    def stream(self, *, lanes: int = 1) -> Any:
        return _stream(self.server.url, lanes)

    async def stop(self) -> None:
        await anyio.to_thread.run_sync(self.server.stop)

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self.server.start)


class NatsKit:
    kind = KIND
    cannot: Mapping[str, str] = {}
    #: an engine (re)opened the consumer / moved a message to the dead-letter stream
    consumer_actions = frozenset({"nats.connected", "nats.dead_lettered"})
    #: pull consumers of one durable never take messages or lanes from each other
    disturbed_actions: frozenset[str] = frozenset()

    def __init__(self, url: str) -> None:
        self.url = url

    def stream(self, *, lanes: int = 1) -> Any:
        return _stream(self.url, lanes)

    @asynccontextmanager
    async def private(self) -> AsyncIterator[PrivateNatsBroker]:
        private = PrivateNatsBroker()
        await private.start()
        try:
            yield private
        finally:
            await anyio.to_thread.run_sync(private.server.remove)

    def payload_n(self, payload: Mapping[str, Any]) -> int:
        return int(payload["body"]["n"])

    def dedup_prefix(self) -> str:
        return "nats:"


@contextmanager
def kit_broker(request: pytest.FixtureRequest) -> Iterator[NatsKit]:
    """The kit's NATS broker: the machine's nats-server (started if it does not answer)."""
    yield NatsKit(request.getfixturevalue("nats_url"))
