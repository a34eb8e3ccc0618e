"""Session fixture: NATS with JetStream (docs/tests.md: the servers).

The machine runs ``nats-server -js`` on 127.0.0.1:4222 (``../shared/SERVICES.md``). When it
does not answer, the fixture starts it with the machine's own command, or fails saying what
is missing; it never skips. Tests isolate themselves with streams of their own
(``nats_stream_name``), deleted afterwards.

``PrivateNats`` is a ``nats-server -js`` of one test on a free loopback port, its store in a
directory of its own (kept across ``stop`` / ``start``), optionally requiring a user and a
password: for tests that stop the broker or need credentials.
"""

from __future__ import annotations

import contextlib
import os
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

NATS_URL = "nats://127.0.0.1:4222"
NATS_SERVER = "/usr/sbin/nats-server"
STARTUP_TIMEOUT_S = 15.0
_MACHINE_COMMAND = [
    "start-stop-daemon",
    "--start",
    "--oknodo",
    "--background",
    "--exec",
    NATS_SERVER,
    "--",
    "-a",
    "127.0.0.1",
    "-p",
    "4222",
    "-js",
    "-sd",
    "/var/lib/nats-server",
    "-l",
    "/var/log/nats-server.log",
]


def answers(port: int, host: str = "127.0.0.1") -> bool:
    """A NATS server greets every client with an ``INFO`` line."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            return sock.recv(4).startswith(b"INFO")
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_answering(port: int, what: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    if not listening(lambda: answers(port), timeout=STARTUP_TIMEOUT_S, proc=proc):
        exited = proc is not None and proc.poll() is not None
        pytest.fail(
            f"{what} exited with {proc and proc.returncode} before accepting clients"
            if exited
            else f"{what} did not accept clients on port {port} in {STARTUP_TIMEOUT_S}s"
        )


@pytest.fixture(scope="session")
def nats_url() -> str:
    """The machine's NATS JetStream server, started if it does not answer."""
    if answers(4222):
        return NATS_URL
    if not os.access(NATS_SERVER, os.X_OK) or shutil.which("start-stop-daemon") is None:
        pytest.fail(
            f"NATS does not answer on {NATS_URL} and {NATS_SERVER} (or start-stop-daemon) is "
            "missing: apt-get install -y nats-server (see ../shared/SERVICES.md)"
        )
    subprocess.run(_MACHINE_COMMAND, check=False, timeout=STARTUP_TIMEOUT_S)
    _wait_answering(4222, "the machine's nats-server")
    return NATS_URL


@pytest.fixture
def nats_stream_name() -> str:
    """A stream name no other test uses (its subjects: ``<name>.>``)."""
    return f"T{uuid.uuid4().hex[:16]}"


class PrivateNats:
    """A ``nats-server -js`` of one test on a free port; ``user`` / ``password`` required
    when given. Its store (``store_dir``) survives ``stop`` / ``start``."""

    def __init__(self, *, user: str | None = None, password: str | None = None) -> None:
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="nats-"))
        self.user = user
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        command = [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-js"]
        command += ["-sd", str(self.folder / "store")]
        if self.user is not None:
            command += ["--user", self.user, "--pass", str(self.password)]
        return command

    def start(self) -> None:
        if not os.access(NATS_SERVER, os.X_OK):
            pytest.fail(f"{NATS_SERVER} is missing: apt-get install -y nats-server")
        with (self.folder / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT)
        _wait_answering(
            self.port, f"a private nats-server (log {self.folder}/server.log)", self.proc
        )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __repr__(self) -> str:
        return f"<PrivateNats {self.url} running={self.proc is not None}>"


@pytest.fixture
def private_nats() -> Iterator[PrivateNats]:
    server = PrivateNats()
    server.start()
    try:
        yield server
    finally:
        server.remove()


# -- client-side helpers (nats-py) ------------------------------------------------------------


async def connect(url: str = NATS_URL, **kwargs: Any) -> Any:
    import nats

    return await nats.connect(url, allow_reconnect=False, **kwargs)


@contextlib.asynccontextmanager
async def jetstream_streams(
    nc: Any, name: str, *, dead_letter: bool = True
) -> AsyncIterator[tuple[str, str | None]]:
    """Create stream ``name`` on ``<name>.>`` (and ``<name>_DLQ`` on ``dlq.<name>``); yield
    (subjects pattern, dead-letter subject); delete both afterwards."""
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    dlq = f"dlq.{name}" if dead_letter else None
    if dlq is not None:
        await js.add_stream(name=f"{name}_DLQ", subjects=[dlq])
    try:
        yield f"{name}.>", dlq
    finally:
        for stream in (name, f"{name}_DLQ"):
            try:
                await js.delete_stream(stream)
            except Exception:
                pass


async def read_all(nc: Any, stream: str) -> list[Any]:
    """Every message stored in ``stream`` in order (by direct get; the stream is unchanged)."""
    js = nc.jetstream()
    info = await js.stream_info(stream)
    messages = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        if info.state.messages == 0:
            break
        messages.append(await js.get_msg(stream, seq))
    return messages
