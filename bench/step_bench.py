"""Engine step figures on SQLite and PostgreSQL: defer cycle, task step, runs/s, idle CPU.

Run by hand (never in tests):
    .venv/bin/python bench/step_bench.py [--db sqlite|postgres|both] [--reps 3] [--runs 1000]

The sibling of ``bench/engine_bench.py`` (which measures the cold / warm runner and the flag
file latencies on SQLite; it is near the module size limit, hence a module of its own). Each
repetition runs the engine parts as ``sluice run`` runs them (``engine.supervisor.
build_parts``: DAG processor, scheduler, executor with its warm runner, triggerer; one
process, their in-process wake-ups) on a fresh database (a temporary SQLite file, or a
fresh database on the local PostgreSQL server, dropped afterwards), alternating the
databases, ``--reps`` times:

1. idle CPU: the engine with only the bench's DAG file parsed and nothing to run, share of
   a core the whole process uses over ``--idle`` seconds (its children excluded: the warm
   runner sleeps);
2. defer -> fire -> resume: one task defers ``--cycles`` times on ``TimeDeltaTrigger(0)``,
   stamping the wall clock at every step; a cycle is the gap between two stamps;
3. task step: a chain of ``--steps`` plain ``@task`` steps, each returning the wall clock
   at its start; a step is the gap between two consecutive starts;
4. runs/s: ``--runs`` manual runs of a one-task DAG created in one transaction, at
   parallelism 8; the clock runs from their commit to the last run finished;
5. asset runs/s: ``--asset-runs`` one-task DAGs (generated in a DAG file of their own,
   which builds only the DAG its parsing context names in a task process, as Airflow's
   docs advise for generated DAGs), each scheduled on an asset of its own; one event of
   each asset is recorded in one transaction (as ``sluice assets emit`` records one), and
   the clock runs from its commit to the last of the runs they trigger finished.

``--variant NAME:KEY=VALUE,...`` (repeatable) runs engines with other settings, alternated
with the other variants in the same run: e.g. ``--variant now: --variant
old-polls:SLUICE__SCHEDULER__IDLE_POLL_INTERVAL_SEC=0.05`` for a before / after.

Figures are p50 / p99 per repetition, then median (min, max) over the repetitions; the
machine's load average is printed at start and end. Writes bench/results/steps.json.
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
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
from engine_bench import DEFER_LOOP_DAG
from sqlalchemy import create_engine, event, func, select, text

from engine.config import load_config
from engine.crypto import KwargsCipher
from engine.db import models
from engine.db.database import Database
from engine.db.models import DagRun, TaskInstance
from engine.db.queries import assets, runs
from engine.db.schema import migrate
from engine.supervisor import build_parts, tune_gc
from engine.views import dags as dags_view
from triggers.serde import deserialize_value

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy.orm import Session

PG_SERVER: Final = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
PARALLELISM: Final = 8
DAG_IDS: Final = ("defer_loop", "chain", "one")

# Generated DAGs as Airflow's docs advise writing them: a task process (whose parsing
# context names its DAG) builds its own DAG only, not all of them.
ASSET_DAG_FILE = """
from engine import DAG, Asset, get_parsing_context, task

@task
def noop():
    return None

wanted = get_parsing_context().dag_id
for n in range({count}):
    dag_id = f"on_asset_{{n:04d}}"
    if wanted is not None and wanted != dag_id:
        continue
    with DAG(dag_id, schedule=[Asset(f"bench_asset_{{n:04d}}")]):
        noop()
"""

DAG_FILE = """
import time
from datetime import timedelta
from engine import DAG, BaseOperator, task
from triggers import TimeDeltaTrigger

{defer_loop}

@task
def stamp():
    return time.time()

with DAG("chain", schedule=None):
    steps = [stamp.override(task_id=f"s{{n:02d}}")() for n in range({steps})]
    for a, b in zip(steps, steps[1:]):
        a >> b

@task
def noop():
    return None

with DAG("one", schedule=None, max_active_runs={runs}):
    noop()
"""


@contextmanager
def database_url(kind: str, home: Path) -> Iterator[str]:
    """A fresh database of ``kind`` for one repetition, dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{home / 'sluice.db'}"
        return
    name = f"bench_{uuid.uuid4().hex[:12]}"
    server = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_SERVER.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with server.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        server.dispose()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _gaps_ms(stamps: list[float]) -> list[float]:
    return [(b - a) * 1000 for a, b in itertools.pairwise(sorted(stamps))]


