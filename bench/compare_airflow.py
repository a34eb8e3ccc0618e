"""Sluice side by side with Apache Airflow 3.3.2, on the same machine, in the same run.

Run by hand (never in tests):

    .venv/bin/pip install -e '.[bench]'                  # matplotlib, for the chart
    .venv/bin/python bench/compare_airflow.py            # full mode: 3 reps of every row
    .venv/bin/python bench/compare_airflow.py --quick    # a smoke run: 1 rep, small sizes

Creates bench/.venv-airflow (ignored by git) with ``apache-airflow-core==3.3.2`` from PyPI if
it is missing, and a migrated Airflow SQLite template DB in it. Each workload run is a fresh
subprocess printing one JSON line per figure: the Sluice side is bench/compare_airflow_sluice.py
under Sluice's python (it calls the existing Sluice benches), the Airflow side a script of
bench/_airflow_side/ under the Airflow venv's python (it drives Airflow's own classes and
CLI). For every configuration the two systems run back to back, alternating which goes
first, repeated (3 times by default, every row); the summary gives median, min-max and the
ratio Sluice/Airflow of medians (with the min-max of the per-repetition ratios), because
other processes on the machine make absolute figures noisy while a ratio taken within one
repetition is robust. Every ratio is between figures of this run: no remembered or
hard-coded figure of either system is used. A row with fewer than 3 repetitions a side
(``--quick``, ``--reps 1``) is marked as such in the table.

Workloads (equal settings on both sides; both default to subscriber queue 1024 and ack
timeout 300 s, which are used):
1. fanout: shared-stream fan-out, fast and ack mode, N = 1, 10, 100 subscribers, raw
   events/s and deliveries/s, manager alone and through the trigger runtime, at WARNING and
   at INFO (the default level of both systems).
2. latency: yield -> advance p50/p99, the real triggerer of each system on SQLite, an
   ack-mode producer at 20 events/s (a rate Airflow's supervisor sustains: it commits each
   trigger event in its own transaction), 1 and 10 subscribers, INFO.
3. claim: triggers/s taken into one running triggerer, from the commit of N deferred
   TimeDeltaTriggers to all N running: N = 1000 at default settings and N = 10,000 with
   capacity 10,000 on both (Airflow still takes its default 50 per loop), INFO;
   rss: RSS per idle TimeDeltaTrigger at 10k and 100k (WARNING: at INFO
   Airflow opens one log file per deferred-task trigger, and 100k exceed this machine's
   open-file limit; Airflow with capacity and max_trigger_to_select_per_loop = N).
4. cycle: defer -> fire -> resume, one task deferring on TimeDeltaTrigger(0) 10 times; Airflow
   with its api-server, scheduler (LocalExecutor) and triggerer, Sluice with all its parts.

What a user meets, each a fresh ``sluice run`` against a whole Airflow (api-server,
scheduler with LocalExecutor, dag-processor, triggerer) on SQLite, one command each:
5. event (``--only event``): a Kafka message sent -> the asset-triggered DAG's one task body
   running, p50/p99 over 20 messages 1 s apart (5 with ``--quick``), after one warm-up
   message; Sluice's KafkaMessageTrigger against the Kafka provider's
   KafkaMessageQueueTrigger in an AssetWatcher, one tansu broker (started here, as the tests
   do) for both, a fresh topic per side's run.
6. dagfiles (``--only dagfiles``): 300 generated DAG files of 3 TaskFlow tasks (30 with
   ``--quick``), first full parse (until every DAG is stored) and idle CPU over 60 s after
   (20 s); ``sluice run`` (bench/dag_files_bench.py's case) against ``airflow dag-processor``.
7. runs (``--only runs``): 1,000 manual runs (50 with ``--quick``) of a one-task DAG created
   through each system's own ``trigger_dag`` -> all finished, runs/s at parallelism 8.

The load average is printed at the start and the end. Writes
bench/results/compare_airflow.json (every raw run, the summary, the machine) and
bench/results/compare_airflow.png (the ratios, log scale, with the issue's targets);
``--quick`` writes compare_airflow.quick.{json,png} instead, and ``--only a,b`` writes
compare_airflow.a-b[.quick].{json,png}, never the whole run's files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compare_airflow_report import brief, chart, print_summary, summarize

AIRFLOW_VERSION = "3.3.2"
BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
AIRFLOW_VENV = BENCH / ".venv-airflow"
AIRFLOW_PY = AIRFLOW_VENV / "bin" / "python"
# beside the venv, not in it: a venv shared between checkouts (a symlink) keeps its own files
TEMPLATE_DIR = BENCH / ".venv-airflow-template"
# the Kafka provider (AwaitMessageTrigger, KafkaMessageQueueTrigger) and common-messaging
# (MessageQueueTrigger), for the event workload's AssetWatcher
AIRFLOW_PROVIDERS = (
    "apache-airflow-providers-apache-kafka==2.1.0",
    "apache-airflow-providers-common-messaging==2.1.2",
)
AIRFLOW_SIDE = BENCH / "_airflow_side"
SLUICE_SIDE = BENCH / "compare_airflow_sluice.py"
RESULTS = BENCH / "results"
RUN_TIMEOUT_S = 1200
WORKLOADS = ("fanout", "latency", "claim", "rss", "cycle", "event", "dagfiles", "runs")


# -- environments ------------------------------------------------------------------------


def _run(cmd: list[str], **kwargs: Any) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kwargs).stdout


def ensure_airflow_venv() -> str:
    """The Airflow venv under bench/ (created once, the providers added to an older one);
    returns the installed core version."""
    wanted = [AIRFLOW_VERSION, *(p.split("==")[1] for p in AIRFLOW_PROVIDERS)]
    names = ["apache-airflow-core", *(p.split("==")[0] for p in AIRFLOW_PROVIDERS)]
    probe = [
        str(AIRFLOW_PY),
        "-c",
        "import importlib.metadata as m\n"
        f"for n in {names!r}:\n"
        "    try: print(m.version(n))\n"
        "    except m.PackageNotFoundError: print('-')",
    ]
    if AIRFLOW_PY.exists():
        try:
            installed = _run(probe).split()
        except subprocess.CalledProcessError:
            installed = []
        if installed == wanted:
            return AIRFLOW_VERSION
        if installed and installed[0] == AIRFLOW_VERSION:
            print(f"adding {', '.join(AIRFLOW_PROVIDERS)} to {AIRFLOW_VENV} ...", flush=True)
            pip = [str(AIRFLOW_PY), "-m", "pip", "install", "--quiet"]
            subprocess.run(
                [*pip, f"apache-airflow-core=={AIRFLOW_VERSION}", *AIRFLOW_PROVIDERS], check=True
            )
            return _run(probe).split()[0]
    print(f"creating {AIRFLOW_VENV} with apache-airflow-core=={AIRFLOW_VERSION} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(AIRFLOW_VENV)], check=True)
    pip = [str(AIRFLOW_PY), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run(
        [*pip, f"apache-airflow-core=={AIRFLOW_VERSION}", *AIRFLOW_PROVIDERS], check=True
    )
    shutil.rmtree(TEMPLATE_DIR, ignore_errors=True)
    return _run(probe).split()[0]


def ensure_template() -> Path:
    """A migrated Airflow SQLite DB with the bench DAGs serialized, copied by every run."""
    dags = sorted((AIRFLOW_SIDE / "dags").glob("*.py"))
    stamp = AIRFLOW_VERSION + "".join(p.read_text() for p in dags)
    db = TEMPLATE_DIR / "airflow.db"
    stamp_file = TEMPLATE_DIR / "stamp"
    if db.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return db
    print(
        "migrating the Airflow template DB (airflow db migrate, dags reserialize) ...", flush=True
    )
    shutil.rmtree(TEMPLATE_DIR, ignore_errors=True)
    TEMPLATE_DIR.mkdir(parents=True)
    key = _run(
        [
            str(AIRFLOW_PY),
            "-c",
            "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())",
        ]
    )
    (TEMPLATE_DIR / "fernet.key").write_text(key.strip())
    sys.path.insert(0, str(AIRFLOW_SIDE))
    from common import base_env  # the Airflow side's own helper, stdlib-only at import

    env = {**os.environ, **base_env(TEMPLATE_DIR, db, "WARNING", key.strip())}
    airflow = str(AIRFLOW_VENV / "bin" / "airflow")
    _run([airflow, "db", "migrate"], env=env)
    _run([airflow, "dags", "reserialize"], env=env)
    stamp_file.write_text(stamp)
    return db


def require_matplotlib() -> None:
    """matplotlib is in the ``bench`` extra; stop at once, saying how to get it, if missing
    (checked before anything runs, not after twenty minutes of measurements)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit(
            "bench/compare_airflow.py draws its chart with matplotlib, which is not installed "
            f"in {sys.prefix}: install the bench extra with  {sys.executable} -m pip install "
            "-e '.[bench]'  (from the repository root), then run this again."
        )


