"""The metrics collector: real parts' counters, read at scrape time, as Prometheus families."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from cryptography.fernet import Fernet
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from sqlalchemy import insert

from engine.authoring.assets import Asset as AssetCondition
from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.models import Asset, Dag, DagScheduleAsset, DagTask
from engine.db.queries import assets
from engine.executor import local as executor_module
from engine.executor.local import LocalExecutor
from engine.executor.settings import ExecutorSettings
from engine.metrics import (
    Buckets,
    EngineCollector,
    EngineReading,
    HistogramReading,
    TriggererReading,
    families,
)
from engine.scheduler.scheduler import Scheduler, SchedulerSettings
from engine.states import TriggerKind
from engine.triggerer.outbox import FiredEvent
from engine.triggerer.runtime import TriggerSpec
from engine.triggerer.settings import TriggererSettings
from engine.triggerer.triggerer import Triggerer
from shared_stream.stats import KEY_LABEL_MAX_CHARS, REPORTED_LANES, GroupStats, key_label
from tests.waiting import wait_until
from triggers.base import TriggerEvent
from triggers.file import DirectoryFileDeleteTrigger

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from pathlib import Path

    from prometheus_client.core import Metric

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def exposition(metrics: Iterable[Metric]) -> Samples:
    """Render through the real exposition format and parse it back."""

    class Fixed(Collector):
        def collect(self) -> Iterator[Metric]:
            yield from metrics

    registry = CollectorRegistry()
    registry.register(Fixed())
    return parse(generate_latest(registry).decode())


def scrape(collector: EngineCollector) -> Samples:
    registry = CollectorRegistry()
    registry.register(collector)
    return parse(generate_latest(registry).decode())


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


@pytest.fixture
def db(migrated_sqlite_url: str) -> Iterator[Database]:
    database = Database(migrated_sqlite_url)
    yield database
    database.dispose()


def make_triggerer(db: Database, capacity: int = 10) -> Triggerer:
    cipher = KwargsCipher(Fernet.generate_key().decode())
    return Triggerer(db=db, cipher=cipher, settings=TriggererSettings(capacity=capacity))


async def test_triggerer_counters_and_shared_stream_groups_at_scrape_time(
    db: Database, tmp_path: Path
) -> None:
    """Two watchers share one directory poll; one fires; the scrape shows all of it."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    triggerer = make_triggerer(db, capacity=10)
    collector = EngineCollector()
    collector.triggerer = triggerer
    watchers = [
        DirectoryFileDeleteTrigger(directory=str(inbox), filename=name, poke_interval=0.02)
        for name in ("a.flag", "b.flag")
    ]
    stream_key = watchers[0].shared_stream_key()
    key = repr(stream_key)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.shared_streams.run)
            await tg.start(triggerer.runner.run)
            tg.start_soon(triggerer.persister.run)
            for trigger_id, trigger in enumerate(watchers, start=1):
                triggerer.runner.start(TriggerSpec(trigger_id, trigger, TriggerKind.WATCHER))
            await wait_until(lambda: triggerer.shared_streams.subscriber_count(stream_key) == 2)
            before = scrape(collector)
            (inbox / "a.flag").touch()
            await wait_until(lambda: triggerer.persister.stats.events == 1)
            after = scrape(collector)

            await triggerer.runner.aclose(grace_s=5)
            await triggerer.shared_streams.stop_all()
            triggerer.outbox.close()
            tg.cancel_scope.cancel()

    assert value(after, "sluice_triggers_running") == 2
    assert value(after, "sluice_triggerer_capacity") == 10
    assert value(after, "sluice_triggerer_capacity_left") == 8
    assert value(before, "sluice_events_fired_total") == 0
    assert value(after, "sluice_events_fired_total") == 1
    assert value(before, "sluice_events_persisted_total") == 0
    assert value(after, "sluice_events_persisted_total") == 1
    assert value(after, "sluice_outbox_pending") == 0
    assert value(after, "sluice_persister_batch_size_count") == 1
    assert value(after, "sluice_persister_batch_size_sum") == 1
    assert value(after, "sluice_persister_batch_size_bucket", le="1.0") == 1
    assert value(after, "sluice_persister_commit_seconds_count") == 1
    assert value(after, "sluice_persister_commit_seconds_bucket", le="+Inf") == 1
    assert value(after, "sluice_event_loop_blocked_total") == 0
    group = {"key": key, "mode": "fast", "broker": "directory-scan"}
    assert value(after, "sluice_shared_stream_groups") == 1
    assert value(after, "sluice_shared_stream_subscribers", **group) == 2
    polled = value(after, "sluice_shared_stream_events_polled_total", **group)
    assert polled >= 1
    assert value(after, "sluice_shared_stream_deliveries_total", **group) >= 2
    assert value(after, "sluice_event_loop_responsive") == 1
    assert value(after, "sluice_up") == 1


