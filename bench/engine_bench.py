"""Engine figures: defer -> fire -> resume cycle time, and flag file -> DAG run latency.

Run by hand (never in tests):
    .venv/bin/python bench/engine_bench.py [--reps 3] [--cycles 60] [--trials 20]

Each repetition runs the real engine parts in one process (DAG processor, scheduler,
executor, triggerer: ``engine.supervisor.build_parts``, with their in-process wake-ups) on
SQLite in a fresh temporary SLUICE_HOME, once with task steps started as cold interpreters
(``ExecutorSettings.warm_runner=False``, the baseline) and once forked from the executor's
warm runner (the default), alternating cold / warm, ``--reps`` times. Figures are
min / median / max over the repetitions; the machine's load average is printed with them.

1. defer -> fire -> resume: one task defers ``--cycles`` times on ``TimeDeltaTrigger(0)``
   and stamps the wall clock at the start of every step; a cycle is the time between two
   stamps: the step writes its deferral and exits, the triggerer claims and fires the
   trigger, the persister resumes the task, the executor claims it and starts the next step
   (a cold interpreter, or a fork of the warm runner), which imports the DAG file and calls
   the resume method. p50 / p99 per repetition. The reference guide (001) quotes
   300-1400 ms per cycle for Airflow.
2. flag file created -> DAG run row committed (in the warm repetitions): a
   ``DirectoryFileDeleteTrigger`` watcher (poke_interval 0.05 s: on average half a cadence
   of the latency is the poll) and two ``DirectoryWatchTrigger`` watchers (inotify), one with
   the trigger's default ``debounce_ms`` and one with ``debounce_ms=5``: watchfiles yields a
   change once no other came for ``debounce_ms`` (its ``step``), so the default's latency is
   one to two debounce periods. The price of a short debounce is measured too: the CPU
   that 100 idle watchers use (watchfiles' thread wakes every ``min(debounce_ms, 50)`` ms),
   which is why the default stays 50.

``--trace``: one warm repetition whose cycle is broken down by stage (bench-only
instrumentation: the engine's transactions, the warm runner's spawn, the child's exit, the
in-process wake-ups, stamped with the wall clock as the task's stamps are): for each stage,
the median offset from the start of the previous step at which it began and ended.

Writes bench/results/engine.json (not with ``--trace``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import statistics
import tempfile
import textwrap
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.to_thread
from sqlalchemy import func, select

from engine.config import load_config
from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import runs
from engine.db.schema import migrate
from engine.executor.local import LocalExecutor
from engine.supervisor import build_parts, tune_gc
from engine.views import dags as dags_view
from triggers.serde import deserialize_value
from triggers.watch import DirectoryWatchTrigger

DEFAULT_DEBOUNCE_MS = DirectoryWatchTrigger("/").debounce_ms
FAST_DEBOUNCE_MS = 5
IDLE_WATCHERS = 100

#: The task that defers ``cycles`` times on ``TimeDeltaTrigger(0)`` (its DAG ``defer_loop``),
#: noting the time of each step: the defer -> fire -> resume cycle (also bench/step_bench.py).
#: Its file imports ``time``, ``timedelta``, ``DAG``, ``BaseOperator`` and ``TimeDeltaTrigger``.
DEFER_LOOP_DAG = """
class Loop(BaseOperator):
    def execute(self, context):
        self.defer(trigger=TimeDeltaTrigger(timedelta(0)), method_name="again",
                   kwargs={{"stamps": [time.time()]}})

    def again(self, context, event=None, stamps=()):
        stamps = [*stamps, time.time()]
        if len(stamps) <= {cycles}:
            self.defer(trigger=TimeDeltaTrigger(timedelta(0)), method_name="again",
                       kwargs={{"stamps": stamps}})
        return stamps

with DAG("defer_loop", schedule=None):
    Loop(task_id="loop")
"""

DAG_FILE = """
import time
{trace_start}
from datetime import timedelta
from engine import DAG, Asset, AssetWatcher, BaseOperator, task
from triggers import DirectoryFileDeleteTrigger, DirectoryWatchTrigger, TimeDeltaTrigger

