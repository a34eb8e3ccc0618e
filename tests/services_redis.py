"""Session fixtures: Redis Streams for the event-source tests (docs/tests.md: the servers).

The machine runs Redis on 127.0.0.1:6379, keeping nothing on disk. When it does not answer,
the fixture starts it with the machine's own command (``../shared/SERVICES.md``) and fails,
never skips, saying what is missing if that does not work. Isolation: database
``STREAMS_DB`` (the Celery tests use 9) and stream names of each test's own
(``redis_stream_name``), deleted afterwards with their dead streams.

``PrivateRedisServer`` is a ``redis-server`` of one test on a free loopback port, which the
test may stop and start again: it keeps its data in an append-only file of a temporary
directory, so a restart keeps the streams and their consumer groups.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.waiting import listening

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

STREAMS_DB = 11
MACHINE_PORT = 6379
STARTUP_TIMEOUT_S = 20.0
MACHINE_COMMAND = [
    "redis-server",
    "--daemonize",
    "yes",
    "--bind",
    "127.0.0.1",
    "-::1",
    "--port",
    str(MACHINE_PORT),
    "--save",
    "",
    "--appendonly",
    "no",
    "--dir",
    "/var/lib/redis",
    "--logfile",
    "/var/log/redis/ci.log",
]


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_binary() -> str:
    binary = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if binary is None:
        pytest.fail(
            "the Redis Streams tests need a Redis server and none answers on 127.0.0.1:6379: "
            "`redis-server` is not installed (apt-get install -y redis-server)"
        )
    return binary


def _wait_answers(port: int, what: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    if not listening(lambda: answers(port), timeout=STARTUP_TIMEOUT_S, proc=proc):
        exited = proc is not None and proc.poll() is not None
        pytest.fail(
            f"{what} exited with {proc and proc.returncode} before accepting connections"
            if exited
            else f"{what} did not answer PING within {STARTUP_TIMEOUT_S}s"
        )


@pytest.fixture(scope="session")
def redis_streams_url() -> str:
    """Database ``STREAMS_DB`` of the machine's Redis (started if it is down)."""
    if not answers(MACHINE_PORT):
        command = [redis_server_binary(), *MACHINE_COMMAND[1:]]
        done = subprocess.run(command, capture_output=True, check=False, timeout=30)
        if done.returncode != 0:
            pytest.fail(
                f"the machine's Redis is down and `{' '.join(MACHINE_COMMAND)}` failed "
                f"({done.returncode}): {done.stderr.decode(errors='replace').strip()}"
            )
        _wait_answers(MACHINE_PORT, "the machine's redis-server")
    return f"redis://127.0.0.1:{MACHINE_PORT}/{STREAMS_DB}"


@pytest.fixture
def redis_stream_name() -> str:
    """A stream name of this test's own (its dead stream is ``<name>:dead``)."""
    return f"sluice-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis_client(redis_streams_url: str, redis_stream_name: str) -> AsyncIterator[Any]:
    """A client on the tests' database; afterwards deletes every key named after this
    test's ``redis_stream_name`` (its streams, dead streams, ...)."""
    import redis.asyncio as redis_asyncio

    client = redis_asyncio.Redis.from_url(redis_streams_url)
    try:
        yield client
    finally:
        keys = [key async for key in client.scan_iter(match=f"{redis_stream_name}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


class PrivateRedisServer:
    """A ``redis-server`` of one test on a free loopback port; ``stop()`` / ``start()``
    keep its data (append-only file in a temporary directory)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            str(self.dir),
        ]

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait_answers(self.port, f"private redis-server on port {self.port}", self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"<PrivateRedisServer port={self.port} running={self.proc is not None}>"


@pytest.fixture
def private_redis() -> Iterator[PrivateRedisServer]:
    server = PrivateRedisServer()
    server.start()
    try:
        yield server
    finally:
        server.remove()
