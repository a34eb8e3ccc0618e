"""What a broker gives the conformance kit: one adapter per shared-stream producer.

An adapter (``tests/conformance/broker_<kind>.py``) makes fresh, isolated streams on its real
broker (the machine's, or a private instance on a free port for the cases that stop the
broker), publishes the kit's messages, and says from the broker's side what is still
unresolved and what was dead-lettered. The kit's cases (``test_*.py``) never touch a client
library: they write DAG files with ``KitStream.watcher_source`` and run real engines.

The kit's messages are JSON objects ``{"n": <int>, "kind": <str>, ...}``: ``n`` is unique
within a stream (the kit's identity of a message, not the broker's), ``kind`` is what
sibling watchers filter on. A watcher built by ``watcher_source(match={"kind": "a"})``
fires once for every message whose top-level ``kind`` equals ``"a"`` (``match=None``: every
message); each event's payload holds the decoded body somewhere the kit can find ``n`` in
(``payload_n``).

A case a protocol cannot meet is listed in ``KitBroker.cannot`` with the reason; the kit
marks it xfail(strict=True) with that reason, never skips it silently.

How the kit finds an adapter: every module ``tests/conformance/broker_<kind>.py`` exports
``kit_broker(request: pytest.FixtureRequest) -> AbstractContextManager[KitBroker]`` (a
``contextlib.contextmanager``). The kit enters it once per test process, from a session
fixture parametrised over the modules found (``request.getfixturevalue`` reaches the
session's server fixtures, e.g. ``kafka_broker``); its exit cleans up. Adding a broker is
adding that one file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from contextlib import AbstractAsyncContextManager


class KitStream(Protocol):
    """One fresh upstream (topic, queue, stream, subject, topic filter) with its
    dead-letter place, made for one case and deleted by ``aclose``."""

    #: a name that appears in log lines and figures
    name: str
    #: how many ordering lanes it has (Kafka partitions, FIFO groups, subjects, ...): >= 1
    lanes: int

    def watcher_source(
        self,
        *,
        match: Mapping[str, Any] | None = None,
        dead_letter: bool = True,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        """Python source of one watcher's trigger for a DAG file, e.g.
        ``RabbitMQMessageTrigger(url="amqp://...", queue="...", body_filter={"kind": "a"})``.

        Every watcher built from one stream shares one ``shared_stream_key`` (one consumer).
        ``dead_letter``: a rejected message goes to the stream's dead-letter place (read by
        ``dead_lettered``); False: it stays with the broker, which delivers it again (Kafka:
        ``on_unclean="stop"``; SQS: ``on_reject="leave"``), as ``redelivery_dedup`` needs.
        ``options``: extra trigger keyword arguments a case needs (passed through as they
        are; the kit passes ``partition_key_field``)."""
        ...

    #: the import line(s) the DAG file needs for ``watcher_source``
    imports: str

    async def publish(self, bodies: Sequence[Mapping[str, Any]], *, lane: int = 0) -> None:
        """Publish each body as JSON, in order, on ``lane`` (0 <= lane < lanes); returns once
        the broker acknowledged every one (publisher confirms where the protocol has them)."""
        ...

    async def publish_raw(self, payload: bytes, *, lane: int = 0) -> None:
        """Publish bytes as they are (a poison payload: not JSON; the kit's is ASCII text,
        which every broker can carry)."""
        ...

    async def unresolved(self) -> int:
        """Messages the broker would still (re)deliver to the watchers' consumer: not yet
        acked / deleted / committed past, in flight included. 0 once the engine advanced
        the broker past everything published."""
        ...

    async def dead_lettered(self) -> list[bytes]:
        """The raw payloads in the stream's dead-letter place, in arrival order."""
        ...

    async def aclose(self) -> None:
        """Delete the stream, its dead-letter place and any consumer state."""
        ...


class PrivateBroker(Protocol):
    """A broker instance of the case's own, which the case may stop and start again (on the
    same port; durable state kept where the broker keeps it)."""

    def stream(self, *, lanes: int = 1) -> AbstractAsyncContextManager[KitStream]: ...

    async def stop(self) -> None:
        """Stop the broker process (the engine's connections break)."""
        ...

    async def start(self) -> None:
        """Start it again on the same port; returns when it accepts clients."""
        ...


class KitBroker(Protocol):
    """One broker kind under the kit."""

    #: "kafka", "sqs", "rabbitmq", "redis", "nats", "mqtt"
    kind: str
    #: case name -> why this broker's protocol cannot meet it (xfail strict, with the reason)
    cannot: Mapping[str, str]

    def stream(self, *, lanes: int = 1) -> AbstractAsyncContextManager[KitStream]:
        """A fresh stream on the machine's broker, deleted on exit."""
        ...

    def private(self) -> AbstractAsyncContextManager[PrivateBroker]:
        """A broker instance of the case's own on a free port, stopped on exit."""
        ...

    def payload_n(self, payload: Mapping[str, Any]) -> int:
        """The kit's ``n`` of the message an asset event's payload came from."""
        ...

    # Optional (read with ``getattr``, empty when absent), for ``zombie_owner``'s "never
    # acks, never rejoins": the JSON log ``action``s by which an engine shows it (re)opened
    # a consumer or advanced the broker (``consumer_actions``, e.g. Kafka's
    # ``kafka.partitions_assigned``; the zombie's log must hold none after it resumed), and
    # those by which the rightful owner shows another consumer disturbed it
    # (``disturbed_actions``, e.g. ``kafka.partitions_revoked``).
    #   consumer_actions: frozenset[str]
    #   disturbed_actions: frozenset[str]

    def dedup_prefix(self) -> str:
        """The prefix of every dedup key this broker's trigger gives (``kafka:``, ``sqs:``,
        ...): the kit checks that events are deduplicated by broker identity."""
        ...
