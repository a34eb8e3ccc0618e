"""The text form of ``sluice assets partitions``: a head (keys, events without a key, the
range asked and how many of its keys are missing, the consumers), then one line per key:
its events, its latest event and, per DAG that runs per key, the state of its run for it;
from the dict ``engine.views.partitions`` builds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from engine.cli.common import format_table

if TYPE_CHECKING:
    from engine.views.partitions import AssetPartitions, ConsumerCell

_REFUSALS_SHOWN: Final = 5


def render_text(shown: AssetPartitions) -> str:
    lines = [f"asset {shown['asset']}: {shown['total']} partition key(s)" + _unkeyed(shown)]
    window = shown["range"]
    if window is not None:
        producers = ", ".join(f"{p['dag_id']} ({p['timetable']})" for p in shown["producers"])
        lines.append(
            f"range {window['start']} .. {window['end']}: {window['expected']} key(s) "
            f"expected by {producers}, {window['missing']} missing"
        )
    per_key = [c for c in shown["consumers"] if c["partitioned"]]
    whole = [c["dag_id"] for c in shown["consumers"] if not c["partitioned"]]
    lines += [f"consumer {c['dag_id']}: per key, {c['mapper']}" for c in per_key]
    if whole:
        lines.append(f"consumers of the whole asset (not per key): {', '.join(whole)}")
    if not shown["items"]:
        return "\n".join([*lines, "no partition key yet"]) + "\n"
    columns = ["partition_key", "events", "last_event"] + [c["dag_id"] for c in per_key]
    rows: list[dict[str, Any]] = []
    refusals: list[str] = []
    for row in shown["items"]:
        last = row["last_event"]
        line: dict[str, Any] = {
            "partition_key": row["partition_key"],
            "events": "MISSING" if row["missing"] else row["events"],
            "last_event": None if last is None else f"{last['timestamp']} ({last['source']})",
        }
        for cell in row["consumers"]:
            line[cell["dag_id"]] = _cell_text(row["partition_key"], cell)
            if cell["error"] is not None:
                refusals.append(f"{cell['dag_id']} refuses {row['partition_key']}: {cell['error']}")
        rows.append(line)
    lines += ["", format_table(rows, columns)]
    lines += refusals[:_REFUSALS_SHOWN]
    if len(refusals) > _REFUSALS_SHOWN:
        lines.append(f"... and {len(refusals) - _REFUSALS_SHOWN} more refused key(s)")
    if shown["limit"] is not None and shown["total"] > len(rows):
        lines.append(f"(the first {len(rows)} of {shown['total']})")
    return "\n".join(lines) + "\n"


def _unkeyed(shown: AssetPartitions) -> str:
    count = shown["unkeyed_events"]
    return f"; {count} event(s) without a key" if count else ""


def _cell_text(key: str, cell: ConsumerCell) -> str:
    """``success``, ``2026-03-10: waiting``, ``refused: ...``."""
    if cell["error"] is not None:
        return "refused"
    if cell["state"] is not None:
        state = cell["state"]
    elif cell["waiting"]:
        state = "waiting"
    else:
        state = "no run"
    targets = cell["downstream_keys"]
    if targets == [key]:
        return state
    return f"{', '.join(targets)}: {state}"
