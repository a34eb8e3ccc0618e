"""The summary of bench/compare_airflow.py: per-row medians, ratios, targets, table, chart.

Every ratio is between figures of one run (the rows it is given): nothing remembered or
hard-coded of either system. Kept apart from the driver so that each stays one concern.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

MIN_REPS = 3  # a row's min/median/max needs at least this many repetitions a side

# workload -> (metric, unit, higher_is_better)
METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "fanout": [("deliveries_per_s", "deliveries/s", True), ("raw_per_s", "raw events/s", True)],
    "latency": [("p50_ms", "ms", False), ("p99_ms", "ms", False)],
    "claim": [("claims_per_s", "triggers/s", True)],
    "rss": [("rss_per_trigger_bytes", "bytes/trigger", False)],
    "cycle": [("cycle_ms", "ms/cycle", False)],
    "event": [("p50_ms", "ms", False), ("p99_ms", "ms", False)],
    "dagfiles": [("first_full_parse_s", "s", False), ("idle_cpu_cores", "cores", False)],
    "runs": [("runs_per_s", "runs/s", True)],
}

# The targets that are a figure of Sluice's own, not a factor over Airflow, each
# for the full-size configuration only: (workload, config, metric) -> (limit, text).
ABSOLUTE_TARGETS: dict[tuple[str, str, str], tuple[float, str]] = {
    ("event", "20 msgs 1 s apart", "p50_ms"): (50.0, "Sluice p50 <= 50 ms"),
    ("dagfiles", "300 files", "first_full_parse_s"): (5.0, "Sluice first parse <= 5 s"),
    ("dagfiles", "300 files", "idle_cpu_cores"): (0.1, "Sluice idle <= 0.1 core"),
    ("runs", "1000 manual runs par 8", "runs_per_s"): (100.0, "Sluice >= 100 runs/s"),
}


def brief(row: dict[str, Any]) -> str:
    """One run's figures on a line, as the driver prints them while it runs."""
    if "error" in row:
        return f"{row['system']:7s} ERROR {row['error'].strip().splitlines()[-1][:120]}"
    keys = [k for k, *_ in METRICS[row["workload"]]]
    layer = f"{row['layer']:8s}" if "layer" in row else ""
    figs = "  ".join(f"{k}={row[k]:,.1f}" for k in keys)
    return f"{row['system']:7s} {layer}{figs}  ({row['wall_s']:.0f}s)"


def target_for(workload: str, key: str, metric: str) -> tuple[float, str] | None:
    """The issue's target as a minimum advantage factor (x better than Airflow), if any."""
    if workload == "fanout" and key.startswith("ack N=100") and metric == "deliveries_per_s":
        if key.endswith("manager"):
            return 3.0, ">= 3x Airflow's deliveries/s (manager)"
        if key.endswith("INFO runtime"):
            return 10.0, ">= 10x at default log levels (runtime)"
    if workload == "latency" and metric == "p50_ms":
        return 50.0, "p50 <= 20 ms vs Airflow's ~1 s"
    if workload == "claim":
        return 100.0, ">= 100x Airflow's claim rate"
    if workload == "rss":
        return 1.0, "<= Airflow's RSS per idle trigger"
    return None


def _key(row: dict[str, Any]) -> str:
    return f"{row['config']} {row['layer']}" if "layer" in row else row["config"]


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    good = [r for r in runs if "error" not in r]
    keys: list[tuple[str, str]] = []
    for r in good:
        if (r["workload"], _key(r)) not in keys:
            keys.append((r["workload"], _key(r)))
    summary = []
    for workload, key in keys:
        rows = [r for r in good if r["workload"] == workload and _key(r) == key]
        for metric, unit, higher in METRICS[workload]:
            per = {
                s: {r["rep"]: r[metric] for r in rows if r["system"] == s}
                for s in ("sluice", "airflow")
            }
            if not per["sluice"] or not per["airflow"]:
                continue
            med = {s: statistics.median(v.values()) for s, v in per.items()}
            if 0 in med.values() or any(0 in v.values() for v in per.values()):
                continue  # no ratio with a zero (say, no CPU at all at idle): raw rows only
            ratio = med["sluice"] / med["airflow"]
            advantage = ratio if higher else 1 / ratio
            paired = [
                per["sluice"][k] / per["airflow"][k] for k in per["sluice"] if k in per["airflow"]
            ]
            entry: dict[str, Any] = {
                "workload": workload,
                "config": key,
                "metric": metric,
                "unit": unit,
                "higher_is_better": higher,
                "log_level": rows[0].get("log_level"),
                **{
                    f"{s}_{stat}": fn(per[s].values())
                    for s in ("sluice", "airflow")
                    for stat, fn in (("median", statistics.median), ("min", min), ("max", max))
                },
                "sluice_runs": len(per["sluice"]),
                "airflow_runs": len(per["airflow"]),
                "ratio_sluice_over_airflow": ratio,
                "ratio_per_rep_min": min(paired) if paired else None,
                "ratio_per_rep_max": max(paired) if paired else None,
                "sluice_advantage_x": advantage,
            }
            target = target_for(workload, key, metric)
            if target is not None:
                entry["target_advantage_x"], entry["target"] = target
                if workload == "latency":
                    entry["target_met"] = med["sluice"] <= 20.0
                else:
                    entry["target_met"] = advantage >= target[0]
            absolute = ABSOLUTE_TARGETS.get((workload, key, metric))
            if absolute is not None:
                limit, entry["target"] = absolute
                better = med["sluice"] >= limit if higher else med["sluice"] <= limit
                entry["target_met"] = better
            summary.append(entry)
    return summary


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}"