async def _trigger(db: Database, dag_id: str, count: int = 1) -> float:
    """Create ``count`` manual runs of ``dag_id`` in one transaction; the commit's clock.
    (A microsecond apart: a manual run's id is its time and 3 random bytes, which 1,000
    runs of one instant share now and then.)"""

    def create(session: Session) -> None:
        now = models.utcnow()
        for n in range(count):
            at = now + timedelta(microseconds=n)
            runs.create_run(session, dag_id, run_type=runs.MANUAL, now=at)

    await db.run(create)
    return time.time()


async def _emit_events(db: Database, count: int) -> float:
    """One event of each bench asset, recorded in one transaction; the commit's clock."""

    def emit(session: Session) -> None:
        for n in range(count):
            assets.emit_asset_event(
                session, f"bench_asset_{n:04d}", extra=None, source="api", created_by="bench"
            )

    await db.run(emit)
    return time.time()


async def _until_finished(db: Database, dag_id: str, count: int) -> float:
    """Wait until ``count`` runs of ``dag_id`` (a LIKE pattern) ended (a failed one is an
    error); the wall clock (``time.time()``) of the last one's end as the engine recorded it.
    The runs' own end times, not the moment a poll saw them: the poll can then be slow
    (every 50 ms), so that counting a thousand runs does not take the engine's database
    and cores from the runs it counts (every 5 ms, it took ~6% of the engine's process)."""

    def ended(session: Session) -> tuple[int, int, datetime | None]:
        rows = session.execute(
            select(DagRun.state, func.count(), func.max(DagRun.end_date))
            .where(DagRun.dag_id.like(dag_id), DagRun.state.in_(("success", "failed")))
            .group_by(DagRun.state)
        ).all()
        by_state = {str(state): (int(n), last) for state, n, last in rows}
        done, last = by_state.get("success", (0, None))
        return done, by_state.get("failed", (0, None))[0], last

    while True:
        done, failed, last = await db.read(ended)
        if failed:
            raise RuntimeError(f"{failed} run(s) of {dag_id} failed; see the task logs")
        if done >= count:
            assert last is not None
            return last.timestamp()
        await anyio.sleep(0.05)


async def _xcom_stamps(db: Database, dag_id: str) -> list[float]:
    def read(session: Session) -> list[Any]:
        return list(
            session.execute(select(TaskInstance.xcoms).where(TaskInstance.dag_id == dag_id))
            .scalars()
            .all()
        )

    stamps: list[float] = []
    for xcoms in await db.read(read):
        value = deserialize_value(xcoms["return_value"])  # type: ignore[no-untyped-call]
        stamps.extend(value if isinstance(value, list) else [value])
    return [float(s) for s in stamps]


async def _chain_phases(db: Database) -> dict[str, float]:
    """Where a chain step's time goes, median over the steps (ms): the upstream's end ->
    the downstream queued by the executor (the scheduler's decision and the claim), queued
    -> marked running (the executor's start transaction), running -> the body's first line
    (the fork from the warm runner, the DAG file's import, the task runner's set-up), and
    the body -> its end recorded (the task's return, its results and state stored)."""

    def read(session: Session) -> list[Any]:
        return list(
            session.execute(
                select(
                    TaskInstance.task_id,
                    TaskInstance.queued_at,
                    TaskInstance.start_date,
                    TaskInstance.end_date,
                    TaskInstance.xcoms,
                )
                .where(TaskInstance.dag_id == "chain")
                .order_by(TaskInstance.task_id)
            ).all()
        )

    rows = await db.read(read)
    phases: dict[str, list[float]] = {
        "end_to_queued": [],
        "queued_to_running": [],
        "running_to_body": [],
        "body_to_end": [],
    }
    for prev, row in itertools.pairwise(rows):
        body = float(deserialize_value(row.xcoms["return_value"]))  # type: ignore[no-untyped-call]
        phases["end_to_queued"].append((row.queued_at - prev.end_date).total_seconds() * 1000)
        phases["queued_to_running"].append((row.start_date - row.queued_at).total_seconds() * 1000)
        phases["running_to_body"].append((body - row.start_date.timestamp()) * 1000)
        phases["body_to_end"].append((row.end_date.timestamp() - body) * 1000)
    return {name: statistics.median(values) for name, values in phases.items()}


