"""Airflow side of workload 1: shared-stream fan-out throughput.

Run by bench/compare_airflow.py with the Airflow venv's python:

    fanout.py --level INFO --mode ack --subscribers 100 --events 1000

prints one JSON line per layer (``manager`` then ``runtime``). Subscribers are
``realistic`` by default (``--subscriber-kind``): a field predicate over each message and a
TriggerEvent built from its fields, as bench/shared_stream_bench.py's; ``empty`` ones wrap
the raw event as it is.

* manager: N subscribers consume ``filter_shared_stream`` of Airflow's own
  ``SharedStreamManager`` directly, bind each trigger event and confirm it at once;
* runtime: each subscriber is a trigger run by Airflow's ``TriggerRunner.run_trigger``
  in-process (no database, no supervisor process); a task standing in for the supervisor
  takes the runner's outbound ``events`` deque and confirms every persisted sequence number
  (``confirm_persisted``) as soon as it sees it — faster than the real supervisor, which
  confirms on the next state sync (about 1 s).

The feed mirrors bench/shared_stream_bench.py: events are pushed in batches of 256 with a
checkpoint in between (throttled so no queue overflows, see ``_feed``); ack mode waits
until the producer advanced the last event. Logging is
set up as the real trigger-runner subprocess does (``configure_logging(json_output=True,
sending_to_supervisor=True)``), written to /dev/null.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import deque
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import SharedStreamProducer

KEY = ("bench",)
QUEUE_SIZE = int(os.environ.get("BENCH_QUEUE_SIZE", "1024"))
ACK_TIMEOUT = float(os.environ.get("BENCH_ACK_TIMEOUT", "300"))
# CPU seconds (process time) of the last run's timed part: on a loaded machine, events per
# CPU second depend far less on the other processes than events per wall second.
LAST_CPU_S = [0.0]


def _setup_logging(level: str) -> None:
    from airflow.sdk.log import configure_logging, reset_logging

    reset_logging()
    sink = open(os.devnull, "wb")
    configure_logging(
        json_output=True, output=sink, sending_to_supervisor=True, log_level=level.lower()
    )


class Feed:
    """An unbounded FIFO read as an async iterator (Sluice's InMemoryFeed, in asyncio)."""

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self.ready = asyncio.Event()

    def put(self, item: Any) -> None:
        self.items.append(item)
        self.ready.set()

    async def iterate(self) -> Any:
        while True:
            while not self.items:
                self.ready.clear()
                await self.ready.wait()
            yield self.items.popleft()


class Producer(SharedStreamProducer):
    """Yields what the feed holds; counts advanced events, wakes the waiter at the target."""

    def __init__(self) -> None:
        self.feed = Feed()
        self.advanced = 0
        self.target = -1
        self.reached = asyncio.Event()

    async def open_stream(self) -> Any:
        async for item in self.feed.iterate():
            yield item

    async def advance(self, batch: Any) -> None:
        self.advanced += len(batch)
        if self.advanced >= self.target:
            self.reached.set()


# The realistic subscriber (the default) and its messages: the same as
# bench/shared_stream_bench.py's (keep them equal). The raw event is a broker message, the
# filter runs a field predicate over its value and builds a TriggerEvent from a few of its
# fields. Sluice's TriggerEvent also gets a dedup_key; Airflow's TriggerEvent has none.
SUBSCRIBER_KINDS = ("realistic", "empty")
MATCH = {"kind": "order", "currency": "EUR"}


def message(i: int) -> dict[str, Any]:
    """Raw event ``i``: a broker message with a JSON value."""
    return {
        "topic": "orders",
        "partition": i % 8,
        "offset": i // 8,
        "key": f"customer-{i % 100}",
        "value": {"kind": "order", "id": i, "amount": i % 1000, "currency": "EUR"},
    }


def matches(value: dict[str, Any], match: dict[str, Any]) -> bool:
    for field, wanted in match.items():
        if value.get(field) != wanted:
            return False
    return True


class BenchTrigger(BaseEventTrigger):
    subscriber_kind = "realistic"

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.{type(self).__qualname__}", {})

    async def run(self) -> Any:
        raise RuntimeError("bench triggers run as shared-stream subscribers")
        yield

    def shared_stream_key(self) -> Any:
        return KEY

    async def filter_shared_stream(self, shared_stream: Any) -> Any:
        if self.subscriber_kind == "empty":
            async for raw in shared_stream:
                yield TriggerEvent(raw)
            return
        match = MATCH
        async for raw in shared_stream:
            value = raw["value"]
            if not matches(value, match):
                continue
            payload = {
                "topic": raw["topic"],
                "partition": raw["partition"],
                "offset": raw["offset"],
                "key": raw["key"],
                "order": value["id"],
                "amount": value["amount"],
            }
            yield TriggerEvent(payload)


class FastTrigger(BenchTrigger):
    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> Any:
        assert FEED is not None
        async for raw in FEED.iterate():
            yield raw


class AckTrigger(BenchTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> Any:
        return PRODUCER


FEED: Feed | None = None
PRODUCER: Producer | None = None


async def _feed(ack: bool, m: int, backlog: Any) -> None:
    """Push m events in batches of 256, never letting a subscriber's queue overflow.

    ``backlog()`` is the fullest subscriber queue: before each batch the feeder waits until
    it has room for the batch. Sluice's feeder (bench/shared_stream_bench.py) does not wait;
    here it must, because at INFO Airflow's runtime subscriber falls behind an unthrottled
    feed and is failed with ``_SubscriberOverflow``. The throttle only favours Airflow.
    """
    for i in range(m):
        if i % 256 == 0:
            while backlog() > QUEUE_SIZE - 256:  # noqa: ASYNC110 - polls queue sizes
                await asyncio.sleep(0)
        if ack:
            assert PRODUCER is not None
            PRODUCER.feed.put((message(i), i))
        else:
            assert FEED is not None
            FEED.put(message(i))
        if i % 256 == 255:
            await asyncio.sleep(0)  # a broker hands out batches, not one endless burst


def _backlog(mgr: Any) -> Any:
    def fullest() -> int:
        group = mgr._groups.get(KEY)
        if group is None:
            raise RuntimeError("the shared-stream group ended (a subscriber or the poll failed)")
        # events the poll has not broadcast yet count too
        pending = len(PRODUCER.feed.items) if PRODUCER is not None else 0
        pending += len(FEED.items) if FEED is not None else 0
        return pending + max((q.qsize() for q in group._subscribers.values()), default=0)

    return fullest


async def _until_done(done: asyncio.Event, tasks: list[asyncio.Task[Any]]) -> None:
    """Wait for ``done``; raise if a subscriber task ended first (overflow, failure)."""
    while not done.is_set():
        for task in tasks:
            if task.done():
                exc = None if task.cancelled() else task.exception()
                raise RuntimeError(f"a subscriber ended before the last event: {exc!r}")
        try:
            await asyncio.wait_for(done.wait(), 0.5)
        except TimeoutError:
            continue


def _fresh(ack: bool, m: int, kind: str) -> Any:
    global FEED, PRODUCER
    FEED = Feed()
    PRODUCER = Producer()
    PRODUCER.target = m
    cls = AckTrigger if ack else FastTrigger

    def make() -> BenchTrigger:
        trigger = cls()
        trigger.subscriber_kind = kind
        return trigger

    return make


async def manager_alone(n: int, m: int, ack: bool, kind: str) -> float:
    from airflow.triggers.shared_stream import SharedStreamManager

    make = _fresh(ack, m, kind)
    mgr = SharedStreamManager(max_subscriber_queue=QUEUE_SIZE, ack_timeout=ACK_TIMEOUT)
    done, count = asyncio.Event(), 0

    async def subscriber(tid: int) -> None:
        nonlocal count
        trigger = make()
        stream = mgr.subscribe(trigger_id=tid, trigger=trigger, key=KEY)
        async for _event in trigger.filter_shared_stream(stream):
            seq = mgr.bind_pending_event(trigger_id=tid, key=KEY)
            if seq is not None:
                mgr.confirm_persisted((seq,))
            count += 1
            if count == n * m:
                done.set()

    tasks = [asyncio.create_task(subscriber(tid)) for tid in range(n)]
    await asyncio.sleep(0.05)  # every subscriber subscribed and waiting
    cpu_started = time.process_time()
    started = time.perf_counter()
    await _feed(ack, m, _backlog(mgr))
    await _until_done(done, tasks)
    if ack:
        assert PRODUCER is not None
        await PRODUCER.reached.wait()
    elapsed = time.perf_counter() - started
    LAST_CPU_S[0] = time.process_time() - cpu_started
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await mgr.stop_all()
    return m / elapsed


async def through_runtime(n: int, m: int, ack: bool, kind: str) -> float:
    from airflow.jobs.triggerer_job_runner import TriggerRunner

    make = _fresh(ack, m, kind)
    runner = TriggerRunner()
    mgr = runner._shared_streams
    done, count = asyncio.Event(), 0

    async def supervisor_stand_in() -> None:
        nonlocal count
        while True:
            if runner.events:
                seqs = []
                while runner.events:
                    entry = runner.events.popleft()
                    count += 1
                    if entry.persist_seq is not None:
                        seqs.append(entry.persist_seq)
                mgr.confirm_persisted(seqs)
                if count >= n * m:
                    done.set()
            await asyncio.sleep(0)

    drain = asyncio.create_task(supervisor_stand_in())
    for tid in range(n):
        trigger = make()
        trigger.trigger_id = tid
        runner.triggers[tid] = {
            "task": asyncio.create_task(runner.run_trigger(tid, trigger), name=f"ID {tid}"),
            "is_watcher": True,
            "name": f"ID {tid}",
            "events": 0,
        }
    while True:  # every subscriber joined before events flow
        group = mgr._groups.get(KEY)
        if group is not None and len(group._subscribers) >= n:
            break
        await asyncio.sleep(0.001)
    cpu_started = time.process_time()
    started = time.perf_counter()
    tasks = [d["task"] for d in runner.triggers.values()]
    await _feed(ack, m, _backlog(mgr))
    await _until_done(done, tasks)
    if ack:
        assert PRODUCER is not None
        await PRODUCER.reached.wait()
    elapsed = time.perf_counter() - started
    LAST_CPU_S[0] = time.process_time() - cpu_started
    for task in [*tasks, drain]:
        task.cancel()
    await asyncio.gather(*tasks, drain, return_exceptions=True)
    await mgr.stop_all()
    return m / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--level", default="INFO")
    parser.add_argument("--mode", choices=("fast", "ack"), required=True)
    parser.add_argument("--subscribers", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--layers", default="manager,runtime")
    parser.add_argument("--subscriber-kind", choices=SUBSCRIBER_KINDS, default="realistic")
    args = parser.parse_args()
    _setup_logging(args.level)
    ack, n, m = args.mode == "ack", args.subscribers, args.events
    for layer in args.layers.split(","):
        fn = manager_alone if layer == "manager" else through_runtime
        raw = asyncio.run(fn(n, m, ack, args.subscriber_kind))
        row = {
            "system": "airflow",
            "workload": "fanout",
            "layer": layer,
            "mode": args.mode,
            "subscribers": n,
            "events": m,
            "subscriber_kind": args.subscriber_kind,
            "log_level": args.level,
            "queue_size": QUEUE_SIZE,
            "ack_timeout_s": ACK_TIMEOUT,
            "raw_per_s": raw,
            "deliveries_per_s": raw * n,
            "raw_per_cpu_s": m / LAST_CPU_S[0],
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