def print_summary(summary: list[dict[str, Any]]) -> None:
    print()
    head = f"{'workload':8s} {'configuration':26s} {'metric':18s} {'Sluice median [min-max]':>30s} "
    print(head + f"{'Airflow median [min-max]':>30s} {'S/A ratio [per-rep]':>24s}  target")
    for e in summary:
        s = f"{_fmt(e['sluice_median'])} [{_fmt(e['sluice_min'])}-{_fmt(e['sluice_max'])}]"
        a = f"{_fmt(e['airflow_median'])} [{_fmt(e['airflow_min'])}-{_fmt(e['airflow_max'])}]"
        lo, hi = e["ratio_per_rep_min"], e["ratio_per_rep_max"]
        r = f"{e['ratio_sluice_over_airflow']:.3g} [{lo:.3g}-{hi:.3g}]"
        t = ""
        if "target" in e:
            t = f"{e['target']}: {'MET' if e['target_met'] else 'MISSED'}"
        name = f"{e['workload']:8s} {e['config']:26s} {e['metric']:18s}"
        if min(e["sluice_runs"], e["airflow_runs"]) < MIN_REPS:
            t = f"(only {min(e['sluice_runs'], e['airflow_runs'])} rep(s): no spread) {t}"
        print(f"{name} {s:>30s} {a:>30s} {r:>24s}  {t}")


def _load(machine: dict[str, Any]) -> str:
    """The 1-minute load at the run's start and end, as the chart's title gives it."""
    start, end = machine.get("load_average_at_start"), machine.get("load_average_at_end")
    if not start or not end:
        return ""
    return f", load {start[0]:.1f} at start, {end[0]:.1f} at end"


def chart(summary: list[dict[str, Any]], machine: dict[str, Any], out: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [e for e in summary if e["metric"] != "raw_per_s"]
    colors = {
        "fanout": "#4C72B0",
        "latency": "#DD8452",
        "claim": "#55A868",
        "rss": "#8172B3",
        "cycle": "#C44E52",
        "event": "#937860",
        "dagfiles": "#DA8BC3",
        "runs": "#8C8C8C",
    }
    labels = [f"{e['workload']}: {e['config']} {e['metric'].replace('_per_s', '/s')}" for e in rows]
    values = [e["sluice_advantage_x"] for e in rows]
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(rows) + 2.2))
    y = range(len(rows))
    # bars start at 1x (parity), so a loss points left and a win right on the log axis
    widths = [v - 1.0 for v in values]
    ax.barh(y, widths, left=1.0, color=[colors[e["workload"]] for e in rows])
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.axvline(1.0, color="black", linewidth=1)
    for i, e in enumerate(rows):
        if "target_advantage_x" in e:
            ax.plot([e["target_advantage_x"]] * 2, [i - 0.45, i + 0.45], color="red", linewidth=2)
        ax.text(max(values[i], 1.0) * 1.05, i, f"{values[i]:.3g}x", va="center", fontsize=7)
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        "Sluice's advantage (x, log scale; > 1 = Sluice better): throughput Sluice/Airflow, "
        "time and memory Airflow/Sluice"
    )
    versions = (
        f"Sluice {machine['sluice_version']} vs "
        f"Apache Airflow {machine['apache_airflow_core_version']}"
    )
    ax.set_title(
        f"{versions} (median of alternating runs; red tick = issue target)\n"
        f"{machine['cpu_model']}, "
        f"{machine['cores']} cores, Python {machine['python_sluice']}, {machine['date_utc'][:10]}"
        f"{_load(machine)}",
        fontsize=9,
    )
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
