"""Session fixture: a moto SQS server on a free loopback port (docs/tests.md: the servers).

Started as ``python -m tests.moto_launcher`` (moto's server with its slow SQS helpers
patched), ready when ``GET /moto-api/`` answers 200, stopped at the end of the session. A
server that cannot start fails the run; it is never skipped. Tests isolate themselves with
uniquely named queues (``sqs_queue_name``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

STARTUP_TIMEOUT_S = 20.0
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class SqsEndpoint:
    """A running moto server: its URL and the client settings that work with it."""

    url: str
    region_name: str = "us-east-1"
    aws_access_key_id: str = "testing"
    aws_secret_access_key: str = "testing"

    def client_kwargs(self) -> dict[str, str]:
        return {
            "endpoint_url": self.url,
            "region_name": self.region_name,
            "aws_access_key_id": self.aws_access_key_id,
            "aws_secret_access_key": self.aws_secret_access_key,
        }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/moto-api/", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_moto(
    log: Path, *, port: int | None = None, queues: dict[str, dict[str, str]] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the patched moto server (on ``port``, else a free one; with ``queues``, name ->
    attributes, created before it serves); fail (never skip) if it does not answer in time."""
    port = port or _free_port()
    env = {**os.environ, "SLUICE_TEST_MOTO_QUEUES": json.dumps(queues)} if queues else None
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.moto_launcher", "-H", "127.0.0.1", "-p", str(port)],
            cwd=REPO,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not _answers(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_moto(proc)
            pytest.fail(
                f"the moto SQS server did not start on {url} (exit code {proc.returncode}); "
                f"its output is in {log}. It needs the packages moto, flask and flask-cors "
                "(the dev group: `make .venv/.installed`, as `make test` does)",
                pytrace=False,
            )
        time.sleep(0.05)
    return proc, url


def stop_moto(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def sqs_endpoint() -> Iterator[SqsEndpoint]:
    """The session's moto SQS server."""
    folder = Path(tempfile.mkdtemp(prefix="moto-"))
    proc, url = start_moto(folder / "moto.log")
    try:
        yield SqsEndpoint(url=url)
    finally:
        stop_moto(proc)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def sqs_queue_name() -> str:
    """A queue name no other test uses (add ``.fifo`` for a FIFO queue)."""
    return f"t-{uuid.uuid4().hex[:20]}"


# -- client-side helpers (an aiobotocore SQS client) -----------------------------------------


async def create_queue(client: Any, name: str, **attributes: Any) -> str:
    """Create a queue; attribute values may be ints or dicts (JSON-encoded)."""
    encoded = {k: v if isinstance(v, str) else json.dumps(v) for k, v in attributes.items()}
    if name.endswith(".fifo"):
        encoded.setdefault("FifoQueue", "true")
    response = await client.create_queue(QueueName=name, Attributes=encoded)
    return str(response["QueueUrl"])


async def queue_arn(client: Any, url: str) -> str:
    response = await client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return str(response["Attributes"]["QueueArn"])


async def send_messages(client: Any, url: str, entries: Iterable[dict[str, Any]]) -> list[str]:
    """Send ``SendMessageBatch`` entries (without ``Id``) in batches of ten; message ids."""
    pending = list(entries)
    ids: list[str] = []
    for start in range(0, len(pending), 10):
        chunk = [{"Id": str(i), **e} for i, e in enumerate(pending[start : start + 10])]
        response = await client.send_message_batch(QueueUrl=url, Entries=chunk)
        assert not response.get("Failed"), response["Failed"]
        by_id = {item["Id"]: item["MessageId"] for item in response["Successful"]}
        ids.extend(by_id[str(i)] for i in range(len(chunk)))
    return ids


async def queue_counts(client: Any, url: str) -> tuple[int, int]:
    """(visible, in flight) messages of the queue."""
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    response = await client.get_queue_attributes(QueueUrl=url, AttributeNames=names)
    attributes = response["Attributes"]
    return int(attributes[names[0]]), int(attributes[names[1]])


async def receive_all(client: Any, url: str) -> list[dict[str, Any]]:
    """Receive (and delete) every visible message, until a receive comes back empty."""
    received: list[dict[str, Any]] = []
    while True:
        response = await client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        )
        messages = response.get("Messages", [])
        if not messages:
            return received
        received.extend(messages)
        entries = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ]
        await client.delete_message_batch(QueueUrl=url, Entries=entries)