def machine_info(airflow_core: str) -> dict[str, Any]:
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    airflow_py = _run([str(AIRFLOW_PY), "-c", "import platform; print(platform.python_version())"])
    from importlib.metadata import version

    try:
        commit = _run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        commit = "unknown"
    return {
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "os": platform.platform(),
        "python_sluice": platform.python_version(),
        "python_airflow": airflow_py.strip(),
        "sluice_version": version("sluice"),
        "sluice_commit": commit,
        "apache_airflow_core_version": airflow_core,
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "load_average_at_start": os.getloadavg(),
    }


# -- the plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One workload configuration: the same arguments on both sides."""

    workload: str
    label: str
    sluice: list[str]
    airflow: list[str]
    reps: int


@dataclass
class Plan:
    quick: bool
    configs: list[Config] = field(default_factory=list)


def build_plan(quick: bool, reps: int | None, only: set[str] | None) -> Plan:
    plan = Plan(quick)
    r = reps if reps is not None else (1 if quick else 3)
    sizes = {1: 2000, 10: 500, 100: 200} if quick else {1: 10_000, 10: 2000, 100: 500}
    tmpl = ["--template", str(TEMPLATE_DIR / "airflow.db")]
    want = only or set(WORKLOADS)
    if "fanout" in want:
        for level in ("WARNING", "INFO"):
            for mode in ("fast", "ack"):
                for n, m in sizes.items():
                    args = ["--mode", mode, "--subscribers", str(n), "--events", str(m)]
                    plan.configs.append(
                        Config(
                            "fanout",
                            f"{mode} N={n} {level}",
                            ["--level", level, "fanout", *args],
                            [str(AIRFLOW_SIDE / "fanout.py"), "--level", level, *args],
                            r,
                        )
                    )
    if "latency" in want:
        events = "40" if quick else "100"
        for subs in (1,) if quick else (1, 10):
            args = ["--subscribers", str(subs), "--rate", "20", "--events", events]
            plan.configs.append(
                Config(
                    "latency",
                    f"N={subs}",
                    ["--level", "INFO", "latency", *args],
                    [str(AIRFLOW_SIDE / "latency.py"), *tmpl, *args],
                    r,
                )
            )
    if "claim" in want:
        # 1,000: the default capacity of both; 10,000 (capacity raised on both sides): the
        # rate once the wait for the next claim round no longer dominates.
        for n in ("200",) if quick else ("1000", "10000"):
            plan.configs.append(
                Config(
                    "claim",
                    f"{n} triggers",
                    ["--level", "INFO", "claim", "--triggers", n],
                    [str(AIRFLOW_SIDE / "triggerer.py"), "claim", *tmpl, "--triggers", n],
                    r,
                )
            )
    if "rss" in want:
        for n in (2000,) if quick else (10_000, 100_000):
            plan.configs.append(
                Config(
                    "rss",
                    f"{n // 1000}k triggers",
                    ["--level", "WARNING", "rss", "--triggers", str(n)],
                    [str(AIRFLOW_SIDE / "triggerer.py"), "rss", *tmpl, "--triggers", str(n)],
                    r,
                )
            )
    if "cycle" in want:
        cycles = "3" if quick else "10"
        plan.configs.append(
            Config(
                "cycle",
                f"{cycles} cycles",
                ["--level", "INFO", "cycle", "--cycles", cycles],
                [str(AIRFLOW_SIDE / "cycle.py"), *tmpl, "--cycles", cycles],
                r,
            )
        )
    plan.configs.extend(_user_configs(quick, r, tmpl, want))
    return plan


