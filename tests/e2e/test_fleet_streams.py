"""A fleet of engines on one PostgreSQL serves a shared stream with one owner (issue 13).

One DAG file declares four watchers on one Kafka topic and consumer group (tansu), or on one
SQS queue (moto): three filter on a JSON field (``region`` eu / us / ap), one takes every
message; each watches its own asset. Every message carries a unique ``id`` and a region
(a quarter of them ``sa``, which only the catch-all takes), so each watcher's expected set
of ids is known.

- ``test_fleet_serves_every_watcher_once``: two ``sluice run`` engines with
  ``[triggerer] capacity = 2`` (which used to split the four rows two and two: each engine
  opened its own consumer, fanned a message out to its own two watchers only, and advanced
  the broker: the other two watchers never saw it), and, as the harness's sanity check, one
  engine with capacity 4. Produce everything, wait until the broker is fully advanced
  (Kafka: every partition committed to its high-water mark; SQS: nothing visible or in
  flight), then: per watcher exactly its expected ids, 0 lost, 0 duplicated; no offset ever
  committed before every asset event of the messages below it was stored; the four rows
  owned by one triggerer job; SQS: the queue and the dead-letter queue empty.
- ``test_fleet_owner_killed_mid_stream``: the same two engines; produce a first half in the
  background, SIGKILL the engine that owns the group once some events are stored, produce
  the second half; the survivor must take the whole group over (figures: seconds from the
  kill to the survivor owning the four rows, and to its first asset event), then every
  expected event is stored once (redeliveries are absorbed by the broker-derived dedup keys
  ``kafka:<topic>:<partition>:<offset>`` / ``sqs:<message id>``).

Every figure (messages, expected / stored / lost / duplicated events per watcher, owners,
commits, takeover seconds) is printed: run with ``pytest -s`` to see them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import textwrap
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from aiokafka import AIOKafkaProducer
from cryptography.fernet import Fernet
from sqlalchemy import func, select

from engine.db.database import Database
from engine.db.models import Asset, AssetEvent, Dag, Job, Trigger
from engine.states import TriggerKind
from engine.triggerer.triggerer import CLAIM_IDLE_INTERVAL_S
from tests.cli import invoke
from tests.e2e.helpers import engine_env, log_tail, start_engine, wait_for
from tests.services_kafka import FAST_GROUP, committed_offsets

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from pathlib import Path

    from tests.services_kafka import KafkaBroker
    from tests.services_sqs import SqsEndpoint

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.postgres]

HEARTBEAT_S = 1.0
THRESHOLD_S = 2.1 * HEARTBEAT_S
LOADED_MACHINE_MARGIN_S = 2.0  # as tests/e2e/test_engine_ha.py: claim commit, polling, load
TAKEOVER_BOUND_S = THRESHOLD_S + CLAIM_IDLE_INTERVAL_S + LOADED_MACHINE_MARGIN_S
CONSUMER_MARGIN_S = 10.0  # the survivor's consumer joins the group / long-polls the queue
SETTLE_S = 40.0  # every wait is bounded; the whole test stays well under a minute
STOP_S = 20.0

DAG_ID = "fleet_streams"
REGIONS = ("eu", "us", "ap", "sa")  # see region_of; no watcher filters "sa"
WATCHERS = ("eu", "us", "ap", "all")  # "all": the catch-all
PARTITIONS = 4
SQS_VISIBILITY_S = 5
FEED_CHUNK = 20  # the first half of the kill test: 20 messages every ~0.1 s
FEED_PAUSE_S = 0.05

DAG_FILE = """
from functools import reduce
from operator import or_

from engine import DAG, Asset, AssetWatcher, task
from producers import {trigger_class}

SETTINGS = {settings!r}
FILTERS = {filters!r}

assets = [
    Asset(
        f"fleet-{{name}}",
        watchers=[AssetWatcher(f"watch-{{name}}", {trigger_class}(**SETTINGS, **extra))],
    )
    for name, extra in FILTERS.items()
]


@task
def count_events(triggering_asset_events):
    return sum(len(events) for events in triggering_asset_events.values())


with DAG({dag_id!r}, schedule=reduce(or_, assets)):
    count_events()