def test_shared_stream_group_families_carry_key_mode_broker_and_lane_labels() -> None:
    ack = GroupStats(
        key="('kafka', 'orders')",
        broker="kafka",
        mode="ack",
        subscribers=3,
        queue_high_water=17,
        queue_depth=5,
        outstanding_by_lane={"0": 4, "1": 0},
        oldest_unresolved_age_s=2.5,
        events_polled=100,
        deliveries=300,
        advances=10,
        advanced_events=96,
        last_advance_batch=8,
        advance_latency_sum_s=0.25,
        overflows=1,
        ack_timeouts=2,
        rejects=3,
        dead_lettered=2,
    )
    fast = GroupStats(key="('dir', '/in')", mode="fast", subscribers=2, broker="DirTrigger")
    samples = exposition(families(reading_with_groups(ack, fast)))

    labels = {"key": ack.key, "mode": "ack", "broker": "kafka"}
    assert value(samples, "sluice_shared_stream_groups") == 2
    assert value(samples, "sluice_shared_stream_subscribers", **labels) == 3
    assert value(samples, "sluice_shared_stream_queue_high_water", **labels) == 17
    assert value(samples, "sluice_shared_stream_queue_depth", **labels) == 5
    assert value(samples, "sluice_shared_stream_outstanding_events", **labels) == 4
    assert value(samples, "sluice_shared_stream_outstanding_lanes", **labels) == 2
    assert value(samples, "sluice_shared_stream_outstanding", **labels, lane="0") == 4
    assert value(samples, "sluice_shared_stream_outstanding", **labels, lane="1") == 0
    assert value(samples, "sluice_shared_stream_oldest_unresolved_age_seconds", **labels) == 2.5
    assert value(samples, "sluice_shared_stream_advance_latency_seconds_count", **labels) == 10
    assert value(samples, "sluice_shared_stream_advance_latency_seconds_sum", **labels) == 0.25
    assert value(samples, "sluice_shared_stream_advance_batch_size_count", **labels) == 10
    assert value(samples, "sluice_shared_stream_advance_batch_size_sum", **labels) == 96
    assert value(samples, "sluice_shared_stream_last_advance_batch", **labels) == 8
    assert value(samples, "sluice_shared_stream_advanced_events_total", **labels) == 96
    assert value(samples, "sluice_shared_stream_overflows_total", **labels) == 1
    assert value(samples, "sluice_shared_stream_ack_timeouts_total", **labels) == 2
    assert value(samples, "sluice_shared_stream_rejects_total", **labels) == 3
    assert value(samples, "sluice_shared_stream_dead_lettered_total", **labels) == 2
    assert value(samples, "sluice_shared_stream_events_polled_total", **labels) == 100
    assert value(samples, "sluice_shared_stream_deliveries_total", **labels) == 300
    # A fast-mode group has no unresolved events: no age sample rather than a fake zero.
    fast_labels = {"key": fast.key, "mode": "fast", "broker": "DirTrigger"}
    age = ("sluice_shared_stream_oldest_unresolved_age_seconds", frozenset(fast_labels.items()))
    assert age not in samples
    assert value(samples, "sluice_shared_stream_subscribers", **fast_labels) == 2
    assert value(samples, "sluice_shared_stream_dead_lettered_total", **fast_labels) == 0
    # Every per-group series names its broker.
    grouped = [labels for name, labels in samples if name.startswith("sluice_shared_stream_")]
    assert all(dict(labels).get("broker") for labels in grouped if labels)


