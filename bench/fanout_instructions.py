"""Shared-stream fan-out counted in CPU instructions, Sluice against Airflow 3.3.2.

Run by hand (never in tests; needs valgrind):  .venv/bin/python bench/fanout_instructions.py

The wall-clock ratio of bench/compare_airflow.py's fan-out row moves with the machine (the
same code has measured 2.5x and 3.0x on two evenings, and a CPU-bound loop here takes
0.56-0.88 s from one run to the next). valgrind's callgrind counts the instructions a
process executes instead: for the same code and input, the same count (to a fraction of a
percent: the Airflow side's feed polls with ``sleep(0)``, so its path depends a little on
timing) whatever else the machine does. This bench runs the fan-out row's workload (ack
mode, 100 subscribers, manager alone, realistic subscribers, INFO;
bench/shared_stream_bench.py ``one`` and bench/_airflow_side/fanout.py) under callgrind at
two run lengths, and reports instructions per delivery = (count of the long run - count of
the short one) / (extra raw events x subscribers): start-up, imports and the feed's warm-up
cancel out.

It also counts Sluice's run with one part of a delivery removed (``--without``), to show
what each part costs:

* ``payload-check``: ``TriggerEvent`` built without checking its payload (what Airflow's
  ``TriggerEvent`` does: it checks nothing);
* ``binding``: ``bind_pending_event`` returns None (no ack bookkeeping per trigger event:
  nothing bound, nothing confirmed; the events are still acked as the subscribers move on);
* ``dedup-key``: the subscriber builds its ``TriggerEvent`` without a dedup key (Airflow's
  has none; every broker trigger of Sluice sets one).

Instructions are not seconds: an instruction that misses the cache costs more. The
figures are for reasoning about where the work is, next to (not instead of) the
wall-clock rows of compare_airflow.py. Results: bench/results/fanout_instructions.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from shared_stream_bench import AIRFLOW_PY, fanout_command  # noqa: E402

RESULTS = BENCH / "results"
SUBSCRIBERS = 100
PARTS = ("payload-check", "binding", "dedup-key")


def child(events: int, without: list[str]) -> None:
    """One Sluice run of the fan-out row's workload, with the named parts removed."""
    import shared_stream_bench as bench

    from shared_stream.manager import SharedStreamManager
    from triggers.base import TriggerEvent

    if "payload-check" in without:
        bench.TriggerEvent = TriggerEvent.of_plain  # type: ignore[assignment]
    if "binding" in without:

        def no_binding(self: SharedStreamManager, *, trigger_id: int, key: Any) -> None:
            return None

        SharedStreamManager.bind_pending_event = no_binding  # type: ignore[method-assign]
    if "dedup-key" in without:
        bench._BenchTrigger.dedup_keys = False
    bench.one(
        argparse.Namespace(
            mode="ack",
            subscribers=SUBSCRIBERS,
            events=events,
            layers="manager",
            subscriber_kind="realistic",
            level="INFO",
        )
    )


def _command(side: str, events: int, without: list[str]) -> list[str]:
    if side == "airflow":
        return fanout_command("airflow", SUBSCRIBERS, events, "realistic", "INFO")
    # Every Sluice count, with or without parts, runs through ``child``: the same harness,
    # so that the counts compare (around the same workload, another harness's start-up and
    # per-delivery count differ a little).
    command = [sys.executable, __file__, "child", "--events", str(events)]
    return [*command, "--without", ",".join(without)] if without else command


def count(side: str, events: int, without: list[str]) -> int:
    """Instructions the whole process executed (callgrind's ``Collected``)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={Path(tmp) / 'out'}",
                *_command(side, events, without),
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(
            f"{side} run ({events} events, without {without or 'nothing'}) failed "
            f"(rc={done.returncode}):\n{done.stderr[-2000:]}"
        )
    return int(found.group(1))


def per_delivery(side: str, short: int, long: int, without: list[str]) -> dict[str, Any]:
    with ThreadPoolExecutor(2) as pool:  # the two counts at once: they do not interfere
        short_run = pool.submit(count, side, short, without)
        long_run = pool.submit(count, side, long, without)
        counts = short_run.result(), long_run.result()
    value = (counts[1] - counts[0]) / ((long - short) * SUBSCRIBERS)
    return {"instructions_per_delivery": round(value), "counts": counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="what")
    one = sub.add_parser("child")
    one.add_argument("--events", type=int, required=True)
    one.add_argument("--without", default="")
    parser.add_argument("--short", type=int, default=100, help="raw events of the short run")
    parser.add_argument("--long", type=int, default=300, help="raw events of the long run")
    args = parser.parse_args()
    if args.what == "child":
        without = [part for part in args.without.split(",") if part]
        unknown = set(without) - set(PARTS)
        if unknown:
            parser.error(f"--without: unknown parts {sorted(unknown)}; one of {PARTS}")
        child(args.events, without)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is missing: apt-get install valgrind")
    if not AIRFLOW_PY.exists():
        sys.exit(f"{AIRFLOW_PY} is missing: run bench/compare_airflow.py once to create it")
    if args.long <= args.short:
        parser.error("--long must be greater than --short")
    rows: dict[str, Any] = {}
    for name, side, without in (
        ("airflow", "airflow", []),
        ("sluice", "sluice", []),
        *((f"sluice without {part}", "sluice", [part]) for part in PARTS),
    ):
        rows[name] = per_delivery(side, args.short, args.long, without)
        print(f"{name:32} {rows[name]['instructions_per_delivery']:>8,} instructions per delivery")
    sluice = rows["sluice"]["instructions_per_delivery"]
    airflow = rows["airflow"]["instructions_per_delivery"]
    ratio = airflow / sluice
    print(f"Airflow / Sluice: {ratio:.2f}x the instructions per delivery")
    for part in PARTS:
        share = (sluice - rows[f"sluice without {part}"]["instructions_per_delivery"]) / sluice
        print(f"  {part}: {share:.1%} of Sluice's instructions per delivery")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "fanout_instructions.json"
    result = {
        "workload": (
            f"ack mode, {SUBSCRIBERS} subscribers, manager alone, realistic subscribers, INFO"
        ),
        "runs": {"short_events": args.short, "long_events": args.long},
        "command": " ".join(sys.argv),
        "rows": rows,
        "airflow_over_sluice": round(ratio, 3),
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