def _user_configs(quick: bool, r: int, tmpl: list[str], want: set[str]) -> list[Config]:
    """The workloads a user meets: event -> task start, DAG-file scale, run throughput."""
    configs: list[Config] = []
    if "event" in want:
        # {bootstrap} and {topic}: the run's broker and a fresh topic for each side's run
        args = ["--bootstrap", "{bootstrap}", "--topic", "{topic}"]
        args += ["--messages", "5" if quick else "20", "--interval", "1"]
        configs.append(
            Config(
                "event",
                f"{args[5]} msgs 1 s apart",
                ["--level", "INFO", "event", *args],
                [str(AIRFLOW_SIDE / "event.py"), *tmpl, *args],
                r,
            )
        )
    if "dagfiles" in want:
        args = ["--files", "30", "--idle", "20"] if quick else ["--files", "300", "--idle", "60"]
        configs.append(
            Config(
                "dagfiles",
                f"{args[1]} files",
                ["--level", "INFO", "dagfiles", *args],
                [str(AIRFLOW_SIDE / "dagfiles.py"), *tmpl, *args],
                r,
            )
        )
    if "runs" in want:
        args = ["--runs", "50" if quick else "1000", "--parallelism", "8"]
        configs.append(
            Config(
                "runs",
                f"{args[1]} manual runs par 8",
                ["--level", "INFO", "runs", *args],
                [str(AIRFLOW_SIDE / "runs.py"), *tmpl, *args],
                r,
            )
        )
    return configs