class SqlCount:
    """Statements, transactions and pool checkouts on the engine's database (all parts),
    counted between ``start()`` and ``take()``: the round trips per state change."""

    def __init__(self, db: Database) -> None:
        self.counts = dict.fromkeys(("statements", "commits", "checkouts"), 0)
        for name, key in (
            ("before_cursor_execute", "statements"),
            ("commit", "commits"),
            ("checkout", "checkouts"),
        ):
            target = db.engine.pool if name == "checkout" else db.engine
            event.listen(target, name, partial(self._add, key))

    def _add(self, key: str, *_args: Any, **_kwargs: Any) -> None:
        self.counts[key] += 1

    def take(self, per: int) -> dict[str, float]:
        """The counts since the last ``take``, divided by ``per`` (cycles, steps)."""
        taken = {key: n / per for key, n in self.counts.items()}
        self.counts = dict.fromkeys(self.counts, 0)
        return taken


async def _idle_cpu(seconds: float) -> float:
    cpu, wall = time.process_time(), time.monotonic()
    await anyio.sleep(seconds)
    return (time.process_time() - cpu) / (time.monotonic() - wall)


async def _one_rep(
    kind: str, home: Path, args: argparse.Namespace, settings: dict[str, str]
) -> dict[str, Any]:
    dags = home / "dags"
    dags.mkdir(parents=True)
    source = DAG_FILE.format(
        defer_loop=DEFER_LOOP_DAG.format(cycles=args.cycles), steps=args.steps, runs=args.runs
    )
    (dags / "bench.py").write_text(textwrap.dedent(source))
    if args.asset_runs:
        (dags / "bench_assets.py").write_text(ASSET_DAG_FILE.format(count=args.asset_runs))
    with database_url(kind, home) as url:
        environ = {
            "SLUICE_HOME": str(home),
            "SLUICE__CORE__DAGS_FOLDER": str(dags),
            "SLUICE__CORE__SQL_ALCHEMY_CONN": url,
            "SLUICE__CORE__PARALLELISM": str(PARALLELISM),
            **settings,
        }
        config = load_config(environ=environ)
        tune_gc()
        db = Database(config.core.sql_alchemy_conn)
        migrate(db.engine)
        try:
            return await _measure(config, db, home, args)
        finally:
            db.dispose()


