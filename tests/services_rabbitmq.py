"""Session fixture and helpers for the RabbitMQ event source (docs/tests.md: the servers).

``rabbitmq_url``: the machine's RabbitMQ (127.0.0.1:5672, guest/guest), started with
``rabbitmq-server -detached`` when it does not answer (``tests.services_celery._rabbit``),
failing the run, never skipping, when that does not work. Tests isolate themselves with
queues of their own (``rabbitmq_queues``: uniquely named, each with a dead-letter queue,
deleted afterwards). ``PrivateRabbitMQ`` is a node of a test's own on free ports, for the
tests that stop the broker (10 to 13 s to start here: ``stop_app`` / ``start_app`` restart
the broker inside it in 6 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aio_pika
import anyio.to_thread
import pytest

from tests.waiting import listening

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Mapping

    from tests.services_celery import _Rabbit

STARTUP_TIMEOUT_S = 60.0
_RABBIT_BIN = "/usr/lib/rabbitmq/bin"


@pytest.fixture(scope="session")
def rabbitmq_url(_rabbit: _Rabbit) -> str:
    """The machine's RabbitMQ, default virtual host."""
    return f"amqp://guest:guest@127.0.0.1:{_rabbit.port}/"


class RabbitQueues:
    """A test's client connection: makes queues (each with a dead-letter queue through the
    default exchange), publishes, counts and reads them back, deletes them at the end."""

    def __init__(self, channel: aio_pika.abc.AbstractChannel) -> None:
        self.channel = channel
        self.prefix = f"sluice-t{uuid.uuid4().hex[:10]}"
        self.made: list[str] = []
        self.exchanges: list[str] = []

    def __repr__(self) -> str:
        return f"<RabbitQueues prefix={self.prefix!r} made={len(self.made)}>"

    def name(self, suffix: str = "q") -> str:
        return f"{self.prefix}-{suffix}"

    async def make(
        self, suffix: str = "q", *, dead_letter: bool = True, **arguments: Any
    ) -> tuple[str, str | None]:
        """A durable queue (and its ``<name>.dlq``, bound through the default exchange)."""
        name = self.name(suffix)
        dlq = None
        if dead_letter:
            dlq = f"{name}.dlq"
            await self.channel.declare_queue(dlq, durable=True)
            self.made.append(dlq)
            arguments = {
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": dlq,
                **arguments,
            }
        await self.channel.declare_queue(name, durable=True, arguments=arguments or None)
        self.made.append(name)
        return name, dlq

    async def publish(
        self,
        queue: str,
        bodies: Iterable[Any],
        *,
        message_ids: bool = True,
        headers: Mapping[str, Any] | None = None,
    ) -> list[str | None]:
        """Publish each body (bytes as they are, anything else as JSON) with publisher
        confirms; returns the message ids set (None when ``message_ids`` is off: then
        py-amqp publishes, as aio-pika gives every message an id of its own)."""
        if not message_ids:
            await anyio.to_thread.run_sync(self._publish_without_ids, queue, list(bodies))
            return [None for _ in bodies]
        ids: list[str | None] = []
        for body in bodies:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            message_id = uuid.uuid4().hex if message_ids else None
            message = aio_pika.Message(
                raw,
                message_id=message_id,
                headers=dict(headers or {}),
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await self.channel.default_exchange.publish(message, routing_key=queue)
            ids.append(message_id)
        return ids

    def _publish_without_ids(self, queue: str, bodies: list[Any]) -> None:
        import amqp  # py-amqp (the celery extra's): it sets no message_id

        with amqp.Connection("127.0.0.1:5672", userid="guest", password="guest") as connection:
            channel = connection.channel()
            for body in bodies:
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                channel.basic_publish(amqp.Message(raw), exchange="", routing_key=queue)

    async def republish(
        self, queue: str, bodies: Iterable[Any], message_ids: list[str | None]
    ) -> None:
        """Publish ``bodies`` again with the message ids they had."""
        for body, message_id in zip(bodies, message_ids, strict=True):
            message = aio_pika.Message(json.dumps(body).encode(), message_id=message_id)
            await self.channel.default_exchange.publish(message, routing_key=queue)

    async def exchange(
        self, suffix: str, queue: str, *, routing_keys: Iterable[str]
    ) -> aio_pika.abc.AbstractExchange:
        """A direct exchange of this test, bound to ``queue`` under each routing key."""
        name = self.name(suffix)
        exchange = await self.channel.declare_exchange(name, aio_pika.ExchangeType.DIRECT)
        self.exchanges.append(name)
        for key in routing_keys:
            await (await self.channel.get_queue(queue)).bind(exchange, routing_key=key)
        return exchange

    async def publish_to(
        self, exchange: aio_pika.abc.AbstractExchange, routing_key: str, body: Any
    ) -> None:
        message = aio_pika.Message(json.dumps(body).encode(), message_id=uuid.uuid4().hex)
        await exchange.publish(message, routing_key=routing_key)

    async def ready(self, queue: str) -> int:
        """Messages ready in ``queue`` (deliveries in flight to a consumer not counted)."""
        declared = await self.channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count or 0)

    async def consumers(self, queue: str) -> int:
        declared = await self.channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.consumer_count or 0)

    async def drain(self, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
        """Take (and ack) every ready message of ``queue``."""
        taken = []
        q = await self.channel.declare_queue(queue, passive=True)
        while (message := await q.get(fail=False)) is not None:
            await message.ack()
            taken.append(message)
        return taken

    async def delete_all(self) -> None:
        for name in self.made:
            with contextlib.suppress(Exception):
                await self.channel.queue_delete(name)
        for name in self.exchanges:
            with contextlib.suppress(Exception):
                await self.channel.exchange_delete(name)


@pytest.fixture
async def rabbitmq_queues(rabbitmq_url: str) -> AsyncIterator[RabbitQueues]:
    connection = await aio_pika.connect(rabbitmq_url, timeout=10)
    try:
        channel = await connection.channel()
        queues = RabbitQueues(channel)
        try:
            yield queues
        finally:
            await queues.delete_all()
    finally:
        await connection.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return len(sock.recv(8)) > 0
    except OSError:
        return False


class PrivateRabbitMQ:
    """A RabbitMQ node of a test's own (``kit<port>@localhost``) on free AMQP and
    distribution ports, its data in a temporary directory, no plugins; ``stop`` / ``start``
    keep the data (durable queues and persistent messages survive)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"kit{self.port}@localhost"
        self.home = Path(tempfile.mkdtemp(prefix="sluice-rabbit-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.bin = _RABBIT_BIN  # Debian's /usr/sbin wrappers switch to the rabbitmq user
        self.start_seconds: list[float] = []
        self.stop_seconds: list[float] = []

    def __repr__(self) -> str:
        return f"<PrivateRabbitMQ node={self.node} running={self.proc is not None}>"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def env(self) -> dict[str, str]:
        plugins = self.home / "enabled_plugins"
        if not plugins.exists():
            plugins.write_text("[].\n")
        config = self.home / "rabbitmq.conf"  # not the machine's (it names port 5672)
        if not config.exists():
            config.write_text(f"listeners.tcp.1 = 127.0.0.1:{self.port}\n")
        return {
            **os.environ,
            "HOME": str(self.home),  # its own Erlang cookie, for the server and rabbitmqctl
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.home / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.home / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_CONFIG_FILE": str(config),
            "RABBITMQ_PID_FILE": str(self.home / "pid"),
            "RABBITMQ_SERVER_START_ARGS": "-kernel inet_dist_listen_min "
            f"{self.dist_port} -kernel inet_dist_listen_max {self.dist_port}",
        }

    def start(self) -> None:
        server = f"{self.bin}/rabbitmq-server"  # as root: the rabbitmq user cannot write here
        if not os.access(server, os.X_OK):
            pytest.fail(
                "a private RabbitMQ needs rabbitmq-server (apt-get install rabbitmq-server)"
            )
        began = time.monotonic()
        with (self.home / "server.out").open("ab") as log:
            self.proc = subprocess.Popen(
                [server], env=self.env(), stdout=log, stderr=subprocess.STDOUT
            )
        left = began + STARTUP_TIMEOUT_S - time.monotonic()
        if not listening(lambda: _answers(self.port), timeout=left, proc=self.proc, step=0.1):
            if self.proc.poll() is not None:
                pytest.fail(f"private RabbitMQ {self.node} exited with {self.proc.returncode}")
            self.stop()
            pytest.fail(f"private RabbitMQ {self.node} did not listen in {STARTUP_TIMEOUT_S}s")
        self.start_seconds.append(time.monotonic() - began)

    def stop(self) -> None:
        """SIGTERM to ``rabbitmq-server``, which stops the node gracefully (its own trap);
        SIGKILL to the node (its pid file) if that takes too long."""
        if self.proc is None:
            return
        began = time.monotonic()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pid = (self.home / "pid").read_text().strip()
            if pid.isdigit():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None
        self.stop_seconds.append(time.monotonic() - began)

    def ctl(self, *args: str) -> None:
        """``rabbitmqctl -n <node> ...``; fails the test when it fails."""
        command = [f"{self.bin}/rabbitmqctl", "-n", self.node, *args]
        result = subprocess.run(
            command, env=self.env(), capture_output=True, text=True, timeout=60, check=False
        )
        if result.returncode != 0:
            pytest.fail(f"rabbitmqctl {' '.join(args)} on {self.node}: {result.stderr[-500:]}")

    def stop_app(self) -> None:
        """Stop the broker application, the Erlang node staying up: the AMQP port closes,
        every connection breaks, what is durable stays on disk (2.5 s here, where stopping
        and starting the whole node takes 1 s + 10 to 13 s)."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        """Start the broker application again (4 s here); returns once it listens."""
        self.ctl("start_app")
        if not listening(lambda: _answers(self.port), timeout=STARTUP_TIMEOUT_S):
            pytest.fail(f"private RabbitMQ {self.node} did not listen again")

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)


@contextlib.asynccontextmanager
async def tcp_proxy(target_port: int) -> AsyncIterator[tuple[int, Callable[[], None]]]:
    """A loopback TCP proxy to ``target_port``; ``cut()`` closes every proxied connection
    (the client sees its broker go away; the broker sees its client go away)."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def pipe(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            async for chunk in source:
                await sink.send(chunk)

    async def handle(client: anyio.abc.SocketStream) -> None:
        async with client, await anyio.connect_tcp("127.0.0.1", target_port) as upstream:
            async with anyio.create_task_group() as pipes:
                pipes.start_soon(pipe, client, upstream)
                await pipe(upstream, client)
                pipes.cancel_scope.cancel()

    serving = anyio.CancelScope()

    async def serve() -> None:
        with serving:
            async with listener:
                await listener.serve(handle)

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        try:
            yield port, serving.cancel
        finally:
            tg.cancel_scope.cancel()
