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
is of medians of the same run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from aiobotocore.session import get_session
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, insert, text

from engine.crypto import KwargsCipher
from engine.db.database import Database
from engine.db.models import Asset, AssetWatcher
from engine.db.queries import triggers as trigger_rows
from engine.db.schema import migrate
from engine.states import TriggerKind
from engine.triggerer.triggerer import Triggerer, TriggererSettings
from producers import SqsMessageTrigger

if TYPE_CHECKING:
    from engine.triggerer.persister import BatchResult

REPO = Path(__file__).resolve().parent.parent
CREDENTIALS = {"region_name": "us-east-1", "aws_access_key_id": "b", "aws_secret_access_key": "b"}
COHORT_GRACE_S = 0.5


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


# -- the cases --------------------------------------------------------------------------


async def bare_loop(endpoint: str, messages: int) -> dict[str, float]:
    async with get_session().create_client("sqs", endpoint_url=endpoint, **CREDENTIALS) as sqs:
        url = await new_queue(sqs, messages)
        started = time.perf_counter()
        deleted = 0
        while deleted < messages:
            response = await sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            )
            batch = response.get("Messages", [])
            if batch:
                entries = [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)
                ]
                await sqs.delete_message_batch(QueueUrl=url, Entries=entries)
                deleted += len(batch)
        seconds = time.perf_counter() - started
    return {"watchers": 0, "seconds": seconds, "msgs_per_s": messages / seconds}


class _ConnectedAt(logging.Handler):
    """Records when the SQS producer connected (its next step is the first receive)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", None) == "sqs.connected" and self.at is None:
            self.at = time.perf_counter()


def seed(db: Database, cipher: KwargsCipher, endpoint: str, url: str, watchers: int) -> None:
    def insert_rows(session: Any) -> None:
        for i in range(watchers):
            asset_id = session.execute(
                insert(Asset)
                .values(name=f"a{i}", uri=f"bench://a{i}", extra={})
                .returning(Asset.id)
            ).scalar_one()
            trigger = SqsMessageTrigger(
                queue_url=url, endpoint_url=endpoint, wait_time_s=1, **CREDENTIALS
            )
            classpath, kwargs = trigger.serialize()
            tid = trigger_rows.add_trigger_row(
                session, cipher, classpath, kwargs, kind=TriggerKind.WATCHER
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )

    db.call(insert_rows)


async def through_triggerer(
    endpoint: str, db_url: str, messages: int, watchers: int
) -> dict[str, float]:
    db = Database(db_url)
    migrate(db.engine)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    connected = _ConnectedAt()
    logging.getLogger("producers.sqs").addHandler(connected)
    logging.getLogger("producers.sqs").setLevel(logging.INFO)
    expected = messages * watchers
    committed = 0
    all_committed = anyio.Event()

    def on_committed(result: BatchResult) -> None:
        nonlocal committed
        committed += result.asset_events
        if committed >= expected:
            all_committed.set()

    try:
        async with get_session().create_client("sqs", endpoint_url=endpoint, **CREDENTIALS) as sqs:
            url = await new_queue(sqs, messages)
            seed(db, cipher, endpoint, url, watchers)
            settings = TriggererSettings(
                capacity=100,
                heartbeat_s=5,
                claim_idle_interval_s=0.05,
                cohort_grace_period_s=COHORT_GRACE_S,
            )
            triggerer = Triggerer(
                db=db, cipher=cipher, settings=settings, on_committed=on_committed
            )
            async with anyio.create_task_group() as tg:
                await tg.start(triggerer.run)
                await all_committed.wait()
                while True:  # the last deletes follow the last commit within milliseconds
                    if await queue_empty(sqs, url):
                        break
                    await anyio.sleep(0.01)
                finished = time.perf_counter()
                triggerer.shutdown()
        assert committed == expected, f"{committed} asset events, expected {expected}"
        assert connected.at is not None
        seconds = finished - connected.at
        return {
            "watchers": watchers,
            "seconds": seconds,
            "msgs_per_s": messages / seconds,
            "events_per_s": expected / seconds,
        }
    finally:
        logging.getLogger("producers.sqs").removeHandler(connected)
        db.dispose()


def pg_database(admin_url: str) -> tuple[str, Any]:
    name = f"sqs_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return f"{admin_url.rsplit('/', 1)[0]}/{name}", drop


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 1),
        "median": round(statistics.median(values), 1),
        "max": round(max(values), 1),
    }


async def _case(endpoint: str, messages: int, backend: str, watchers: int, pg: str | None) -> Any:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            return await through_triggerer(endpoint, f"sqlite:///{tmp}/q.db", messages, watchers)
    assert pg is not None
    db_url, drop = pg_database(pg)
    try:
        return await through_triggerer(endpoint, db_url, messages, watchers)
    finally:
        drop()


async def run_all(
    endpoint: str, messages: int, pg: str | None, repeat: int
) -> dict[str, dict[str, Any]]:
    """Each case alternates with the bare loop ``repeat`` times (same load for both)."""
    backends = ["sqlite"] + (["postgres"] if pg else [])
    results: dict[str, dict[str, Any]] = {}
    for backend in backends:
        for watchers in (1, 10):
            bare, ours, events = [], [], []
            for _ in range(repeat):
                bare.append((await bare_loop(endpoint, messages))["msgs_per_s"])
                fig = await _case(endpoint, messages, backend, watchers, pg)
                ours.append(fig["msgs_per_s"])
                events.append(fig["events_per_s"])
            results[f"{backend}_n{watchers}"] = {
                "watchers": watchers,
                "msgs_per_s": _spread(ours),
                "events_per_s": _spread(events),
                "bare_msgs_per_s": _spread(bare),
                "ratio_of_medians": round(statistics.median(ours) / statistics.median(bare), 3),
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000, help="messages per case")
    parser.add_argument("--pg", default=None, help="PostgreSQL admin URL (a db per case)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per figure (>= 3)")
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3 (min/median/max of >= 3 runs)")
    proc, endpoint = start_moto()
    load = os.getloadavg()
    try:
        results = anyio.run(run_all, endpoint, args.messages, args.pg, args.repeat)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"{args.messages} messages per case, moto (patched) at {endpoint}, x{args.repeat}")
    for name, fig in results.items():
        ours, bare, events = fig["msgs_per_s"], fig["bare_msgs_per_s"], fig["events_per_s"]
        print(
            f"{name:12s} {ours['median']:8.0f} msgs/s [{ours['min']:.0f}..{ours['max']:.0f}]  "
            f"{events['median']:8.0f} asset events/s   bare loop {bare['median']:.0f} "
            f"[{bare['min']:.0f}..{bare['max']:.0f}]  ratio {fig['ratio_of_medians']:.2f}"
        )
    out = Path(__file__).parent / "results" / "sqs.json"
    machine = {"cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load]}
    document = {"messages": args.messages, "repetitions": args.repeat, "machine": machine}
    out.write_text(json.dumps({**document, **results}, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