scan = Asset("scan", watchers=[AssetWatcher("w", DirectoryFileDeleteTrigger(
    directory={scan_dir!r}, filename="go.flag", poke_interval=0.05))])
watched = Asset("watched", watchers=[AssetWatcher("w", DirectoryWatchTrigger(
    directory={watch_dir!r}, pattern="*.flag"))])
watched_fast = Asset("watched_fast", watchers=[AssetWatcher("w", DirectoryWatchTrigger(
    directory={fast_dir!r}, pattern="*.flag", debounce_ms={fast_debounce}))])

@task
def noop():
    return None

with DAG("on_scan", schedule=scan):
    noop()

with DAG("on_watch", schedule=watched):
    noop()

with DAG("on_watch_fast", schedule=watched_fast):
    noop()

{defer_loop}
{trace_end}
"""
#: with ``--trace``: the DAG file stamps the start and end of its import in this file
TRACE_FILE_ENV: Final = "SLUICE_BENCH_TRACE_FILE"
TRACE_START = "_started = time.time()"
TRACE_END = (
    "import os\n"
    "if os.environ.get('SLUICE_BENCH_TRACE_FILE'):\n"
    "    with open(os.environ['SLUICE_BENCH_TRACE_FILE'], 'a') as f:\n"
    "        f.write(f'{_started} {time.time()}\\n')\n"
)
FLAG_DAGS = ("on_scan", "on_watch", "on_watch_fast")


def _run_count(db: Database, dag_id: str) -> int:
    return int(
        db.call(
            lambda s: s.execute(
                select(func.count()).select_from(DagRun).where(DagRun.dag_id == dag_id)
            ).scalar_one()
        )
    )


async def _wait_count(db: Database, dag_id: str, count: int) -> float:
    while True:
        if await anyio.to_thread.run_sync(_run_count, db, dag_id) >= count:
            return time.perf_counter()
        await anyio.sleep(0.002)


async def _flag_latency(db: Database, folder: Path, dag_id: str, trials: int) -> list[float]:
    latencies = []
    for n in range(trials):
        await anyio.sleep(0.3)  # let the previous run's task finish; spread the trials
        started = time.perf_counter()
        (folder / ("go.flag" if dag_id == "on_scan" else f"f{n}.flag")).touch()
        latencies.append((await _wait_count(db, dag_id, n + 1)) - started)
    return latencies


async def _stamps(db: Database) -> list[float]:
    """The wall-clock stamps of the defer loop's steps (a cycle is the gap between two)."""
    await db.run(
        lambda s: runs.create_run(s, "defer_loop", run_type=runs.MANUAL, now=models.utcnow())
    )

    def state(session: Any) -> tuple[str, Any]:
        ti = session.execute(
            select(TaskInstance).where(TaskInstance.dag_id == "defer_loop")
        ).scalar_one()
        return ti.state, ti.xcoms

    # A read (no write lock, and on SQLite not queued behind the engine's own writes in
    # this process): the probe must not hold up the cycle it measures.
    while True:
        current, xcoms = await db.read(state)
        if current in ("success", "failed"):
            break
        await anyio.sleep(0.05)
    if current != "success":
        raise RuntimeError("the defer loop task failed; see its log")
    return [float(s) for s in deserialize_value(xcoms["return_value"])]  # type: ignore[attr-defined]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _main(home: Path, trials: int, cycles: int, *, warm: bool = True) -> dict[str, Any]:
    """One engine in ``home``: the defer cycle (and the flag latencies when ``trials``)."""
    dirs = {name: home / name for name in ("scan", "watch", "fast", "dags")}
    for folder in dirs.values():
        folder.mkdir(parents=True)
    text = DAG_FILE.format(
        scan_dir=str(dirs["scan"]),
        watch_dir=str(dirs["watch"]),
        fast_dir=str(dirs["fast"]),
        fast_debounce=FAST_DEBOUNCE_MS,
        defer_loop=DEFER_LOOP_DAG.format(cycles=cycles),
        trace_start=TRACE_START if TRACE_FILE_ENV in os.environ else "",
        trace_end=TRACE_END if TRACE_FILE_ENV in os.environ else "",
    )
    (dirs["dags"] / "bench.py").write_text(textwrap.dedent(text))
    config = load_config(
        environ={"SLUICE_HOME": str(home), "SLUICE__CORE__DAGS_FOLDER": str(dirs["dags"])}
    )
    tune_gc()  # the parts run as `sluice run` runs them
    db = Database(config.core.sql_alchemy_conn)
    migrate(db.engine)
    cipher = KwargsCipher.from_config("", home)
    names = ("dag-processor", "scheduler", "executor", "triggerer")
    parts = build_parts(config, names, db, cipher, {})
    executor = next(getattr(p.run, "__self__", None) for p in parts if p.name == "executor")
    assert isinstance(executor, LocalExecutor)
    executor.settings = replace(executor.settings, warm_runner=warm)
    results: dict[str, Any] = {"warm": warm}
    async with anyio.create_task_group() as tg:
        for part in parts:
            await tg.start(part.run)
        while (await db.run(dags_view.list_dags))["total"] < len(FLAG_DAGS) + 1:  # noqa: ASYNC110
            await anyio.sleep(0.05)  # the DAG processor parsed the file
        await anyio.sleep(1.0)  # the watchers are claimed and polling; the warm runner starts
        results["stamps"] = stamps = await _stamps(db)
        results["cycles_ms"] = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
        results["defer_cycle_ms"] = statistics.mean(results["cycles_ms"])
        results["cycles"] = cycles
        if executor.warm_runner is not None:
            runner = executor.warm_runner
            results["forks"], results["cold_fallbacks"] = runner.forks, runner.fallbacks
        if trials:
            for dag_id in FLAG_DAGS:
                folder = dirs[{"on_scan": "scan", "on_watch": "watch"}.get(dag_id, "fast")]
                results[dag_id] = [
                    ms * 1000 for ms in await _flag_latency(db, folder, dag_id, trials)
                ]
        for part in reversed(parts):
            if part.shutdown is not None:
                part.shutdown()
        tg.cancel_scope.cancel()
    db.dispose()
    return results


