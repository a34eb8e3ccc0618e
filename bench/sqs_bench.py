"""SQS end-to-end throughput: watchers through the real triggerer vs a bare receive/delete loop.

Run by hand (never in tests):  .venv/bin/python bench/sqs_bench.py [--messages 2000]
                                   [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

A patched moto SQS server (tests/moto_launcher.py) is started on a free loopback port. Each
case preloads M messages into a fresh queue, then drains it:

* bare: one aiobotocore loop, ``ReceiveMessage`` (10, long poll) + ``DeleteMessageBatch``,
  from the first receive until M messages are deleted: what the broker allows.
* sluice N=1 / N=10: N ``SqsMessageTrigger`` watchers (no filter) on the queue, run by the
  real ``Triggerer`` in-process on SQLite (and PostgreSQL with ``--pg``), from the
  producer's connection (the group starts polling after a 0.5 s cohort grace, so all N
  watchers see every message) until all M x N asset events are committed and all M
  messages are deleted.

Figures: messages/s (M / seconds) and asset events/s, min / median / max of ``--repeat``
(>= 3) runs, each case alternating with the bare loop so both see the same load; the ratio
is of medians of the same run. What every broker bench shares is in ``broker_harness.py``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import broker_harness
from aiobotocore.session import get_session

from producers import SqsMessageTrigger

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Iterator

    from engine.triggerer.triggerer import Triggerer

REPO = Path(__file__).resolve().parent.parent
CREDENTIALS: dict[str, Any] = {
    "region_name": "us-east-1",
    "aws_access_key_id": "b",
    "aws_secret_access_key": "b",
}


# -- the server -------------------------------------------------------------------------


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.moto_launcher", "-H", "127.0.0.1", "-p", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1) as response:
                if response.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"moto did not start on {url}: install moto, flask and flask-cors")


async def new_queue(client: Any, messages: int) -> str:
    name = f"bench-{uuid.uuid4().hex[:12]}"
    url = str((await client.create_queue(QueueName=name))["QueueUrl"])
    for start in range(0, messages, 10):
        entries = [
            {"Id": str(i), "MessageBody": json.dumps({"n": n})}
            for i, n in enumerate(range(start, min(messages, start + 10)))
        ]
        await client.send_message_batch(QueueUrl=url, Entries=entries)
    return url


async def queue_empty(client: Any, url: str) -> bool:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    response = await client.get_queue_attributes(QueueUrl=url, AttributeNames=names)
    return all(response["Attributes"][name] == "0" for name in names)


# -- the bench --------------------------------------------------------------------------


class SqsBench(broker_harness.BrokerBench):
    """A source is (client, queue URL); "acked" is the queue holding nothing, visible or not."""

    kind = "sqs"

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    @property
    def where(self) -> str:
        return f"moto (patched) at {self.endpoint}"

    def _client(self) -> Any:
        return get_session().create_client("sqs", endpoint_url=self.endpoint, **CREDENTIALS)

    @contextlib.asynccontextmanager
    async def preloaded(self, messages: int) -> AsyncIterator[tuple[Any, str]]:
        async with self._client() as sqs:
            yield sqs, await new_queue(sqs, messages)

    def watcher(self, source: tuple[Any, str]) -> SqsMessageTrigger:
        _, url = source
        return SqsMessageTrigger(
            queue_url=url, endpoint_url=self.endpoint, wait_time_s=1, **CREDENTIALS
        )

    async def all_acked(self, source: tuple[Any, str], _t: Triggerer, _m: int) -> bool:
        return await queue_empty(*source)

    async def bare_loop(self, messages: int) -> float:
        async with self.preloaded(messages) as (sqs, url):
            started = time.perf_counter()
            deleted = 0
            while deleted < messages:
                response = await sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
                )
                batch = response.get("Messages", [])
                if batch:
                    entries = [
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(batch)
                    ]
                    await sqs.delete_message_batch(QueueUrl=url, Entries=entries)
                    deleted += len(batch)
            return time.perf_counter() - started


@contextlib.contextmanager
def open_bench(_args: argparse.Namespace) -> Iterator[SqsBench]:
    proc, endpoint = start_moto()
    try:
        yield SqsBench(endpoint)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    broker_harness.main(__doc__, open_bench)