def reading_with_groups(*groups: GroupStats) -> EngineReading:
    hist = HistogramReading.of(Buckets((1.0,)))
    triggerer = TriggererReading(
        job_id=7,
        running=0,
        capacity=1,
        events_fired=0,
        failures_reported=0,
        outbox_pending=0,
        events_persisted=0,
        events_refused=0,
        asset_events_created=0,
        tasks_resumed=0,
        failures_persisted=0,
        persist_dropped=0,
        batch_size=hist,
        commit_s=hist,
        blocked_loops=0,
        groups=groups,
    )
    return EngineReading(triggerer=triggerer)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], [("0.1", 0), ("1.0", 0), ("+Inf", 0)]),
        ([0.1], [("0.1", 1), ("1.0", 1), ("+Inf", 1)]),  # a value on a bound is "le" it
        ([0.05, 0.5, 1.0, 7.0], [("0.1", 1), ("1.0", 3), ("+Inf", 4)]),
    ],
)
def test_buckets_are_cumulative_le_buckets(values: list[float], expected: list[Any]) -> None:
    buckets = Buckets((0.1, 1.0))
    for v in values:
        buckets.observe(v)
    reading = HistogramReading.of(buckets)
    assert reading.cumulative() == [(le, float(n)) for le, n in expected]
    assert reading.total == pytest.approx(sum(values))


async def test_the_scrape_reads_the_parts_on_their_event_loop(db: Database) -> None:
    """From the HTTP server's thread, the reading is taken on the loop (which answers)."""
    collector = EngineCollector(loop=asyncio.get_running_loop())
    collector.triggerer = make_triggerer(db)
    with anyio.fail_after(10):
        samples = await anyio.to_thread.run_sync(scrape, collector)
    assert value(samples, "sluice_event_loop_responsive") == 1
    assert value(samples, "sluice_shared_stream_groups") == 0


async def test_a_scrape_on_the_loop_thread_reads_at_once(db: Database) -> None:
    """Scheduling the read on its own (busy) loop would time out and report it stuck."""
    collector = EngineCollector(loop=asyncio.get_running_loop(), read_timeout_s=0.2)
    collector.triggerer = make_triggerer(db)
    samples = scrape(collector)
    assert value(samples, "sluice_event_loop_responsive") == 1
    assert value(samples, "sluice_shared_stream_groups") == 0


@pytest.mark.parametrize("loop_state", ["stuck", "closed"])
def test_a_stuck_loop_still_gets_scraped(db: Database, loop_state: str) -> None:
    """A loop that does not answer (blocked by a trigger, or gone) does not hang the scrape:
    the counters are read from the scrape thread, the shared-stream snapshots left out."""
    loop = asyncio.new_event_loop()  # never run: a callback scheduled on it never runs
    if loop_state == "closed":
        loop.close()
    try:
        collector = EngineCollector(loop=loop, read_timeout_s=0.05)
        triggerer = make_triggerer(db, capacity=4)
        triggerer.persister.stats.events = 3
        collector.triggerer = triggerer
        samples = scrape(collector)
    finally:
        loop.close()
    assert value(samples, "sluice_event_loop_responsive") == 0
    assert value(samples, "sluice_triggerer_capacity_left") == 4
    assert value(samples, "sluice_events_persisted_total") == 3
    assert "sluice_shared_stream_groups" not in names(samples)