"""


def message_id(i: int) -> str:
    return f"m{i:05d}"


def region_of(i: int) -> str:
    """Regions cycle every 4 messages in blocks, so that every Kafka partition (``i % 4``)
    carries every region: a watcher's messages never sit on one partition only."""
    return REGIONS[(i // PARTITIONS) % len(REGIONS)]


def expected_ids(indexes: Iterable[int]) -> dict[str, set[str]]:
    """Watcher -> the ids of the messages its filter accepts."""
    want: dict[str, set[str]] = {name: set() for name in WATCHERS}
    for i in indexes:
        want["all"].add(message_id(i))
        if region_of(i) in want:
            want[region_of(i)].add(message_id(i))
    return want


def body(i: int) -> str:
    return json.dumps({"id": message_id(i), "region": region_of(i)})


# -- the two brokers, behind one small interface ---------------------------------------------


@dataclass
class Progress:
    """How far the broker was advanced, read *before* the stored events it is checked with."""

    drained: bool  # advanced past everything produced so far
    advanced_ids: set[str] | None  # ids the broker advanced past (None: not observable)
    figures: str


class KafkaSide:
    """A fresh 4-partition topic and consumer group on the session's tansu broker."""

    name = "kafka"
    messages = 2000
    trigger_class = "KafkaMessageTrigger"

    def __init__(self, kafka: KafkaBroker) -> None:
        self.bootstrap = kafka.bootstrap
        self.topic = kafka.create_topic(PARTITIONS, prefix="fleet")
        self.group = f"fleet-{uuid.uuid4().hex[:8]}"
        self._coords: dict[str, tuple[int, int]] = {}  # id -> (partition, offset)
        self._lock = threading.Lock()

    def dag_settings(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        settings = {
            "topics": [self.topic],
            "bootstrap_servers": self.bootstrap,
            "group_id": self.group,
            "value_format": "json",
            "auto_offset_reset": "earliest",
            **FAST_GROUP,
        }
        filters = {r: {"match_fields": {"region": r}} for r in WATCHERS if r != "all"}
        return settings, {**filters, "all": {}}

    def produce(self, indexes: list[int]) -> dict[str, str]:
        """Send the messages (keys, explicit partitions); id -> its dedup key."""

        async def send() -> dict[str, tuple[int, int]]:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap, linger_ms=5, enable_idempotence=False
            )
            await producer.start()
            try:
                futures = [
                    (
                        message_id(i),
                        await producer.send(
                            self.topic,
                            value=body(i).encode(),
                            key=f"k{i}".encode(),
                            partition=i % PARTITIONS,
                        ),
                    )
                    for i in indexes
                ]
                return {mid: ((m := await f).partition, m.offset) for mid, f in futures}
            finally:
                await producer.stop()

        coords = asyncio.run(send())
        with self._lock:
            self._coords.update(coords)
        return {mid: f"kafka:{self.topic}:{p}:{o}" for mid, (p, o) in coords.items()}

    def payload_id(self, payload: Any) -> str:
        return str(payload["value"]["id"])

    def _high_water(self) -> dict[int, int]:
        with self._lock:
            coords = list(self._coords.values())
        marks = dict.fromkeys(range(PARTITIONS), 0)
        for p, o in coords:
            marks[p] = max(marks[p], o + 1)
        return marks

    def progress(self) -> Progress:
        committed = asyncio.run(
            committed_offsets(self.bootstrap, self.group, self.topic, PARTITIONS)
        )
        high = self._high_water()
        with self._lock:
            coords = dict(self._coords)
        advanced = {
            mid for mid, (p, o) in coords.items() if committed[p] is not None and o < committed[p]
        }
        drained = bool(coords) and all(committed[p] == high[p] for p in range(PARTITIONS))
        return Progress(drained, advanced, f"committed {committed} / high-water {high}")

    def final_checks(self) -> list[str]:
        return []  # drained is the committed == high-water check

    def close(self) -> None:
        pass


class SqsSide:
    """A fresh standard queue (visibility 5 s) and its dead-letter queue on moto."""

    name = "sqs"
    messages = 600
    trigger_class = "SqsMessageTrigger"

    def __init__(self, endpoint: SqsEndpoint) -> None:
        self.endpoint = endpoint
        self._client = boto3.client("sqs", **endpoint.client_kwargs())
        self._send_client = boto3.client("sqs", **endpoint.client_kwargs())
        name = f"fleet-{uuid.uuid4().hex[:16]}"
        self.url = self._client.create_queue(
            QueueName=name, Attributes={"VisibilityTimeout": str(SQS_VISIBILITY_S)}
        )["QueueUrl"]
        self.dlq = self._client.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
        self._sent = 0
        self._lock = threading.Lock()

    def dag_settings(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        settings = {
            "queue_url": self.url,
            **self.endpoint.client_kwargs(),
            "on_reject": "dead_letter",
            "dead_letter_queue_url": self.dlq,
            "visibility_timeout_s": SQS_VISIBILITY_S,
            "wait_time_s": 1,
        }
        filters = {r: {"body_filter": {"region": r}} for r in WATCHERS if r != "all"}
        return settings, {**filters, "all": {}}

    def produce(self, indexes: list[int]) -> dict[str, str]:
        out: dict[str, str] = {}
        for start in range(0, len(indexes), 10):
            chunk = indexes[start : start + 10]
            entries = [{"Id": str(n), "MessageBody": body(i)} for n, i in enumerate(chunk)]
            response = self._send_client.send_message_batch(QueueUrl=self.url, Entries=entries)
            assert not response.get("Failed"), response["Failed"]
            by_entry = {item["Id"]: item["MessageId"] for item in response["Successful"]}
            out.update({message_id(i): f"sqs:{by_entry[str(n)]}" for n, i in enumerate(chunk)})
        with self._lock:
            self._sent += len(out)
        return out

    def payload_id(self, payload: Any) -> str:
        return str(payload["body"]["id"])

    def _counts(self, url: str) -> tuple[int, int]:
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        got = self._client.get_queue_attributes(QueueUrl=url, AttributeNames=names)
        return int(got["Attributes"][names[0]]), int(got["Attributes"][names[1]])

    def progress(self) -> Progress:
        visible, in_flight = self._counts(self.url)
        with self._lock:
            sent = self._sent
        drained = sent > 0 and (visible, in_flight) == (0, 0)
        return Progress(drained, None, f"queue visible={visible} in flight={in_flight}")

    def final_checks(self) -> list[str]:
        problems = []
        if (main := self._counts(self.url)) != (0, 0):
            problems.append(f"queue not empty (visible, in flight) = {main}")
        if (dead := self._counts(self.dlq)) != (0, 0):
            problems.append(f"dead-letter queue not empty (visible, in flight) = {dead}")
        return problems

    def close(self) -> None:
        self._client.close()
        self._send_client.close()


Side = KafkaSide | SqsSide


@pytest.fixture(params=["kafka", "sqs"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    made: Side
    if request.param == "kafka":
        made = KafkaSide(request.getfixturevalue("kafka"))
    else:
        made = SqsSide(request.getfixturevalue("sqs_endpoint"))
    try:
        yield made
    finally:
        made.close()


# -- the fleet: engines on one PostgreSQL database --------------------------------------------


@dataclass
class Fleet:
    db: Database
    url: str
    tmp: Path
    fernet_key: str
    capacity: int
    engines: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def env(self, name: str) -> dict[str, str]:
        return engine_env(
            self.tmp / name,
            url=self.url,
            dags=self.tmp / "dags",
            parallelism=1,
            heartbeat_s=HEARTBEAT_S,
            SLUICE__CORE__FERNET_KEY=self.fernet_key,
            SLUICE__TRIGGERER__CAPACITY=str(self.capacity),
        )

    def start(self, count: int) -> None:
        for n in range(count):
            log = self.tmp / f"engine{n}.log"
            self.logs.append(log)
            self.engines.append(start_engine(self.env(f"engine{n}"), log))

    def stop_all(self) -> dict[int, int | None]:
        """SIGTERM every live engine at once (one signal: a second one forces the exit),
        then wait; pid -> exit code (None: had to be killed)."""
        for proc in self.engines:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: dict[int, int | None] = {}
        for proc in self.engines:
            try:
                codes[proc.pid] = proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes[proc.pid] = None
        return codes

    def tails(self) -> str:
        return "\n".join(f"--- {log.name}:\n{log_tail(log, 1500)}" for log in self.logs)


def write_dag(tmp: Path, side: Side) -> None:
    settings, filters = side.dag_settings()
    dags = tmp / "dags"
    dags.mkdir()
    source = DAG_FILE.format(
        trigger_class=side.trigger_class, settings=settings, filters=filters, dag_id=DAG_ID
    )
    (dags / "fleet_streams.py").write_text(textwrap.dedent(source))


def new_fleet(pg_url: str, tmp: Path, side: Side, *, capacity: int) -> Fleet:
    """A fleet on the (migrated) PostgreSQL database at ``pg_url``."""
    write_dag(tmp, side)
    db = Database(pg_url)
    return Fleet(db, pg_url, tmp, Fernet.generate_key().decode(), capacity)


def owners(db: Database) -> dict[int, int | None]:
    """Watcher trigger row id -> the triggerer job that owns it (None: unclaimed)."""
    query = select(Trigger.id, Trigger.triggerer_id).where(Trigger.kind == TriggerKind.WATCHER)
    return dict(db.call(lambda s: s.execute(query).all()))


def job_pids(db: Database) -> dict[int, int | None]:
    return dict(db.call(lambda s: s.execute(select(Job.id, Job.pid)).all()))


def stored_keys(db: Database) -> dict[str, list[str]]:
    """Watcher -> the dedup keys of its asset's events."""
    rows = db.call(
        lambda s: s.execute(
            select(Asset.name, AssetEvent.dedup_key).join(Asset, Asset.id == AssetEvent.asset_id)
        ).all()
    )
    keys: dict[str, list[str]] = {name: [] for name in WATCHERS}
    for asset, dedup_key in rows:
        keys[asset.removeprefix("fleet-")].append(dedup_key)
    return keys


def stored_payload_ids(db: Database, side: Side) -> dict[str, list[str]]:
    rows = db.call(
        lambda s: s.execute(
            select(Asset.name, AssetEvent.payload).join(Asset, Asset.id == AssetEvent.asset_id)
        ).all()
    )
    ids: dict[str, list[str]] = {name: [] for name in WATCHERS}
    for asset, payload in rows:
        ids[asset.removeprefix("fleet-")].append(side.payload_id(payload))
    return ids


def max_event_id(db: Database) -> int:
    return int(db.call(lambda s: s.execute(select(func.max(AssetEvent.id))).scalar() or 0))


def bring_up(fleet: Fleet, engines: int) -> dict[int, int | None]:
    """Start the engines, pause the DAG (no task runs: the test is about asset events), and
    wait until the four watcher rows are claimed; returns the owners then."""
    fleet.start(engines)
    wait_for(
        lambda: fleet.db.call(lambda s: s.execute(select(func.count()).select_from(Dag)).scalar()),
        timeout=30,
        what="the DAG file to be parsed",
    )
    paused = invoke("dags", "pause", DAG_ID, env=fleet.env("cli"))
    assert paused.returncode == 0, paused.stdout + paused.stderr

    def all_claimed() -> dict[int, int | None] | None:
        now = owners(fleet.db)
        done = len(now) == len(WATCHERS) and None not in now.values()
        return now if done else None

    return wait_for(all_claimed, timeout=30, what="the four watcher rows to be claimed")


@dataclass
class Tally:
    """What was produced and what the gating check saw while waiting."""

    keys: dict[str, str] = field(default_factory=dict)  # id -> dedup key
    gating_violations: set[tuple[str, str]] = field(default_factory=set)  # (watcher, id)
    final_owners: dict[int, int | None] = field(default_factory=dict)  # before the stop
    last_progress: Progress | None = None

    def poll(self, db: Database, side: Side, want: dict[str, set[str]]) -> bool:
        """One observation: broker progress first, then the stored events. A message the
        broker advanced past must already have every asset event it derives stored."""
        progress = side.progress()
        stored = {w: set(keys) for w, keys in stored_keys(db).items()}
        self.last_progress = progress
        if progress.advanced_ids is not None:
            for watcher, ids in want.items():
                for mid in ids & progress.advanced_ids:
                    if mid in self.keys and self.keys[mid] not in stored[watcher]:
                        self.gating_violations.add((watcher, mid))
        return progress.drained


def settle(
    fleet: Fleet,
    side: Side,
    tally: Tally,
    want: dict[str, set[str]],
    *,
    produced: Callable[[], tuple[bool, dict[str, str]]] | None = None,
) -> bool:
    """Wait until the broker is advanced past everything produced (then, by persistence
    gating, every asset event is stored); False on timeout (the figures still get printed).
    ``produced``: (production finished, id -> dedup key so far) when a feeder still runs."""

    def drained() -> bool:
        finished = True
        if produced is not None:
            finished, keys = produced()
            tally.keys.update(keys)
        return tally.poll(fleet.db, side, want) and finished

    try:
        wait_for(
            drained, timeout=SETTLE_S, what="the broker to be advanced past every message", step=0.2
        )
    except AssertionError:
        return False
    return True


def report(
    title: str, side: Side, fleet: Fleet, tally: Tally, want: dict[str, set[str]]
) -> tuple[dict[str, int], dict[str, int], dict[str, set[str]]]:
    """Print the figures; return lost and duplicated counts per watcher, unexpected ids."""
    got = stored_payload_ids(fleet.db, side)
    keys = stored_keys(fleet.db)
    lost, duplicated, unexpected = {}, {}, {}
    for watcher in WATCHERS:
        by_id, by_key = Counter(got[watcher]), Counter(keys[watcher])
        lost[watcher] = len(want[watcher] - set(by_id))
        duplicated[watcher] = sum(n - 1 for n in by_id.values()) + sum(
            n - 1 for n in by_key.values()
        )
        unexpected[watcher] = set(by_id) - want[watcher]
    pids = job_pids(fleet.db)
    tally.final_owners = owners(fleet.db)
    by_job = Counter(tally.final_owners.values())
    print(f"\n=== {title} [{side.name}]")
    print(f"messages produced: {len(tally.keys)}")
    for watcher in WATCHERS:
        print(
            f"  watcher {watcher:>3}: expected {len(want[watcher]):5d}  "
            f"stored {len(got[watcher]):5d}  lost {lost[watcher]:5d}  "
            f"duplicated {duplicated[watcher]:3d}  unexpected {len(unexpected[watcher])}"
        )
    print(f"total: lost {sum(lost.values())}, duplicated {sum(duplicated.values())}")
    print(
        "owners (job id/pid -> watcher rows): "
        + ", ".join(f"{job}/{pids.get(job) if job else None} -> {n}" for job, n in by_job.items())
    )
    print(f"broker: {tally.last_progress.figures if tally.last_progress else '(not read)'}")
    print(f"advanced before stored (watcher, id): {len(tally.gating_violations)}")
    return lost, duplicated, unexpected


def assert_clean(
    side: Side,
    fleet: Fleet,
    tally: Tally,
    want: dict[str, set[str]],
    *,
    settled: bool,
    lost: dict[str, int],
    duplicated: dict[str, int],
    unexpected: dict[str, set[str]],
) -> None:
    assert sum(lost.values()) == 0, f"asset events lost per watcher: {lost}"
    assert sum(duplicated.values()) == 0, f"asset events duplicated per watcher: {duplicated}"
    assert not any(unexpected.values()), f"events a filter should have refused: {unexpected}"
    assert not tally.gating_violations, (
        f"the broker was advanced past {len(tally.gating_violations)} (watcher, message) "
        f"pairs before their asset events were stored, e.g. {sorted(tally.gating_violations)[:5]}"
    )
    assert settled, f"the broker was never advanced past every message: {tally.last_progress}"
    assert not (problems := side.final_checks()), problems
    rows = tally.final_owners
    assert len(set(rows.values())) == 1 and None not in rows.values(), (
        f"the four watcher rows of one shared stream are split across triggerer jobs: {rows}"
    )


# -- the tests --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engines", "capacity"),
    [pytest.param(2, 2, id="two-engines-capacity-2"), pytest.param(1, 4, id="one-engine")],
)
def test_fleet_serves_every_watcher_once(
    side: Side, migrated_pg_url: str, tmp_path: Path, engines: int, capacity: int
) -> None:
    fleet = new_fleet(migrated_pg_url, tmp_path, side, capacity=capacity)
    indexes = list(range(side.messages))
    want = expected_ids(indexes)
    tally = Tally()
    try:
        at_claim = bring_up(fleet, engines)
        print(f"\nowners when the four rows were claimed (row -> job): {at_claim}")
        started = time.monotonic()
        tally.keys.update(side.produce(indexes))
        settled = settle(fleet, side, tally, want)
        print(f"settled: {settled} after {time.monotonic() - started:.1f}s")
        assert all(proc.poll() is None for proc in fleet.engines), fleet.tails()
        lost, duplicated, unexpected = report(
            f"{engines} engine(s), capacity {capacity}", side, fleet, tally, want
        )
    finally:
        codes = fleet.stop_all()
        fleet.db.dispose()
    assert_clean(
        side,
        fleet,
        tally,
        want,
        settled=settled,
        lost=lost,
        duplicated=duplicated,
        unexpected=unexpected,
    )
    assert all(code == 0 for code in codes.values()), (codes, fleet.tails())


class Feeder(threading.Thread):
    """Produces the first half in small paced chunks (the owner is killed while it flows),
    waits for ``go_on`` (the kill), then the second half: production goes on after the kill."""

    def __init__(self, side: Side, first: list[int], second: list[int]) -> None:
        super().__init__(daemon=True)
        self.side, self.halves = side, (first, second)
        self.go_on = threading.Event()
        self.done = threading.Event()
        self.keys: dict[str, str] = {}
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            first, second = self.halves
            self._feed(first, FEED_CHUNK, FEED_PAUSE_S)
            if self.go_on.wait(timeout=SETTLE_S):
                self._feed(second, 100, 0.0)
        except BaseException as exc:  # reported by the test thread
            self.error = exc
        finally:
            self.done.set()

    def _feed(self, indexes: list[int], chunk: int, pause_s: float) -> None:
        for start in range(0, len(indexes), chunk):
            produced = self.side.produce(indexes[start : start + chunk])
            with self._lock:
                self.keys.update(produced)
            time.sleep(pause_s)  # pacing of the producer, not a wait for the engine

    def produced(self) -> dict[str, str]:
        with self._lock:
            return dict(self.keys)


def test_fleet_owner_killed_mid_stream(side: Side, migrated_pg_url: str, tmp_path: Path) -> None:
    fleet = new_fleet(migrated_pg_url, tmp_path, side, capacity=2)
    indexes = list(range(side.messages))
    half = len(indexes) // 2
    want = expected_ids(indexes)
    kill_after = sum(len(ids) for ids in expected_ids(indexes[:half]).values()) // 5
    feeder = Feeder(side, indexes[:half], indexes[half:])
    tally = Tally()
    figures: dict[str, float] = {}
    settled = False
    lost: dict[str, int] = {}
    duplicated: dict[str, int] = {}
    unexpected: dict[str, set[str]] = {}
    try:
        at_claim = bring_up(fleet, 2)
        print(f"\nowners when the four rows were claimed (row -> job): {at_claim}")
        assert len(set(at_claim.values())) == 1, (
            f"the four watcher rows of one shared stream are split across triggerer jobs "
            f"(row -> job): {at_claim}; there is no single owner to kill"
        )
        owner_job = next(iter(at_claim.values()))
        assert owner_job is not None
        owner_pid = job_pids(fleet.db)[owner_job]
        victim = next(p for p in fleet.engines if p.pid == owner_pid)
        survivor = next(p for p in fleet.engines if p is not victim)

        feeder.start()
        wait_for(
            lambda: sum(len(k) for k in stored_keys(fleet.db).values()) >= kill_after,
            timeout=30,
            what=f"{kill_after} asset events stored before the kill",
        )
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        killed_at = time.monotonic()
        last_before = max_event_id(fleet.db)
        stored_at_kill = sum(len(k) for k in stored_keys(fleet.db).values())
        produced_at_kill = len(feeder.produced())
        feeder.go_on.set()
        print(
            f"killed the owner (pid {victim.pid}) with {produced_at_kill} messages produced "
            f"and {stored_at_kill} asset events stored"
        )

        def taken_over() -> bool:
            now = time.monotonic() - killed_at
            survivor_jobs = {j for j, pid in job_pids(fleet.db).items() if pid == survivor.pid}
            rows = owners(fleet.db)
            if "rows" not in figures and rows and set(rows.values()) <= survivor_jobs:
                figures["rows"] = now
            if "event" not in figures and max_event_id(fleet.db) > last_before:
                figures["event"] = now
            return "rows" in figures and "event" in figures

        wait_for(
            taken_over,
            timeout=TAKEOVER_BOUND_S + CONSUMER_MARGIN_S,
            what="the survivor to own the four rows and store a new asset event",
            step=0.05,
        )
        print(
            f"takeover: survivor owns the four rows {figures['rows']:.2f}s after the kill "
            f"(bound {TAKEOVER_BOUND_S:.1f}s), first new asset event after {figures['event']:.2f}s"
        )
        settled = settle(
            fleet, side, tally, want, produced=lambda: (feeder.done.is_set(), feeder.produced())
        )
        assert feeder.error is None, feeder.error
        lost, duplicated, unexpected = report("owner killed mid-stream", side, fleet, tally, want)
    finally:
        feeder.go_on.set()
        try:
            codes = fleet.stop_all()
        finally:
            fleet.db.dispose()
            if feeder.ident is not None:  # started
                feeder.join(timeout=SETTLE_S)
    assert_clean(
        side,
        fleet,
        tally,
        want,
        settled=settled,
        lost=lost,
        duplicated=duplicated,
        unexpected=unexpected,
    )
    assert codes[survivor.pid] == 0, fleet.tails()
