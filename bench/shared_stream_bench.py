"""Shared-stream figures: fan-out throughput and yield-to-advance latency.

Run by hand (never in tests):  .venv/bin/python bench/shared_stream_bench.py [--reps 3]

Every figure is given as median [min-max] of ``--reps`` repetitions (>= 3); results go to
bench/results/shared_stream.json. Fan-out figures are raw events per wall second and per
CPU second of the process (``time.process_time``): on a machine shared with other work the
latter, and ratios taken within one repetition, are the ones to compare. Subscribers are
``realistic`` by default (``--kind``): each runs a field predicate over a broker-like
message and builds a ``TriggerEvent`` from its fields, as the broker triggers do; ``empty``
ones wrap the raw event as it is.

1. Fan-out throughput, fast and ack mode, N = 1, 10, 100 subscribers, queue size 1024 (the
   default), log level WARNING: raw events/s and deliveries/s (raw x N)
   * manager alone: subscribers consume ``filter_shared_stream`` directly, bind and confirm;
   * through the runtime: each subscriber is a trigger run by ``TriggerRunner``; its events
     go through the outbox to a drain task that confirms them (the persister's role, no DB).
2. Yield-to-advance latency with real persistence: the real ``Triggerer`` on SQLite, an
   ack-mode producer fed at a steady rate; latency = time from the producer yielding an
   event to ``advance`` receiving it (the event's asset event committed in between).
3. Against Apache Airflow 3.3.2's manager (bench/.venv-airflow, bench/_airflow_side/fanout.py),
   ack mode, N = 100, manager level, realistic and empty subscribers: each run a fresh
   process, the two systems back to back, alternating which goes first; ratios only of
   runs taken in this invocation (median of each side, and min-max of per-repetition ratios).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from shared_stream_latency import yield_to_advance

from engine.states import TriggerKind
from engine.triggerer.outbox import FiredEvent, Outbox
from engine.triggerer.runtime import TriggerRunner, TriggerSpec
from shared_stream import SharedStreamManager
from shared_stream.testing import InMemoryFeed, InMemoryProducer
from triggers.base import BaseEventTrigger, TriggerEvent

QUEUE_SIZE = 1024
# CPU seconds (process time) of the last fan-out run's timed part: on a loaded machine,
# events per CPU second depend far less on the other processes than events per wall second.
LAST_CPU_S = [0.0]
KEY = ("bench",)
_FEED: InMemoryFeed | None = None
_PRODUCER: InMemoryProducer | None = None


# The realistic subscriber (the default): the raw event is a broker message, the filter runs
# a field predicate over its value and builds a TriggerEvent from a few of its fields, as
# the Kafka/SQS event triggers do. ``empty`` subscribers wrap the raw event as it is.
# bench/_airflow_side/fanout.py has the same messages, predicate and payload (keep them
# equal); only Sluice's TriggerEvent also gets a dedup_key (Airflow's has none), as every
# broker trigger of Sluice sets one.
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


class _BenchTrigger(BaseEventTrigger):
    subscriber_kind = "realistic"
    # bench/fanout_instructions.py turns it off to count what the dedup key costs
    dedup_keys = True

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
        keyed = self.dedup_keys
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
            yield TriggerEvent(
                payload,
                dedup_key=f"bench:{raw['topic']}:{raw['partition']}:{raw['offset']}"
                if keyed
                else None,
            )


class FastTrigger(_BenchTrigger):
    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> Any:
        assert _FEED is not None
        async for raw in _FEED:
            yield raw


class AckTrigger(_BenchTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> Any:
        return _PRODUCER


def _trigger(ack: bool, kind: str) -> _BenchTrigger:
    if kind not in SUBSCRIBER_KINDS:
        raise ValueError(f"subscriber kind {kind!r}: one of {SUBSCRIBER_KINDS}")
    trigger = AckTrigger() if ack else FastTrigger()
    trigger.subscriber_kind = kind
    return trigger


async def _feed(ack: bool, m: int) -> None:
    for i in range(m):
        if ack:
            assert _PRODUCER is not None
            _PRODUCER.feed.put((message(i), i))
        else:
            assert _FEED is not None
            _FEED.put(message(i))
        if i % 256 == 255:
            await anyio.lowlevel.checkpoint()  # a broker hands out batches, not one endless burst


async def manager_alone(n: int, m: int, ack: bool, kind: str = "realistic") -> float:
    global _FEED, _PRODUCER
    _FEED, _PRODUCER = InMemoryFeed(), InMemoryProducer()
    done, count = anyio.Event(), 0

    async def subscriber(mgr: SharedStreamManager, tid: int) -> None:
        nonlocal count
        trigger = _trigger(ack, kind)
        stream = mgr.subscribe(trigger_id=tid, trigger=trigger, key=KEY)
        async for _event in trigger.filter_shared_stream(stream):
            seq = mgr.bind_pending_event(trigger_id=tid, key=KEY)
            if seq is not None:
                mgr.confirm_persisted((seq,))
            count += 1
            if count == n * m:
                done.set()

    async with SharedStreamManager(max_subscriber_queue=QUEUE_SIZE) as mgr:
        async with anyio.create_task_group() as tg:
            for tid in range(n):
                tg.start_soon(subscriber, mgr, tid)
            await anyio.wait_all_tasks_blocked()
            cpu_started = time.process_time()
            started = time.perf_counter()
            await _feed(ack, m)
            await done.wait()
            if ack:
                await _PRODUCER.wait_for_advanced(m)  # every event, as the Airflow side waits
            elapsed = time.perf_counter() - started
            LAST_CPU_S[0] = time.process_time() - cpu_started
            tg.cancel_scope.cancel()
    return m / elapsed


async def through_runtime(n: int, m: int, ack: bool, kind: str = "realistic") -> float:
    global _FEED, _PRODUCER
    _FEED, _PRODUCER = InMemoryFeed(), InMemoryProducer()
    outbox = Outbox()
    mgr = SharedStreamManager(max_subscriber_queue=QUEUE_SIZE)
    runner = TriggerRunner(outbox=outbox, shared_streams=mgr)
    done, count = anyio.Event(), 0

    async def drain() -> None:  # the persister's part, without the database
        nonlocal count
        while batch := await outbox.get_batch(2000):
            seqs = [i.seq for i in batch if isinstance(i, FiredEvent) and i.seq is not None]
            mgr.confirm_persisted(seqs)
            count += len(batch)
            if count >= n * m:
                done.set()

    async with anyio.create_task_group() as tg:
        await tg.start(mgr.run)
        await tg.start(runner.run)
        tg.start_soon(drain)
        for tid in range(n):
            trigger = _trigger(ack, kind)
            runner.start(TriggerSpec(trigger_id=tid, trigger=trigger, kind=TriggerKind.WATCHER))
        while True:  # every subscriber joined before events flow
            if mgr.subscriber_count(KEY) >= n:
                break
            await anyio.sleep(0.001)
        cpu_started = time.process_time()
        started = time.perf_counter()
        await _feed(ack, m)
        await done.wait()
        if ack:
            await _PRODUCER.wait_for_advanced(m)  # every event, as the Airflow side waits
        elapsed = time.perf_counter() - started
        LAST_CPU_S[0] = time.process_time() - cpu_started
        tg.cancel_scope.cancel()
    return m / elapsed


def spread(values: list[float]) -> dict[str, float]:
    """min / median / max of the repetitions (the median is the typical figure)."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