async def _idle_watch_cpu(debounce_ms: int, watchers: int, seconds: float) -> float:
    """Percent of a core that ``watchers`` idle ``DirectoryWatchTrigger``s use: each one's
    watchfiles thread wakes every ``min(debounce_ms, 50)`` ms to check for a stop."""

    async def watch(trigger: DirectoryWatchTrigger) -> None:
        async for _ in trigger.run():
            pass

    anyio.to_thread.current_default_thread_limiter().total_tokens = watchers + 10
    with tempfile.TemporaryDirectory() as tmp:
        async with anyio.create_task_group() as tg:
            for n in range(watchers):
                folder = Path(tmp) / str(n)
                folder.mkdir()
                tg.start_soon(watch, DirectoryWatchTrigger(str(folder), debounce_ms=debounce_ms))
            await anyio.sleep(1.0)  # all started
            cpu, wall = time.process_time(), time.monotonic()
            await anyio.sleep(seconds)
            share = (time.process_time() - cpu) / (time.monotonic() - wall) * 100
            tg.cancel_scope.cancel()
    return share


class Trace:
    """Wall-clock stamps of what the engine does in a cycle (``--trace``): the parts'
    transactions (queued, started, committed), spawns, child exits and wake-ups."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float, float, float]] = []  # label, queued, start, end

    def add(self, label: str, queued: float, start: float, end: float) -> None:
        self.events.append((label, queued, start, end))

    def install(self) -> None:
        from engine.db import database
        from engine.executor import forked_process, local, warm_process

        trace = self

        def label_of(fn: Any) -> str:
            while isinstance(fn, partial):
                fn = fn.func
            return getattr(fn, "__qualname__", repr(fn))

        def timed(db: Any, fn: Any, read_only: bool, queued: float) -> Any:
            start = time.time()
            try:
                return database.Database.call(db, fn, read_only=read_only)
            finally:
                trace.add(("read " if read_only else "") + label_of(fn), queued, start, time.time())

        async def run(db: Any, fn: Any) -> Any:
            call = partial(timed, db, fn, False, time.time())
            return await anyio.to_thread.run_sync(call, limiter=db._limiter)

        async def read(db: Any, fn: Any) -> Any:
            call = partial(timed, db, fn, True, time.time())
            return await anyio.to_thread.run_sync(call, limiter=db._read_limiter)

        database.Database.run = run  # type: ignore[method-assign]
        database.Database.read = read  # type: ignore[method-assign]
        spawn = warm_process.WarmRunner.spawn

        async def traced_spawn(runner: Any, **kwargs: Any) -> Any:
            start = time.time()
            try:
                return await spawn(runner, **kwargs)
            finally:
                trace.add("warm spawn", start, start, time.time())

        warm_process.WarmRunner.spawn = traced_spawn  # type: ignore[method-assign]
        until_gone = forked_process._until_gone

        async def traced_until_gone(pid: int) -> None:
            start = time.time()
            await until_gone(pid)
            trace.add("child exited", start, start, time.time())

        forked_process._until_gone = traced_until_gone
        nudge = local.LocalExecutor.nudge

        def traced_nudge(executor: Any) -> None:
            now = time.time()
            trace.add("executor nudged", now, now, now)
            nudge(executor)

        local.LocalExecutor.nudge = traced_nudge  # type: ignore[method-assign]

    def report(self, stamps: list[float]) -> None:
        """Per stage: in how many cycles it ran, the median offsets (ms from the step's
        stamp) at which it was queued, began and ended, and its median duration."""
        offsets: dict[str, list[tuple[float, float, float]]] = {}
        for a, b in itertools.pairwise(stamps):
            seen: dict[str, int] = {}
            for label, queued, start, end in sorted(self.events, key=lambda e: e[2]):
                if a <= start < b:
                    n = seen[label] = seen.get(label, 0) + 1
                    key = label if n == 1 else f"{label} #{n}"
                    offsets.setdefault(key, []).append(
                        ((queued - a) * 1000, (start - a) * 1000, (end - a) * 1000)
                    )
        cycles = len(stamps) - 1
        print(f"{'stage':58} {'cycles':>6} {'queued':>7} {'start':>7} {'end':>7} {'took':>6}")
        rows = sorted(offsets.items(), key=lambda kv: statistics.median(o[1] for o in kv[1]))
        for label, values in rows:
            if len(values) < cycles / 4:
                continue
            q, s, e = (statistics.median(v[i] for v in values) for i in range(3))
            took = statistics.median(v[2] - v[1] for v in values)
            print(f"{label[:58]:58} {len(values):>6} {q:7.1f} {s:7.1f} {e:7.1f} {took:6.1f}")


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _fmt(spread: dict[str, float]) -> str:
    return f"{spread['median']:.1f} ms (min {spread['min']:.1f}, max {spread['max']:.1f})"


def summarize(reps: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """min / median / max over the repetitions of each figure."""
    out: dict[str, Any] = {"defer_cycle": {}, "flag_file": {}}
    for mode in ("cold", "warm"):
        p50 = [statistics.median(r[mode]["cycles_ms"]) for r in reps]
        p99 = [_percentile(r[mode]["cycles_ms"], 0.99) for r in reps]
        out["defer_cycle"][mode] = {"p50_ms": _spread(p50), "p99_ms": _spread(p99)}
    ratios = [
        statistics.median(r["cold"]["cycles_ms"]) / statistics.median(r["warm"]["cycles_ms"])
        for r in reps
    ]
    out["defer_cycle"]["p50_cold_over_warm"] = _spread(ratios)
    for dag_id in FLAG_DAGS:
        p50 = [statistics.median(r["warm"][dag_id]) for r in reps]
        p90 = [statistics.quantiles(r["warm"][dag_id], n=10)[-1] for r in reps]
        out["flag_file"][dag_id] = {"p50_ms": _spread(p50), "p90_ms": _spread(p90)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=60, help="defer cycles per repetition")
    parser.add_argument("--trials", type=int, default=20, help="flag files per watcher and rep")
    parser.add_argument("--trace", action="store_true", help="break one warm run's cycle down")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.trace:
        trace = Trace()
        trace.install()
        with tempfile.TemporaryDirectory() as tmp:
            imports = Path(tmp) / "imports.txt"
            os.environ[TRACE_FILE_ENV] = str(imports)
            figures = anyio.run(partial(_main, Path(tmp) / "home", 0, args.cycles))
            for line in imports.read_text().splitlines():
                start, end = (float(word) for word in line.split())
                trace.add("DAG file imported", start, start, end)
        cycles = figures["cycles_ms"]
        print(
            f"warm: defer cycle p50 {statistics.median(cycles):.1f} ms, "
            f"p99 {_percentile(cycles, 0.99):.1f} ms over {len(cycles)} cycles, load "
            f"{os.getloadavg()}"
        )
        trace.report(figures["stamps"])
        return
    load_before = os.getloadavg()
    reps: list[dict[str, dict[str, Any]]] = []
    for rep in range(args.reps):
        figures: dict[str, dict[str, Any]] = {}
        for mode in ("cold", "warm"):  # alternating, in the same run
            with tempfile.TemporaryDirectory() as tmp:
                trials = args.trials if mode == "warm" else 0
                run = partial(_main, Path(tmp) / "home", trials, args.cycles, warm=mode == "warm")
                figures[mode] = anyio.run(run)
            del figures[mode]["stamps"]
            cycles = figures[mode]["cycles_ms"]
            print(
                f"rep {rep + 1} {mode}: defer cycle p50 {statistics.median(cycles):.1f} ms, "
                f"p99 {_percentile(cycles, 0.99):.1f} ms over {len(cycles)} cycles",
                flush=True,
            )
        reps.append(figures)
    idle = {
        debounce: [
            anyio.run(_idle_watch_cpu, debounce, IDLE_WATCHERS, 3.0) for _ in range(args.reps)
        ]
        for debounce in (DEFAULT_DEBOUNCE_MS, FAST_DEBOUNCE_MS)
    }
    load_after = os.getloadavg()
    summary = summarize(reps)
    summary["idle_watchers_cpu_percent"] = {str(d): _spread(v) for d, v in idle.items()}
    cycle = summary["defer_cycle"]
    print(f"\nload average (1/5/15 min) before {load_before}, after {load_after}")
    print(f"defer -> fire -> resume, over {args.reps} reps x {args.cycles} cycles (SQLite):")
    for mode, label in (("cold", "cold interpreter per step"), ("warm", "warm runner fork")):
        print(f"  {label:26}: p50 {_fmt(cycle[mode]['p50_ms'])}; p99 {_fmt(cycle[mode]['p99_ms'])}")
    ratio = cycle["p50_cold_over_warm"]
    print(
        f"  p50 cold / warm: {ratio['median']:.2f}x (min {ratio['min']:.2f}, "
        f"max {ratio['max']:.2f}) (Airflow's cycle: bench/compare_airflow.py measures it)"
    )
    print(f"flag file -> DAG run row, warm runs, {args.trials} files per watcher and rep:")
    labels = {
        "on_scan": "directory scan, poke_interval 0.05 s",
        "on_watch": f"inotify, debounce_ms={DEFAULT_DEBOUNCE_MS} (the default)",
        "on_watch_fast": f"inotify, debounce_ms={FAST_DEBOUNCE_MS}",
    }
    for dag_id, label in labels.items():
        fig = summary["flag_file"][dag_id]
        print(f"  {label:38}: p50 {_fmt(fig['p50_ms'])}; p90 {_fmt(fig['p90_ms'])}")
    print(f"  the price of a short debounce: {IDLE_WATCHERS} idle inotify watchers use")
    for debounce, spread in summary["idle_watchers_cpu_percent"].items():
        print(
            f"    debounce_ms={debounce:>3}: {spread['median']:.1f}% of a core (min "
            f"{spread['min']:.1f}, max {spread['max']:.1f})"
        )
    result = {
        "load_average_before": load_before,
        "load_average_after": load_after,
        "reps": args.reps,
        "cycles_per_rep": args.cycles,
        "flag_trials_per_rep": args.trials,
        "default_debounce_ms": DEFAULT_DEBOUNCE_MS,
        "fast_debounce_ms": FAST_DEBOUNCE_MS,
        "summary": summary,
        "raw": reps,
    }
    out = Path(__file__).parent / "results" / "engine.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