def test_scheduler_and_executor_families(db: Database, tmp_path: Path) -> None:
    cipher = KwargsCipher(Fernet.generate_key().decode())
    scheduler = Scheduler(db=db, cipher=cipher, settings=SchedulerSettings())
    executor = LocalExecutor(
        db=db,
        cipher=cipher,
        settings=ExecutorSettings(
            parallelism=3,
            dags_folder=tmp_path,
            plugins_folder=None,
            task_log_folder=tmp_path / "logs",
        ),
    )
    scheduler.job_id, executor.job_id = 11, 12
    collector = EngineCollector()
    collector.scheduler, collector.executor = scheduler, executor
    samples = scrape(collector)
    assert value(samples, "sluice_dag_runs_created_total", run_type="asset_triggered") == 0
    assert value(samples, "sluice_task_slots_used") == 0
    assert value(samples, "sluice_task_slots_total") == 3
    assert value(samples, "sluice_job_info", part="scheduler", job_id="11") == 1
    assert value(samples, "sluice_job_info", part="executor", job_id="12") == 1
    assert "sluice_triggers_running" not in names(samples)  # no triggerer in this process
    (build,) = [labels for name, labels in samples if name == "sluice_build_info"]
    assert {k for k, _ in build} == {"version", "python"}


def test_lane_series_are_bounded_and_the_key_label_is_cut_as_the_database_column() -> None:
    """One lane per SQS FIFO message group with pending events: only the busiest lanes get
    a series; the backlog of every lane and the number of lanes are gauges of their own."""
    lanes = {repr(f"group-{n:04}"): n for n in range(1, 501)}
    long_key = repr(("kafka", "x" * 5000))
    group = GroupStats(
        key=long_key, mode="ack", subscribers=1, outstanding_by_lane=lanes, broker="kafka"
    )
    samples = exposition(families(reading_with_groups(group)))

    label = key_label(long_key)
    assert len(label) <= KEY_LABEL_MAX_CHARS
    keys = {dict(labels)["key"] for _, labels in samples if "key" in dict(labels)}
    assert keys == {label}
    per_lane = {
        dict(labels)["lane"]: v
        for (name, labels), v in samples.items()
        if name == "sluice_shared_stream_outstanding"
    }
    assert per_lane == {repr(f"group-{n:04}"): n for n in range(501 - REPORTED_LANES, 501)}
    ours = {"key": label, "mode": "ack", "broker": "kafka"}
    assert value(samples, "sluice_shared_stream_outstanding_events", **ours) == sum(range(501))
    assert value(samples, "sluice_shared_stream_outstanding_lanes", **ours) == 500


async def test_events_the_store_refuses_are_not_counted_as_persisted(db: Database) -> None:
    asset_id = db.call(
        lambda s: s.execute(
            insert(Asset).values(name="a", uri="test://a", extra={}).returning(Asset.id)
        ).scalar_one()
    )
    cipher = KwargsCipher(Fernet.generate_key().decode())
    settings = TriggererSettings(max_asset_event_payload_bytes=100)
    triggerer = Triggerer(db=db, cipher=cipher, settings=settings)
    collector = EngineCollector()
    collector.triggerer = triggerer
    for trigger_id, payload in enumerate([{"n": 1}, {"blob": "x" * 1000}], start=1):
        event = TriggerEvent(payload)
        item = FiredEvent(trigger_id, event, None, 0.0, watcher=(asset_id, "w"))
        triggerer.outbox.put_nowait(item)
    triggerer.outbox.close()
    with anyio.fail_after(10):
        await triggerer.persister.run()  # until the closed outbox is drained
    samples = scrape(collector)
    assert value(samples, "sluice_asset_events_created_total") == 1
    assert value(samples, "sluice_events_persisted_total") == 1  # the stored one only
    assert value(samples, "sluice_events_refused_total") == 1  # over the payload limit