BENCH = Path(__file__).resolve().parent
AIRFLOW_PY = BENCH / ".venv-airflow" / "bin" / "python"


def fanout_command(system: str, n: int, m: int, kind: str, level: str) -> list[str]:
    """The command of one fan-out run (ack mode, manager level) of ``system`` ("sluice" or
    "airflow"); it prints one JSON line per layer, the manager's last."""
    common = ["--mode", "ack", "--subscribers", str(n), "--events", str(m)]
    common += ["--subscriber-kind", kind, "--level", level, "--layers", "manager"]
    if system == "airflow":
        return [str(AIRFLOW_PY), str(BENCH / "_airflow_side" / "fanout.py"), *common]
    return [sys.executable, str(Path(__file__).resolve()), "one", *common]


def _one_run(
    system: str, args: argparse.Namespace, n: int, m: int, kind: str
) -> tuple[float, float]:
    """One fan-out run (ack mode, manager level) in a fresh process: raw events per wall
    second and per CPU second of the process."""
    cmd = fanout_command(system, n, m, kind, args.level)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    return float(row["raw_per_s"]), float(row["raw_per_cpu_s"])


def compare_airflow(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Sluice and Airflow 3.3.2 managers, ack mode, N=100, each run in a fresh process,
    back to back, alternating which goes first; ratios of runs taken side by side."""
    if not AIRFLOW_PY.exists():
        sys.path.insert(0, str(BENCH))
        import compare_airflow as driver  # creates bench/.venv-airflow (3.3.2)

        driver.ensure_airflow_venv()
    rows = []
    n, m = 100, args.airflow_events
    for kind in SUBSCRIBER_KINDS:
        runs: dict[str, list[tuple[float, float]]] = {"sluice": [], "airflow": []}
        for rep in range(args.reps):
            order = ("sluice", "airflow") if rep % 2 == 0 else ("airflow", "sluice")
            for system in order:
                runs[system].append(_one_run(system, args, n, m, kind))
        row: dict[str, Any] = {
            "mode": "ack",
            "layer": "manager",
            "subscribers": n,
            "events": m,
            "subscriber_kind": kind,
            "log_level": args.level,
            "repetitions": args.reps,
        }
        for metric, index in (("raw_per_s", 0), ("raw_per_cpu_s", 1)):
            ours = [run[index] for run in runs["sluice"]]
            theirs = [run[index] for run in runs["airflow"]]
            ratios = [s / a for s, a in zip(ours, theirs, strict=True)]
            row[metric] = {
                "sluice": spread(ours),
                "airflow": spread(theirs),
                "ratio_of_medians": statistics.median(ours) / statistics.median(theirs),
                "ratio_per_repetition": spread(ratios),
                "runs": {"sluice": ours, "airflow": theirs},
            }
            fig = row[metric]
            print(
                f"vs Airflow {AIRFLOW_VERSION}, ack N={n} manager, {kind} subscribers, "
                f"{args.level}, {metric}: Sluice {_fmt(fig['sluice'])}, "
                f"Airflow {_fmt(fig['airflow'])}, ratio of medians "
                f"{fig['ratio_of_medians']:.2f}x "
                f"(per repetition {_fmt(fig['ratio_per_repetition'], '.2f')})",
                flush=True,
            )
        rows.append(row)
    return rows


AIRFLOW_VERSION = "3.3.2"


def _fmt(fig: dict[str, float], spec: str = ",.0f") -> str:
    return f"{fig['median']:{spec}} [{fig['min']:{spec}}-{fig['max']:{spec}}]"


def fanout_table(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    sizes = {1: 20_000, 10: 5_000, 100: 1_000}
    for ack in (False, True):
        for n, m in sizes.items():
            alone, alone_cpu, runtime, runtime_cpu = [], [], [], []
            for _ in range(args.reps):  # the two layers alternate
                alone.append(anyio.run(manager_alone, n, m, ack, args.kind))
                alone_cpu.append(m / LAST_CPU_S[0])
                runtime.append(anyio.run(through_runtime, n, m, ack, args.kind))
                runtime_cpu.append(m / LAST_CPU_S[0])
            row = {
                "mode": "ack" if ack else "fast",
                "subscribers": n,
                "events": m,
                "subscriber_kind": args.kind,
                "repetitions": args.reps,
                "raw_per_s_manager": spread(alone),
                "deliveries_per_s_manager": spread([r * n for r in alone]),
                "raw_per_s_runtime": spread(runtime),
                "deliveries_per_s_runtime": spread([r * n for r in runtime]),
                "raw_per_cpu_s_manager": spread(alone_cpu),
                "raw_per_cpu_s_runtime": spread(runtime_cpu),
            }
            rows.append(row)
            print(
                f"{row['mode']:4s} N={n:3d} {args.kind}: manager {_fmt(row['raw_per_s_manager'])} "
                f"raw/s ({_fmt(row['raw_per_cpu_s_manager'])} per CPU s)   runtime "
                f"{_fmt(row['raw_per_s_runtime'])} raw/s ({_fmt(row['raw_per_cpu_s_runtime'])} "
                "per CPU s)  (median [min-max])",
                flush=True,
            )
    return rows


def one(args: argparse.Namespace) -> None:
    """One run, one JSON line (what ``compare_airflow`` starts in a fresh process)."""
    from engine.logs import configure_logging

    configure_logging(args.level)
    sink = open(os.devnull, "w")  # for the whole process
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sink)
    ack = args.mode == "ack"
    for layer in args.layers.split(","):
        fn = manager_alone if layer == "manager" else through_runtime
        raw = anyio.run(fn, args.subscribers, args.events, ack, args.subscriber_kind)
        cpu = args.events / LAST_CPU_S[0]
        row = {"system": "sluice", "layer": layer, "raw_per_s": raw, "raw_per_cpu_s": cpu}
        print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions per figure (>= 3)")
    parser.add_argument("--level", default="WARNING")
    parser.add_argument("--kind", choices=SUBSCRIBER_KINDS, default="realistic")
    parser.add_argument("--only", default="fanout,airflow,latency")
    parser.add_argument("--airflow-events", type=int, default=1000)
    sub = parser.add_subparsers(dest="what")
    p = sub.add_parser("one")
    p.add_argument("--mode", choices=("fast", "ack"), required=True)
    p.add_argument("--subscribers", type=int, required=True)
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--layers", default="manager")
    p.add_argument("--subscriber-kind", choices=SUBSCRIBER_KINDS, default="realistic")
    p.add_argument("--level", default="WARNING")
    args = parser.parse_args()
    if args.what == "one":
        one(args)
        return
    logging.basicConfig(level=args.level)
    only = set(args.only.split(","))
    out = BENCH / "results" / "shared_stream.json"
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
        "command": " ".join(sys.argv),
    }
    if "fanout" in only:
        results["fanout"] = fanout_table(args)
    if "airflow" in only:
        results["vs_airflow"] = compare_airflow(args)
    if "latency" in only:
        for subscribers in (1, 10):
            lats = [yield_to_advance(subscribers, rate=200.0, total=1000) for _ in range(args.reps)]
            fig = {
                key: spread([lat[key] for lat in lats]) for key in ("p50_ms", "p99_ms", "max_ms")
            }
            fig.update(subscribers=subscribers, rate_per_s=200.0, events=1000, runs=lats)
            results.setdefault("yield_to_advance_sqlite", []).append(fig)
            print(
                f"yield->advance (SQLite, {subscribers} subscriber(s), 200 ev/s): "
                f"p50 {_fmt(fig['p50_ms'], '.1f')} ms  p99 {_fmt(fig['p99_ms'], '.1f')} ms",
                flush=True,
            )
    results["machine"]["load_average_at_end"] = os.getloadavg()
    out.write_text(json.dumps(results, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
