"""The text form of ``sluice dags why``: the verdict, then the facts behind it (the DAG's
state and runs, its schedule: the asset condition tree with each asset's queued events, or
the next tick; every asset of the condition with its watchers: trigger, owner and its
heartbeat, last event, last error, shared-stream lag; the producing tasks; the findings),
from the dict ``engine.views.why`` builds.
"""

from __future__ import annotations

from typing import Any


def render_text(view: dict[str, Any]) -> str:
    """The view as text for a terminal (one section per part of the dict)."""
    lines = [f"DAG {view['dag_id']} at {view['now']}", f"verdict: {view['verdict']}", ""]
    lines += _dag_lines(view)
    lines += _schedule_lines(view["schedule"])
    for asset in view["assets"]:
        lines += _asset_lines(asset)
    for alias in view["aliases"]:
        lines += _alias_lines(alias)
    lines += ["", "findings:"]
    lines += [
        f"  {f['severity'].upper():<8} {f['code']:<21} {f['message']}" for f in view["findings"]
    ]
    engine = view["engine"]
    lines.append(
        f"engine: {engine['schedulers_alive']} scheduler(s) and "
        f"{engine['triggerers_alive']} triggerer(s) alive"
    )
    return "\n".join(lines) + "\n"


def _field(name: str, value: str) -> str:
    return f"{name + ':':<11}{value}"


def _dag_lines(view: dict[str, Any]) -> list[str]:
    dag, runs = view["dag"], view["runs"]
    error = dag["parse_error"]
    parses = "parses" if error is None else f"FAILS TO PARSE: {_error_line(error)}"
    state = ", ".join(
        ["active" if dag["active"] else "INACTIVE", "PAUSED" if dag["paused"] else "unpaused"]
    )
    last = runs["last"]
    last_text = "none" if last is None else f"{last['run_id']} ({last['state']})"
    if last is not None and last.get("partition_key") is not None:
        last_text += f" of partition {last['partition_key']}"
    counts = (
        f"{runs['running']} running, {runs['queued']} queued, max_active_runs "
        f"{runs['max_active_runs']}{' (reached)' if runs['limit_reached'] else ''}"
    )
    return [
        _field("file", f"{dag['fileloc']} ({parses})"),
        _field("state", state),
        _field("runs", f"{counts}; last run: {last_text}"),
    ]


def _error_line(error: dict[str, Any]) -> str:
    text = (error["error"] or "").strip().splitlines()
    first = text[0] if text else ""
    return first if error["line"] is None else f"line {error['line']}: {first}"


def _schedule_lines(schedule: dict[str, Any]) -> list[str]:
    lines = [_field("schedule", f"{schedule['text']} ({schedule['kind']})")]
    assets = schedule["assets"]
    if assets is not None:
        if assets["error"]:
            lines.append(_field("condition", assets["error"]))
        else:
            state = "met" if assets["met"] else f"not met; missing: {assets['missing']}"
            last = assets["last_asset_run"]
            since = "" if last is None else f"; last asset-triggered run queued {last['queued_at']}"
            lines.append(_field("condition", state + since))
            lines += _node_lines(assets["condition"], depth=2)
    time = schedule["time"]
    if time is not None:
        lines.append(_field("time", _time_text(time)))
    partitions = schedule.get("partitions")
    if partitions is not None:
        lines += _partition_lines(partitions)
    return lines


def _partition_lines(partitions: dict[str, Any]) -> list[str]:
    """A DAG that runs per partition key: its mappers, the keys ready and waiting."""
    mappers = ", ".join(f"{asset}: {m}" for asset, m in partitions["mappers"].items())
    ready = ", ".join(partitions["ready"]) or "none"
    lines = [
        _field("partitions", f"per key ({mappers}); {partitions['queued_events']} event(s) queued"),
        f"  ready: {ready}",
    ]
    waiting = partitions["waiting"]
    total = partitions["waiting_total"]
    lines.append(f"  waiting: {total} key(s)" + ("" if total else " (none)"))
    lines += [f"    {wait['message']}" for wait in waiting]
    if total > len(waiting):
        lines.append(f"    ... and {total - len(waiting)} older key(s)")
    lines += [f"  refused event {r['event_id']}: {r['reason']}" for r in partitions["refused"]]
    return lines


def _node_lines(node: dict[str, Any], *, depth: int) -> list[str]:
    pad = " " * depth
    mark = "[x]" if node["satisfied"] else "[ ]"
    if "objects" not in node:
        events = node["queued_events"]
        queued = f"{events} event(s) queued" if events else "no event queued"
        return [f"{pad}{mark} {node['type']} {node['name']}: {queued}"]
    title = "all of" if node["type"] == "all" else "any of"
    lines = [f"{pad}{mark} {title}"]
    for item in node["objects"]:
        lines += _node_lines(item, depth=depth + 4)
    return lines