# -- running -----------------------------------------------------------------------------


class Broker:
    """The event workload's Kafka broker (tansu, as the tests start it): started on first
    use, one for the whole run and both systems; a fresh 1-partition topic per side's run."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.broker: Any = None

    def fresh_topic(self, system: str) -> tuple[str, str]:
        if self.broker is None:
            sys.path.insert(0, str(ROOT))  # the tests' broker launcher
            from tests.services_kafka import start_tansu

            self.broker = start_tansu(self.folder / "tansu.log")
        return self.broker.bootstrap, self.broker.create_topic(1, prefix=f"bench-{system}")

    def stop(self) -> None:
        if self.broker is not None:
            from tests.services_kafka import stop_tansu

            stop_tansu(self.broker.process)
        shutil.rmtree(self.folder, ignore_errors=True)  # its log: nothing the results keep


def _placed(args: list[str], system: str, broker: Broker) -> list[str]:
    """``args`` with {bootstrap} and {topic} filled in (a fresh topic), if they hold them."""
    if "{topic}" not in args:
        return args
    bootstrap, topic = broker.fresh_topic(system)
    return [a.replace("{bootstrap}", bootstrap).replace("{topic}", topic) for a in args]


def run_side(system: str, cfg: Config, rep: int, broker: Broker) -> list[dict[str, Any]]:
    if system == "sluice":
        cmd = [sys.executable, str(SLUICE_SIDE), *_placed(cfg.sluice, system, broker)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
    else:
        cmd = [str(AIRFLOW_PY), *_placed(cfg.airflow, system, broker)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SLUICE"))}
    started = time.perf_counter()
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, cwd=BENCH
        )
    except subprocess.TimeoutExpired:
        return [{"system": system, "workload": cfg.workload, "error": "timeout"}]
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not rows:
        tail = (out.stderr or out.stdout)[-2000:]
        return [{"system": system, "workload": cfg.workload, "error": tail}]
    for row in rows:
        row.update(config=cfg.label, rep=rep, wall_s=round(wall, 2))
    return rows


def execute(plan: Plan, partial: Path, broker: Broker) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    max_reps = max(c.reps for c in plan.configs)
    for rep in range(max_reps):
        for i, cfg in enumerate(plan.configs):
            if rep >= cfg.reps:
                continue
            order = ("sluice", "airflow") if (rep + i) % 2 == 0 else ("airflow", "sluice")
            for system in order:
                rows = run_side(system, cfg, rep, broker)
                runs.extend(rows)
                for row in rows:
                    print(
                        f"  rep {rep + 1} {cfg.workload:7s} {cfg.label:22s} {brief(row)}",
                        flush=True,
                    )
            partial.write_text(json.dumps(runs))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repetition, small sizes")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 3)")
    parser.add_argument("--only", default=None, help=f"comma list of {','.join(WORKLOADS)}")
    parser.add_argument(
        "--replot", action="store_true", help="only redraw the PNG and table from the JSON"
    )
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    if only and only - set(WORKLOADS):
        parser.error(f"unknown workload(s) {sorted(only - set(WORKLOADS))}: use {WORKLOADS}")
    # a run of some workloads writes files of its own: it never overwrites a whole run's
    stem = "compare_airflow" + ("." + "-".join(sorted(only)) if only else "")
    stem += ".quick" if args.quick else ""
    if args.replot:
        require_matplotlib()
        if not (RESULTS / f"{stem}.json").exists():
            sys.exit(f"no {RESULTS / f'{stem}.json'} to redraw: run the same without --replot")
        doc = json.loads((RESULTS / f"{stem}.json").read_text())
        print_summary(doc["summary"])
        chart(doc["summary"], doc["machine"], RESULTS / f"{stem}.png")
        return
    require_matplotlib()
    started = time.monotonic()
    core = ensure_airflow_venv()
    ensure_template()
    machine = machine_info(core)
    print(
        f"Sluice {machine['sluice_version']} (Python {machine['python_sluice']}) vs "
        f"apache-airflow-core {core} (Python {machine['python_airflow']}) on "
        f"{machine['cpu_model']}, {machine['cores']} cores; queue size 1024, ack timeout 300 s "
        "on both sides",
        flush=True,
    )
    print(f"load average at start: {machine['load_average_at_start']}", flush=True)
    plan = build_plan(args.quick, args.reps, only)
    RESULTS.mkdir(exist_ok=True)
    partial = RESULTS / f"{stem}.json.tmp"
    broker = Broker(Path(tempfile.mkdtemp(prefix="compare-airflow-broker-")))
    try:
        runs = execute(plan, partial, broker)
    finally:
        broker.stop()
    summary = summarize(runs)
    machine["load_average_at_end"] = os.getloadavg()
    print(f"load average at end: {machine['load_average_at_end']}", flush=True)
    machine["total_seconds"] = round(time.monotonic() - started)
    doc = {
        "machine": machine,
        "settings": {
            "mode": "quick" if args.quick else "full",
            "subscriber_queue_size": 1024,
            "ack_timeout_s": 300.0,
            "configs": [c.__dict__ for c in plan.configs],
        },
        "summary": summary,
        "runs": runs,
    }
    (RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    partial.unlink(missing_ok=True)
    print_summary(summary)
    chart(summary, machine, RESULTS / f"{stem}.png")
    errors = [r for r in runs if "error" in r]
    print(f"\n{len(runs)} figures, {len(errors)} failed runs, {machine['total_seconds']} s")
    print(f"written {RESULTS / f'{stem}.json'} and {RESULTS / f'{stem}.png'}")


if __name__ == "__main__":
    main()
