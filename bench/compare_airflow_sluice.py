"""Sluice side of bench/compare_airflow.py: one workload per run, one JSON line per figure.

Run by the driver with Sluice's python (``.venv/bin/python``); each subcommand calls the
existing Sluice benches, so the logic lives in one place:

* ``fanout``  -> bench/shared_stream_bench.py ``manager_alone`` / ``through_runtime``
* ``latency`` -> bench/shared_stream_bench.py ``yield_to_advance`` (real Triggerer, SQLite)
* ``claim`` -> bench/triggerer_bench.py ``claim_into_running`` (real Triggerer, SQLite)
* ``rss`` -> bench/triggerer_bench.py ``measure`` (real Triggerer, SQLite)
* ``cycle``   -> bench/engine_bench.py ``_main`` (all engine parts, SQLite)
* ``event``, ``dagfiles``, ``runs`` -> bench/compare_airflow_user.py (a fresh ``sluice run``)

Logging is set up as the ``sluice`` CLI does (``engine.logs.configure_logging``) at the
level given, written to /dev/null, so both systems pay for the log lines they emit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_airflow_user
import engine_bench
import shared_stream_bench
import triggerer_bench

from engine.logs import configure_logging


def _setup_logging(level: str) -> None:
    configure_logging(level)
    sink = open(os.devnull, "w")
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sink)


def _emit(workload: str, **fig: Any) -> None:
    print(json.dumps({"system": "sluice", "workload": workload, **fig}), flush=True)


def fanout(args: argparse.Namespace) -> None:
    ack, n, m = args.mode == "ack", args.subscribers, args.events
    for layer in args.layers.split(","):
        fn = shared_stream_bench.manager_alone if layer == "manager" else None
        fn = fn or shared_stream_bench.through_runtime
        raw = anyio.run(fn, n, m, ack)
        _emit(
            "fanout",
            layer=layer,
            mode=args.mode,
            subscribers=n,
            events=m,
            log_level=args.level,
            queue_size=shared_stream_bench.QUEUE_SIZE,
            ack_timeout_s=300.0,
            raw_per_s=raw,
            deliveries_per_s=raw * n,
        )


def latency(args: argparse.Namespace) -> None:
    fig = shared_stream_bench.yield_to_advance(args.subscribers, args.rate, args.events)
    _emit("latency", log_level=args.level, **fig)


def claim_or_rss(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        if args.what == "claim":  # into a running, idle triggerer, as on Airflow's side
            fig = triggerer_bench.claim_into_running(url, args.triggers)
        else:
            fig = triggerer_bench.measure(url, args.triggers, 1.0)
    _emit(args.what, log_level=args.level, **fig)


def cycle(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fig = anyio.run(engine_bench._main, Path(tmp) / "home", 2, args.cycles)
    _emit(
        "cycle",
        log_level=args.level,
        cycles=args.cycles,
        cycle_ms=fig["defer_cycle_ms"],
    )


def event(args: argparse.Namespace) -> None:
    fig = compare_airflow_user.event(args.bootstrap, args.topic, args.messages, args.interval)
    _emit("event", log_level=args.level, **fig)


def dagfiles(args: argparse.Namespace) -> None:
    _emit("dagfiles", log_level=args.level, **compare_airflow_user.dagfiles(args.files, args.idle))


def runs(args: argparse.Namespace) -> None:
    fig = compare_airflow_user.runs(args.runs, args.parallelism)
    _emit("runs", log_level=args.level, **fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--level", default="INFO")
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("fanout")
    p.add_argument("--mode", choices=("fast", "ack"), required=True)
    p.add_argument("--subscribers", type=int, required=True)
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--layers", default="manager,runtime")
    p.set_defaults(fn=fanout)
    p = sub.add_parser("latency")
    p.add_argument("--subscribers", type=int, default=1)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--events", type=int, default=1000)
    p.set_defaults(fn=latency)
    for name in ("claim", "rss"):
        p = sub.add_parser(name)
        p.add_argument("--triggers", type=int, required=True)
        p.set_defaults(fn=claim_or_rss)
    p = sub.add_parser("cycle")
    p.add_argument("--cycles", type=int, default=10)
    p.set_defaults(fn=cycle)
    p = sub.add_parser("event")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--messages", type=int, default=20)
    p.add_argument("--interval", type=float, default=1.0)
    p.set_defaults(fn=event)
    p = sub.add_parser("dagfiles")
    p.add_argument("--files", type=int, default=300)
    p.add_argument("--idle", type=float, default=60.0)
    p.set_defaults(fn=dagfiles)
    p = sub.add_parser("runs")
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--parallelism", type=int, default=8)
    p.set_defaults(fn=runs)
    args = parser.parse_args()
    _setup_logging(args.level)
    args.fn(args)


if __name__ == "__main__":
    main()