async def _measure(config: Any, db: Database, home: Path, args: argparse.Namespace) -> dict:
    cipher = KwargsCipher.from_config("", home)
    names = ("dag-processor", "scheduler", "executor", "triggerer")
    parts = build_parts(config, names, db, cipher, {})
    out: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:
        for part in parts:
            await tg.start(part.run)
        wanted = len(DAG_IDS) + args.asset_runs
        while (await db.read(dags_view.list_dags))["total"] < wanted:  # noqa: ASYNC110
            await anyio.sleep(0.05)  # the DAG processor parsed the file
        await anyio.sleep(1.0)  # the warm runner starts, the first parse's writes settle
        # The bench's own writes and polls go through an engine of their own (as the API's
        # would), so that ``SqlCount`` counts the parts' statements only.
        probe = Database(db.url)
        out["idle_cpu_cores"] = await _idle_cpu(args.idle)
        sql = SqlCount(db)
        await _trigger(probe, "defer_loop")
        await _until_finished(probe, "defer_loop", 1)
        out["defer_sql"] = sql.take(args.cycles)
        out["defer_ms"] = _gaps_ms(await _xcom_stamps(probe, "defer_loop"))
        sql.take(1)
        await _trigger(probe, "chain")
        await _until_finished(probe, "chain", 1)
        out["step_sql"] = sql.take(args.steps)
        out["step_ms"] = _gaps_ms(await _xcom_stamps(probe, "chain"))
        out["step_phases_ms"] = await _chain_phases(probe)
        started = await _trigger(probe, "one", args.runs)
        out["runs_per_s"] = args.runs / (await _until_finished(probe, "one", args.runs) - started)
        if args.asset_runs:
            started = await _emit_events(probe, args.asset_runs)
            ended = await _until_finished(probe, "on_asset_%", args.asset_runs)
            out["asset_runs_per_s"] = args.asset_runs / (ended - started)
        probe.dispose()
        for part in reversed(parts):
            if part.shutdown is not None:
                part.shutdown()
        tg.cancel_scope.cancel()
    return out


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Median (min, max) over the repetitions of each figure."""
    summary: dict[str, Any] = {}
    for key in ("defer_ms", "step_ms"):
        summary[key] = {
            "p50": _spread([statistics.median(r[key]) for r in reps]),
            "p99": _spread([_percentile(r[key], 0.99) for r in reps]),
        }
        summary[key.replace("_ms", "_sql")] = {
            what: statistics.median(r[key.replace("_ms", "_sql")][what] for r in reps)
            for what in reps[0][key.replace("_ms", "_sql")]
        }
    summary["step_phases_ms"] = {
        name: statistics.median(r["step_phases_ms"][name] for r in reps)
        for name in reps[0]["step_phases_ms"]
    }
    summary["runs_per_s"] = _spread([r["runs_per_s"] for r in reps])
    if all("asset_runs_per_s" in r for r in reps):
        summary["asset_runs_per_s"] = _spread([r["asset_runs_per_s"] for r in reps])
    summary["idle_cpu_cores"] = _spread([r["idle_cpu_cores"] for r in reps])
    return summary


def _fmt(spread: dict[str, float], digits: int = 1) -> str:
    return f"{spread['median']:.{digits}f} ({spread['min']:.{digits}f}-{spread['max']:.{digits}f})"


def _print(kind: str, s: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"{kind} ({args.reps} reps; median (min-max) over reps):")
    for key, label in (("defer_ms", "defer cycle"), ("step_ms", "task step")):
        sql = s[key.replace("_ms", "_sql")]
        print(
            f"  {label:12} p50 {_fmt(s[key]['p50'])} ms, p99 {_fmt(s[key]['p99'])} ms; "
            f"{sql['statements']:.0f} statements, {sql['commits']:.0f} commits, "
            f"{sql['checkouts']:.0f} pool checkouts each (the engine's parts)"
        )
    phases = ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in s["step_phases_ms"].items())
    print(f"  step phases  {phases} ms (medians)")
    print(f"  runs/s       {_fmt(s['runs_per_s'])} ({args.runs} one-task runs, parallelism 8)")
    if "asset_runs_per_s" in s:
        print(
            f"  asset runs/s {_fmt(s['asset_runs_per_s'])} ({args.asset_runs} asset events -> "
            "as many one-task runs of as many DAGs, parallelism 8)"
        )
    print(f"  idle CPU     {_fmt(s['idle_cpu_cores'], 3)} cores (the engine's process)")


def _variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:KEY=VALUE,KEY=VALUE`` -> (NAME, settings); ``NAME:`` is the configured engine."""
    name, _, pairs = text.partition(":")
    return name, dict(pair.split("=", 1) for pair in pairs.split(",") if pair)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=20, help="defer cycles per repetition")
    parser.add_argument("--steps", type=int, default=20, help="chained @task steps")
    parser.add_argument("--runs", type=int, default=1000, help="one-task runs for runs/s")
    parser.add_argument(
        "--asset-runs", type=int, default=1000, help="asset events -> runs (0: not measured)"
    )
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU sampled")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "steps.json"))
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="engines with these SLUICE__ settings, alternated with the other variants",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    databases = ("sqlite", "postgres") if args.db == "both" else (args.db,)
    variants = dict(_variant(v) for v in args.variant) or {"": {}}
    kinds = [f"{db}{name and ' ' + name}" for db in databases for name in variants]
    load_before = os.getloadavg()
    print(f"load average (1/5/15 min) at start: {load_before}", flush=True)
    reps: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for rep in range(args.reps):
        for kind in kinds:  # alternating, in the same run
            with tempfile.TemporaryDirectory() as tmp:
                db_kind, _, name = kind.partition(" ")
                one = partial(_one_rep, db_kind, Path(tmp) / "home", args, variants[name])
                figures = anyio.run(one)
            reps[kind].append(figures)
            print(
                f"rep {rep + 1} {kind}: defer p50 {statistics.median(figures['defer_ms']):.1f}"
                f" ms, step p50 {statistics.median(figures['step_ms']):.1f} ms, "
                f"{figures['runs_per_s']:.1f} runs/s, idle {figures['idle_cpu_cores']:.3f} "
                f"cores, load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    load_after = os.getloadavg()
    summaries = {kind: summarize(reps[kind]) for kind in kinds}
    print(f"\nload average at start {load_before}, at end {load_after}")
    for kind in kinds:
        _print(kind, summaries[kind], args)
    result = {
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "args": vars(args),
        "summary": summaries,
        "raw": reps,
    }
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
