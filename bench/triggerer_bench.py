"""Triggerer figures: claim rates, RSS per idle trigger, idle CPU; min/median/max of reps.

Run by hand (never in tests):

    .venv/bin/python bench/triggerer_bench.py [--reps 3] [--idle 100000] [--claim 20000]
        [--into 1000] [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]
        [--million] [--baseline /path/to/an/older/checkout]

Every measurement runs in a fresh interpreter (freed memory of one does not flatter the
next), repeated ``--reps`` times; the table gives min / median / max.

* ``claim``: N TimeDeltaTrigger rows (encrypted, one day ahead) are inserted, a Triggerer
  with capacity N starts, and the time from its start to N triggers running is measured
  (claim query + decrypt + import + construct + start the task).
* ``into``: the "1,000 triggers into a running triggerer" figure: a Triggerer at its
  default settings is up and idle, another connection commits N deferred tasks' rows
  (nobody nudges it), and the time from that commit to all N running is measured.
* ``idle``: RSS per idle trigger (resident memory with N idle triggers running, minus
  before, over N), the process's total RSS, and its CPU over ``--idle-seconds`` as % of
  one core. ``--million`` adds the same with 1,000,000 triggers (slow: minutes).

``--pg URL`` (a server's URL; the database in it is only used to connect) also measures
``claim`` and ``into`` on PostgreSQL, each repetition in a fresh database created for it
and dropped afterwards. ``--baseline PATH`` runs every measurement also with the code of
another checkout (its ``engine``/``triggers`` packages first on ``PYTHONPATH``), alternating
which goes first; ratios are printed only against that baseline, measured in the same run.
Airflow's own figures are measured side by side by bench/compare_airflow.py.

Writes bench/results/triggerer.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

PAGE = os.sysconf("SC_PAGE_SIZE")
HERE = Path(__file__).resolve().parent


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


# -- the measurements, run in a child interpreter -------------------------------------------


def seed(db: Any, cipher: Any, n: int) -> None:
    """N deferred task instances, each waiting on its own TimeDeltaTrigger (one day ahead)."""
    from sqlalchemy import insert

    from engine.db import models
    from engine.db.models import Dag, DagRun, TaskInstance, Trigger
    from engine.states import TaskState, TriggerKind
    from triggers import TimeDeltaTrigger

    classpath, kwargs = TimeDeltaTrigger(timedelta(days=1)).serialize()
    token = cipher.encrypt_kwargs(kwargs, owner=classpath)

    def chunk(session: Any, start: int, stop: int, run_id: int) -> None:
        now = models.utcnow()
        rows = [
            {"classpath": classpath, "kwargs": token, "kind": TriggerKind.TASK, "created_date": now}
            for _ in range(start, stop)
        ]
        ids = session.execute(insert(Trigger).returning(Trigger.id), rows).scalars().all()
        session.execute(
            insert(TaskInstance),
            [
                {
                    "dag_run_id": run_id,
                    "dag_id": "bench",
                    "task_id": f"t{start + i}",
                    "state": TaskState.DEFERRED,
                    "trigger_id": tid,
                    "next_method": "resume",
                }
                for i, tid in enumerate(ids)
            ],
        )

    def make_run(session: Any) -> int:
        if session.get(Dag, "bench") is None:
            session.execute(insert(Dag).values(dag_id="bench", fileloc="bench.py"))
        return int(
            session.execute(
                insert(DagRun)
                .values(dag_id="bench", run_id=f"bench-{uuid.uuid4().hex}", run_type="manual")
                .returning(DagRun.id)
            ).scalar_one()
        )

    run_id = db.call(make_run)
    for start in range(0, n, 5000):
        stop = min(n, start + 5000)
        db.call(lambda s, a=start, b=stop: chunk(s, a, b, run_id))


async def _claim_and_idle(db: Any, cipher: Any, n: int, idle_s: float) -> dict[str, float]:
    import anyio

    from engine.triggerer.settings import TriggererSettings
    from engine.triggerer.triggerer import Triggerer

    settings = TriggererSettings(
        capacity=n,
        heartbeat_s=5,
        health_check_threshold_s=30,
        claim_idle_interval_s=0.2,
        cleanup_interval_s=3600,
    )
    triggerer = Triggerer(db=db, cipher=cipher, settings=settings)
    rss_before = rss_bytes()
    async with anyio.create_task_group() as tg:
        started = time.perf_counter()
        await tg.start(triggerer.run)
        while True:  # poll: the figure includes the claim loop's pace
            if len(triggerer.runner) >= n:
                break
            await anyio.sleep(0.01)
        claim_s = time.perf_counter() - started
        await anyio.sleep(1.0)  # let every trigger reach its sleep
        rss_after = rss_bytes()
        cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        await anyio.sleep(idle_s)
        cpu1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        triggerer.shutdown()
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    return {
        "triggers": n,
        "claim_seconds": claim_s,
        "claims_per_s": n / claim_s,
        "rss_per_trigger_bytes": (rss_after - rss_before) / n,
        "rss_total_bytes": rss_after,
        "idle_cpu_percent": 100 * cpu / (wall1 - wall0),
    }


async def _claim_into_running(db: Any, cipher: Any, n: int) -> dict[str, float]:
    import anyio

    from engine.triggerer.settings import TriggererSettings
    from engine.triggerer.triggerer import Triggerer

    settings = TriggererSettings(capacity=max(n, 1000), cleanup_interval_s=3600)  # defaults
    triggerer = Triggerer(db=db, cipher=cipher, settings=settings)
    other = type(db)(db.url)  # another connection pool: "another process" commits the rows
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(triggerer.run)
            await anyio.sleep(2.0)  # up and idle, as Airflow's triggerer is in the comparison
            await anyio.to_thread.run_sync(seed, other, cipher, n)
            committed = time.perf_counter()
            while True:  # poll, as the Airflow side polls its trigger log files
                if len(triggerer.runner) >= n:
                    break
                await anyio.sleep(0.002)
            claim_s = time.perf_counter() - committed
            triggerer.shutdown()
    finally:
        other.dispose()
    return {"triggers": n, "claim_seconds": claim_s, "claims_per_s": n / claim_s}


@contextmanager
def _database(url: str) -> Iterator[tuple[Any, Any]]:
    from cryptography.fernet import Fernet

    from engine.crypto import KwargsCipher
    from engine.db.database import Database
    from engine.db.schema import migrate
    from engine.supervisor import tune_gc

    tune_gc()  # as `sluice triggerer` does
    cipher = KwargsCipher(Fernet.generate_key().decode())
    db = Database(url)
    migrate(db.engine)
    try:
        yield db, cipher
    finally:
        db.dispose()


def measure(url: str, n: int, idle_s: float) -> dict[str, float]:
    """``claim``/``idle``: seed N rows, then start a triggerer with capacity N."""
    import anyio

    with _database(url) as (db, cipher):
        seed(db, cipher, n)
        return dict(anyio.run(_claim_and_idle, db, cipher, n, idle_s))


def claim_into_running(url: str, n: int) -> dict[str, float]:
    """``into``: from the commit of N deferred tasks' triggers (nobody nudges the running
    triggerer, at its default settings) to all N running."""
    import anyio

    with _database(url) as (db, cipher):
        return dict(anyio.run(_claim_into_running, db, cipher, n))


# -- the driver ------------------------------------------------------------------------------


@contextmanager
def fresh_database(kind: str, pg: str | None, tmp: Path) -> Iterator[str]:
    """A new empty database for one measurement: a SQLite file, or a PostgreSQL database
    created on the ``pg`` server and dropped afterwards (also when the measurement failed)."""
    name = f"sluice_bench_{uuid.uuid4().hex[:12]}"
    if kind == "sqlite":
        path = tmp / f"{name}.db"
        try:
            yield f"sqlite:///{path}"
        finally:
            for leftover in tmp.glob(f"{name}.db*"):
                leftover.unlink()
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    assert pg is not None
    admin = create_engine(pg, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(pg).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def run_child(args: list[str], code: Path | None) -> dict[str, float]:
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, __file__, "--one", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"measurement {args} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(runs: list[dict[str, float]]) -> dict[str, Any]:
    keys = [k for k in runs[0] if k != "triggers"]
    return {
        "triggers": runs[0]["triggers"],
        "reps": len(runs),
        **{k: spread([r[k] for r in runs]) for k in keys},
        "runs": runs,
    }


def plan(args: argparse.Namespace) -> list[tuple[str, str, list[str]]]:
    """(figure name, database kind, child arguments without the URL)."""
    figures = [
        ("sqlite_claim", "sqlite", ["claim", str(args.claim), "1"]),
        ("sqlite_into_running", "sqlite", ["into", str(args.into)]),
        ("sqlite_idle", "sqlite", ["claim", str(args.idle), str(args.idle_seconds)]),
    ]
    if args.pg:
        figures += [
            ("postgres_claim", "postgres", ["claim", str(args.claim), "1"]),
            ("postgres_into_running", "postgres", ["into", str(args.into)]),
        ]
    if args.million:
        figures.append(("sqlite_idle_1m", "sqlite", ["claim", "1000000", str(args.idle_seconds)]))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions (>= 3 for a spread)")
    parser.add_argument("--idle", type=int, default=100_000, help="idle triggers for RSS/CPU")
    parser.add_argument("--claim", type=int, default=20_000, help="triggers for the claim rate")
    parser.add_argument("--into", type=int, default=1000, help="triggers into a running one")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--pg", default=None, help="PostgreSQL server URL (fresh db per rep)")
    parser.add_argument("--million", action="store_true", help="also 1M idle triggers (slow)")
    parser.add_argument("--only", default=None, help="comma list of figure names to run")
    parser.add_argument("--baseline", type=Path, default=None, help="checkout to compare with")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "triggerer.json")
    parser.add_argument("--one", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, url, n, *rest = args.one
        if kind == "into":
            fig = claim_into_running(url, int(n))
        else:
            fig = measure(url, int(n), float(rest[0]))
        print(json.dumps(fig))
        return
    systems: dict[str, Path | None] = {"sluice": None}
    if args.baseline is not None:
        systems["baseline"] = args.baseline.resolve()
    figures = plan(args)
    if args.only:
        figures = [f for f in figures if f[0] in set(args.only.split(","))]
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    load_start = os.getloadavg()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for index, (name, kind, child) in enumerate(figures):
                order = list(systems)
                if (rep + index) % 2:
                    order.reverse()
                for system in order:
                    with fresh_database(kind, args.pg, Path(tmp)) as url:
                        fig = run_child([child[0], url, *child[1:]], systems[system])
                    runs.setdefault(name, {}).setdefault(system, []).append(fig)
                    print(f"rep {rep + 1} {name:22s} {system:8s} {_brief(fig)}", flush=True)
    results: dict[str, Any] = {
        "machine": {
            "cores": os.cpu_count(),
            "python": sys.version.split()[0],
            "load_average_at_start": load_start,
            "load_average_at_end": os.getloadavg(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "settings": {k: str(v) for k, v in vars(args).items() if k != "one"},
        "figures": {
            name: {system: summarize(reps) for system, reps in by_system.items()}
            for name, by_system in runs.items()
        },
    }
    print_table(results["figures"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"written {args.out}")


def _brief(fig: dict[str, float]) -> str:
    parts = [f"n={int(fig['triggers'])}", f"claims/s={fig['claims_per_s']:,.0f}"]
    if "rss_per_trigger_bytes" in fig:
        parts += [
            f"rss/trigger={fig['rss_per_trigger_bytes'] / 1024:.2f} KiB",
            f"rss={fig['rss_total_bytes'] / 2**20:,.0f} MiB",
            f"idle cpu={fig['idle_cpu_percent']:.1f}%",
        ]
    return "  ".join(parts)


TABLE_KEYS = (
    ("claims_per_s", "claims/s", 1.0),
    ("rss_per_trigger_bytes", "KiB/trigger", 1 / 1024),
    ("rss_total_bytes", "MiB RSS", 1 / 2**20),
    ("idle_cpu_percent", "idle CPU %", 1.0),
)


def print_table(figures: dict[str, dict[str, dict[str, Any]]]) -> None:
    stats = " ".join(f"{stat:>10s}" for stat in ("min", "median", "max"))
    print(f"\n{'figure':22s} {'system':8s} {'metric':12s} {stats}")
    for name, by_system in figures.items():
        for system, summary in by_system.items():
            for key, label, scale in TABLE_KEYS:
                if key not in summary:
                    continue
                s = summary[key]
                cells = " ".join(f"{s[stat] * scale:>10,.2f}" for stat in ("min", "median", "max"))
                ratio = ""
                base = by_system.get("baseline")
                if system == "sluice" and base is not None and key in base:
                    ratio = f"  x{s['median'] / base[key]['median']:.2f} of the baseline's median"
                print(f"{name:22s} {system:8s} {label:12s} {cells}{ratio}")


if __name__ == "__main__":
    main()