class HeldTaskSupervisor:
    """Stands in for the child processes: each task step runs until ``release``."""

    release: anyio.Event

    def __init__(self, **_kwargs: object) -> None:
        pass

    async def execute(self, job_id: int, ti_id: int, claimed: object = None) -> None:
        await self.release.wait()

    async def stop_changed_forever(self, job_id: int) -> None:
        await anyio.sleep_forever()

    def interrupt_all(self) -> None:
        pass

    def kill_all(self) -> None:
        pass


async def test_dag_runs_created_and_task_slots_used_follow_the_parts(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An asset event makes the scheduler create a run (the counter moves); the executor
    claims its task and holds a slot while it runs, then gives it back (the gauge moves)."""

    def seed(session: Any) -> None:
        asset_id = session.execute(
            insert(Asset).values(name="a", uri="a", extra={}).returning(Asset.id)
        ).scalar_one()
        schedule = AssetCondition("a").to_json()
        session.execute(insert(Dag).values(dag_id="flow", fileloc="/f.py", schedule=schedule))
        session.execute(insert(DagScheduleAsset).values(dag_id="flow", asset_id=asset_id))
        session.execute(insert(DagTask).values(dag_id="flow", task_id="t", operator="Op"))
        row = {"asset_id": asset_id, "payload": {}, "dedup_key": "e1", "timestamp": models.utcnow()}
        assets.enqueue_asset_events(session, assets.insert_asset_events(session, [row]))

    db.call(seed)
    HeldTaskSupervisor.release = anyio.Event()
    monkeypatch.setattr(executor_module, "TaskSupervisor", HeldTaskSupervisor)
    cipher = KwargsCipher(Fernet.generate_key().decode())
    scheduler = Scheduler(db=db, cipher=cipher, settings=SchedulerSettings())
    settings = ExecutorSettings(
        parallelism=3,
        dags_folder=tmp_path,
        plugins_folder=None,
        task_log_folder=tmp_path / "logs",
    )
    executor = LocalExecutor(db=db, cipher=cipher, settings=settings)
    collector = EngineCollector()
    collector.scheduler, collector.executor = scheduler, executor
    runs, slots = "sluice_dag_runs_created_total", "sluice_task_slots_used"

    def reads(name: str, expected: float, **labels: str) -> bool:
        return value(scrape(collector), name, **labels) == expected

    assert reads(runs, 0, run_type="asset_triggered") and reads(slots, 0)
    with anyio.fail_after(10):
        await scheduler.schedule_once()  # creates the run and schedules its task
        assert reads(runs, 1, run_type="asset_triggered")
        async with anyio.create_task_group() as tg:
            await tg.start(executor.run)
            await wait_until(lambda: reads(slots, 1))  # claimed: the task holds a slot
            assert reads("sluice_task_instances_claimed_total", 1)
            HeldTaskSupervisor.release.set()
            await wait_until(lambda: reads(slots, 0))  # done: the slot is free again
            executor.shutdown()


def test_celery_queue_families() -> None:
    """The Celery executor's sender reports each queue: tries queued and running, sent."""
    from engine.metrics.readings import ExecutorReading, QueueReading

    executor = ExecutorReading(
        job_id=3,
        slots_used=2,
        slots_total=8,
        claimed=9,
        outcomes=(),
        queues=(QueueReading("default", 2, 1, 7), QueueReading("gpu", 0, 3, 2)),
    )
    samples = exposition(families(EngineReading(executor=executor)))
    assert value(samples, "sluice_celery_queue_tries", queue="default", state="queued") == 2
    assert value(samples, "sluice_celery_queue_tries", queue="gpu", state="running") == 3
    assert value(samples, "sluice_celery_sent_total", queue="default") == 7
    local = exposition(families(EngineReading(executor=replace(executor, queues=()))))
    assert "sluice_celery_sent_total" not in names(local)
