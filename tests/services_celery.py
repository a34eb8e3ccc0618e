"""Session fixtures: the Celery brokers, Redis and RabbitMQ (docs/tests.md: the servers).

The machine runs Redis on 127.0.0.1:6379 and RabbitMQ on 127.0.0.1:5672 (guest/guest). When
one does not answer, the fixture starts it from Debian's package on a free loopback port
(``redis-server``, ``rabbitmq-server``) or fails saying what is missing; it never skips.

Isolation: Redis database ``REDIS_DB`` and a RabbitMQ vhost of the session's own; each test
names its queues with a prefix of its own (``queue_prefix``), so tests of two pytest workers
never take each other's messages. ``restartable_broker`` is a broker a test may restart: a
private ``redis-server`` on a free port keeping nothing on disk, or the RabbitMQ application
(``rabbitmqctl stop_app`` / ``start_app``: the engine tests of another pytest worker on
RabbitMQ see the blip too, and survive it like any broker restart).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

REDIS_DB = 9
RABBIT_USER = "guest"
STARTUP_TIMEOUT_S = 30.0


def _answers(port: int, probe: bytes | None = None, expect: bytes = b"") -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            if probe is None:
                return True
            sock.sendall(probe)
            return sock.recv(64).startswith(expect)
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _need(program: str, package: str) -> str:
    path = shutil.which(program) or next(
        (p for p in (f"/usr/bin/{program}", f"/usr/sbin/{program}") if os.access(p, os.X_OK)),
        None,
    )
    if path is None:
        pytest.fail(
            f"the Celery tests need a broker and none answers: `{program}` is not installed "
            f"(apt-get install -y {package})"
        )
    return path


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, probe: bytes | None) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not _answers(port, probe, b"+PONG" if probe else b""):
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} before accepting connections")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{what} did not accept connections within {STARTUP_TIMEOUT_S}s")
        time.sleep(0.05)


class PrivateRedis:
    """A ``redis-server`` of one test on a free loopback port, nothing kept on disk."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<PrivateRedis port={self.port} running={self.proc is not None}>"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = _need("redis-server", "redis-server")
        command = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no"]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.proc, "redis-server", b"PING\r\n")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """Redis database ``REDIS_DB`` of the machine's Redis, or of one started here."""
    if _answers(6379, b"PING\r\n", b"+PONG"):
        yield f"redis://127.0.0.1:6379/{REDIS_DB}"
        return
    private = PrivateRedis()
    private.start()
    try:
        yield f"redis://127.0.0.1:{private.port}/{REDIS_DB}"
    finally:
        private.stop()


@dataclass
class _Rabbit:
    port: int
    ctl: list[str]

    def restart(self) -> None:
        """Stop the broker application and start it again (durable queues and persistent
        messages survive; connections do not)."""
        _rabbitmqctl(self.ctl, "stop_app")
        _rabbitmqctl(self.ctl, "start_app")
        _rabbitmqctl(self.ctl, "await_startup")
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _answers(self.port):
            if time.monotonic() > deadline:
                pytest.fail(f"RabbitMQ did not listen again within {STARTUP_TIMEOUT_S}s")
            time.sleep(0.05)


def _rabbitmqctl(ctl: list[str], *args: str) -> None:
    result = subprocess.run([*ctl, *args], capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        pytest.fail(f"rabbitmqctl {' '.join(args)} failed: {result.stderr.strip()[-500:]}")


@pytest.fixture(scope="session")
def _rabbit() -> _Rabbit:
    """The machine's RabbitMQ on 5672, started from Debian's package if it is down."""
    ctl = [_need("rabbitmqctl", "rabbitmq-server")]
    if not _answers(5672):
        server = _need("rabbitmq-server", "rabbitmq-server")
        subprocess.run([server, "-detached"], capture_output=True, timeout=60, check=False)
        deadline = time.monotonic() + 60
        while not _answers(5672):
            if time.monotonic() > deadline:
                pytest.fail(
                    "RabbitMQ does not answer on 127.0.0.1:5672 and `rabbitmq-server -detached` "
                    "did not bring it up within 60s (see /var/log/rabbitmq)"
                )
            time.sleep(0.2)
        _rabbitmqctl(ctl, "await_startup")
    return _Rabbit(5672, ctl)


@pytest.fixture(scope="session")
def rabbit_url(_rabbit: _Rabbit) -> Iterator[str]:
    """A RabbitMQ vhost of this session's own (deleted at the end)."""
    vhost = f"sluice-test-{uuid.uuid4().hex[:8]}"
    _rabbitmqctl(_rabbit.ctl, "add_vhost", vhost)
    _rabbitmqctl(_rabbit.ctl, "set_permissions", "-p", vhost, RABBIT_USER, ".*", ".*", ".*")
    try:
        yield f"amqp://{RABBIT_USER}:{RABBIT_USER}@127.0.0.1:{_rabbit.port}/{vhost}"
    finally:
        _rabbitmqctl(_rabbit.ctl, "delete_vhost", vhost)


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest) -> str:
    """Each broker in turn."""
    name = "redis_url" if request.param == "redis" else "rabbit_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
def queue_prefix() -> str:
    """A prefix for the queue names of one test."""
    return f"t{uuid.uuid4().hex[:8]}-"


@dataclass
class RestartableBroker:
    """A broker a test may restart mid-run: ``url`` and ``restart()``."""

    name: str
    url: str
    restart: Callable[[], None]


@pytest.fixture(params=["redis", "rabbitmq"])
def restartable_broker(request: pytest.FixtureRequest) -> Iterator[RestartableBroker]:
    """Redis: a private redis-server, killed and started empty again (it keeps nothing on
    disk). RabbitMQ: the session's broker application stopped and started again."""
    if request.param == "rabbitmq":
        rabbit: _Rabbit = request.getfixturevalue("_rabbit")
        yield RestartableBroker("rabbitmq", request.getfixturevalue("rabbit_url"), rabbit.restart)
        return
    redis = PrivateRedis()
    redis.start()

    def restart() -> None:
        redis.stop()
        redis.start()

    try:
        yield RestartableBroker("redis", redis.url, restart)
    finally:
        redis.stop()


def forget_queues(broker_url: str, queue_prefix: str) -> None:
    """Delete what the queues named ``queue_prefix...`` left in a Redis database (queue
    lists, kombu bindings); a RabbitMQ vhost goes whole at the end of the session."""
    if not broker_url.startswith("redis://"):
        return
    import redis

    client = redis.Redis.from_url(broker_url)
    try:
        keys = list(client.scan_iter(match=f"*{queue_prefix}*"))
        if keys:
            client.delete(*keys)
        # messages of a killed worker, never acknowledged: kombu's unacked hash and index
        tags = [
            tag for tag, message in client.hscan_iter("unacked") if queue_prefix.encode() in message
        ]
        if tags:
            client.hdel("unacked", *tags)
            client.zrem("unacked_index", *tags)
    finally:
        client.close()