def _time_text(time: dict[str, Any]) -> str:
    if time["error"]:
        return str(time["error"])
    head = f"{time['summary']} ({time['description']})"
    following = time["next_run"]
    if following is None:
        head += "; no next run"
    else:
        held = ", held by max_active_runs" if time["held"] else ""
        due = " (due)" if following["due"] and not time["held"] else ""
        head += (
            f"; next run at {following['run_after'] or '-'}{due}{held}, logical date "
            f"{following['logical_date']} ({time['source']})"
        )
    last = time["last_scheduled_run"]
    if last is not None:
        head += f"; last scheduled run {last['run_id']} ({last['state']})"
    return head


def _asset_lines(asset: dict[str, Any]) -> list[str]:
    queued = asset["queued"]
    sources = ", ".join(f"{source}: {n}" for source, n in queued["sources"].items())
    queued_text = (
        f"{queued['count']} event(s) queued ({sources}), last at {queued['last_event_at']}"
        if queued["count"]
        else "no event queued"
    )
    last = asset["last_event_at"]
    last_text = (
        "never updated" if last is None else f"last event {last} ({asset['last_event_source']})"
    )
    lines = ["", f"asset {asset['name']}: {queued_text}; {last_text}"]
    for watcher in asset["watchers"]:
        lines += _watcher_lines(watcher)
    lines += [f"  {_producer_text(p)}" for p in asset["producers"]]
    if asset["cause"]:
        lines.append(f"  -> {asset['cause']}")
    return lines


def _watcher_lines(w: dict[str, Any]) -> list[str]:
    lines = [f"  watcher {w['name']}: trigger {w['trigger_id']} {w['classpath']} [{w['status']}]"]
    owner = w["owner"]
    if owner is None:
        lines.append("    not claimed by any triggerer")
    else:
        host = f" on {owner['hostname']}" if owner["hostname"] else ""
        pid = f" pid {owner['pid']}" if owner["pid"] is not None else ""
        alive = "alive" if owner["alive"] else "DEAD"
        lines.append(
            f"    claimed by triggerer {owner['id']}{host}{pid}: {alive}, heartbeat "
            f"{owner['heartbeat_age_s']:.1f}s ago"
        )
    error = (
        ""
        if not w["last_error"]
        else f", last at {w['last_failure_at']}: {_first(w['last_error'])}"
    )
    lines.append(
        f"    last event: {w['last_event_at'] or 'never'}; failures: {w['failures']}{error}"
    )
    stream = w["shared_stream"]
    if stream is not None:
        lines.append(f"    {_stream_text(stream)}")
    if w["problem"]:
        lines.append(f"    problem: {w['problem']}")
    return lines


def _first(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def _stream_text(stream: dict[str, Any]) -> str:
    holders = ", ".join(str(h) for h in stream["holders"])
    held = f"held by triggerer {holders}" if holders else "held by no triggerer"
    text = f"shared stream: {stream['triggers']} trigger(s), {held}"
    if stream["split"]:
        text += " (SPLIT: `sluice doctor`)"
    snap = stream["snapshot"]
    if snap is None:
        return text + "; no snapshot from its owner"
    oldest = snap["oldest_unresolved_age_s"]
    lag = (
        f"{snap['outstanding_events']} outstanding event(s)"
        if snap["mode"] == "ack"
        else "nothing to acknowledge"
    )
    age = "" if oldest is None else f", oldest unresolved {oldest:.1f}s"
    dead = f", {snap['dead_lettered']} dead-lettered" if snap["dead_lettered"] else ""
    return (
        f"{text}; {snap['broker']}, {snap['mode']} mode, {snap['subscribers']} subscriber(s), "
        f"{lag}{age}{dead} (snapshot {snap['snapshot_age_s']:.1f}s old)"
    )


def _producer_text(p: dict[str, Any]) -> str:
    paused = " (DAG paused)" if p["dag_paused"] else ""
    last = (
        "never ran" if p["last_state"] is None else f"last {p['last_state']} in {p['last_run_id']}"
    )
    return f"updated by task {p['dag_id']}.{p['task_id']}{paused}: {last}"


def _alias_lines(alias: dict[str, Any]) -> list[str]:
    queued = alias["queued"]["count"]
    resolved = ", ".join(alias["assets"]) or "none yet"
    lines = ["", f"alias {alias['name']}: {queued} event(s) queued; resolved to {resolved}"]
    lines += [f"  {_producer_text(p)}" for p in alias["producers"]]
    if alias["cause"]:
        lines.append(f"  -> {alias['cause']}")
    return lines
