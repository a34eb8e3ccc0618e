"""The diagnosis of ``engine.db.views.why``: each watcher's and asset's state in words, the
findings (what stops or delays a DAG's next run) and the one-line verdict.

Pure: the facts read by ``engine.db.queries.why`` and the dicts of the view in, dicts and
text out; ``now`` is a parameter. Findings, most decisive first, with their severity:

- ``dag_inactive`` (blocker): no DAG file defines the DAG any more;
- ``dag_paused`` (blocker): nothing starts until it is unpaused;
- ``runs_queued`` (waiting): runs are queued and ``max_active_runs`` is reached;
- ``condition_unreadable`` / ``timetable_unreadable`` (blocker): a stored schedule this
  version cannot read;
- ``assets_missing`` (blocker when what should update the first missing asset has a
  problem: a watcher not claimed, held by a dead triggerer, failing or not loadable, a
  producing task failed or its DAG paused, nothing updates it; else waiting);
- ``condition_met`` / ``time_due`` (note; blocker without a live scheduler): a run is due;
- ``time_held`` (waiting): the next time run waits for ``max_active_runs``;
- ``time_next`` (waiting): the next tick; ``time_no_more_runs`` (blocker): none will come;
- ``manual_only`` (waiting): ``schedule=None``, runs come only from a trigger by hand/API;
- ``no_scheduler`` (blocker): no live scheduler creates or starts runs;
- ``parse_error`` (note): the file fails to parse, its last good version is used;
- ``running`` (note): a run is running now.

The verdict is the message of the first blocker, else of the first waiting finding, else
of the first note.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from engine.db.models import JobState, TaskState
from engine.db.queries.inspection import FAILING_WATCHER_WINDOW_S
from engine.db.queries.triggers import LOAD_FAILURE_PREFIX

if TYPE_CHECKING:
    from datetime import datetime

    from engine.db.queries.why import (
        AssetFacts,
        EngineFacts,
        ProducerFacts,
        QueuedEvents,
        StreamGroupFacts,
        WatcherFacts,
    )

BLOCKER: Final = "blocker"
WAITING: Final = "waiting"
NOTE: Final = "note"
_RANK: Final = {BLOCKER: 0, WAITING: 1, NOTE: 2}
_START_TRIGGERER: Final = "start one: `sluice triggerer` or `sluice run`"
_FAILED: Final = (TaskState.FAILED, TaskState.UPSTREAM_FAILED)


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


@dataclass(frozen=True, slots=True)
class WatcherContext:
    now: datetime
    threshold_s: float  # heartbeat age after which a triggerer is dead
    engine: EngineFacts
    groups: dict[str, StreamGroupFacts]


# --- watchers, assets, aliases ------------------------------------------------------------


def watcher_entry(w: WatcherFacts, ctx: WatcherContext) -> dict[str, Any]:
    owner, alive = None, False
    if w.owner is not None:
        age = round(max((ctx.now - w.owner.latest_heartbeat).total_seconds(), 0.0), 3)
        alive = w.owner.state == JobState.RUNNING and age < ctx.threshold_s
        owner = {
            "id": w.owner.id,
            "hostname": w.owner.hostname,
            "pid": w.owner.pid,
            "state": w.owner.state,
            "alive": alive,
            "heartbeat_age_s": age,
        }
    status, problem = _watcher_status(w, owner, ctx)
    return {
        "name": w.name,
        "trigger_id": w.trigger_id,
        "classpath": w.classpath,
        "claimed": w.triggerer_id is not None,
        "triggerer_id": w.triggerer_id,
        "owner": owner,
        "last_event_at": iso(w.last_event_at),
        "failures": w.failure_count,
        "last_error": w.last_error,
        "last_failure_at": iso(w.last_failure_at),
        "load_failed": _load_failed(w),
        "shared_stream": _stream(w, ctx),
        "status": status,
        "problem": problem,
    }


def _load_failed(w: WatcherFacts) -> bool:
    return bool(w.last_error and w.last_error.startswith(LOAD_FAILURE_PREFIX))


def _watcher_status(
    w: WatcherFacts, owner: dict[str, Any] | None, ctx: WatcherContext
) -> tuple[str, str | None]:
    """(status, what is wrong as a predicate: "is not claimed: ...") of one watcher."""
    engine = ctx.engine
    if _load_failed(w):
        return "load_failed", f"cannot be loaded: {first_line(w.last_error)}"
    if w.triggerer_id is None:
        if not engine.triggerers_alive:
            return "unclaimed", f"is not claimed: no live triggerer ({_START_TRIGGERER})"
        room = ""
        if engine.triggerer_capacity is not None:
            room = f"; they hold {engine.triggers_held} of {engine.triggerer_capacity} triggers"
            if engine.triggers_held >= engine.triggerer_capacity:
                room += ": full, raise [triggerer] capacity or start another"
        alive = engine.triggerers_alive
        return "unclaimed", f"is not claimed although {alive} triggerer(s) are alive{room}"
    if owner is None or not owner["alive"]:
        host = "" if owner is None or not owner["hostname"] else f" on {owner['hostname']}"
        dead = "gone" if owner is None else f"last heartbeat {owner['heartbeat_age_s']:.0f}s ago"
        takeover = (
            "a live triggerer takes it over at its next claim"
            if engine.triggerers_alive
            else f"no live triggerer takes it over ({_START_TRIGGERER})"
        )
        return (
            "owner_dead",
            f"is held by triggerer {w.triggerer_id}{host}, dead ({dead}); {takeover}",
        )
    if _is_failing(w, ctx.now):
        at = iso(w.last_failure_at)
        return (
            "failing",
            f"failed {w.failure_count} time(s), last at {at}: {first_line(w.last_error)}",
        )
    return "ok", None


def _is_failing(w: WatcherFacts, now: datetime) -> bool:
    """Failed lately (a watcher that keeps failing restarts within the window) with no
    event since."""
    failed = w.last_failure_at
    if failed is None or (now - failed).total_seconds() > FAILING_WATCHER_WINDOW_S:
        return False
    return w.last_event_at is None or w.last_event_at < failed


def _stream(w: WatcherFacts, ctx: WatcherContext) -> dict[str, Any] | None:
    group = ctx.groups.get(w.stream_digest) if w.stream_digest else None
    if group is None:
        return None
    mine = [s for s in group.snapshots if s["triggerer_id"] == w.triggerer_id]
    return {
        "digest": group.digest,
        "triggers": len(group.trigger_ids),
        "holders": group.holders,
        "split": len(group.holders) > 1,
        "snapshot": mine[0] if mine else None,
    }


def queued_entry(queued: QueuedEvents | None) -> dict[str, Any]:
    if queued is None:
        return {"count": 0, "last_event_at": None, "sources": {}}
    return {
        "count": queued.count,
        "last_event_at": iso(queued.last_at),
        "sources": dict(sorted(queued.by_source.items())),
    }


def producer_entry(p: ProducerFacts) -> dict[str, Any]:
    return {
        "dag_id": p.dag_id,
        "task_id": p.task_id,
        "dag_paused": p.dag_paused,
        "outlets": p.outlets,
        "outlet_aliases": p.outlet_aliases,
        "last_state": p.last_state,
        "last_run_id": p.last_run_id,
        "last_end": iso(p.last_end),
    }


def asset_entry(
    name: str,
    facts: AssetFacts | None,
    queued: QueuedEvents | None,
    *,
    satisfied: bool,
    watchers: list[WatcherFacts],
    producers: list[ProducerFacts],
    context: WatcherContext,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "uri": None if facts is None else facts.uri,
        "known": facts is not None,
        "satisfied": satisfied,
        "queued": queued_entry(queued),
        "last_event_at": None if facts is None else iso(facts.last_event_at),
        "last_event_source": None if facts is None else facts.last_event_source,
        "watchers": [watcher_entry(w, context) for w in watchers],
        "producers": [producer_entry(p) for p in producers],
    }
    cause: str | None = "it is not in the database: no DAG file declares it"
    problem = True
    if facts is not None:
        cause, problem = _asset_cause(entry)
    entry.update(cause=cause, cause_is_problem=problem)
    return entry


def _asset_cause(entry: dict[str, Any]) -> tuple[str | None, bool]:
    """What updates the asset, and whether that has a problem."""
    watchers = entry["watchers"]
    if watchers:
        ok = [w for w in watchers if w["status"] == "ok"]
        if not ok:
            w = watchers[0]
            more = f" (and {len(watchers) - 1} other watcher(s) have problems)" * (
                len(watchers) > 1
            )
            return f"its watcher {w['name']} {w['problem']}{more}", True
        w = ok[0]
        last = w["last_event_at"] or "never"
        return (
            f"its watcher {w['name']} runs on triggerer {w['triggerer_id']}; last event: {last}",
            False,
        )
    if entry["producers"]:
        return _producer_cause(entry["producers"])
    name = entry["name"]
    return (
        "nothing updates it: no watcher, no task outlet; "
        f"`sluice assets emit {name}` or the REST API can",
        True,
    )


def _producer_cause(producers: list[dict[str, Any]]) -> tuple[str, bool]:
    for p in producers:
        task = f"{p['dag_id']}.{p['task_id']}"
        if p["dag_paused"]:
            return f"it is updated by task {task}, whose DAG is paused", True
        if p["last_state"] in _FAILED:
            return (
                f"it is updated by task {task}, {p['last_state']} in run {p['last_run_id']}",
                True,
            )
    p = producers[0]
    task = f"{p['dag_id']}.{p['task_id']}"
    if p["last_state"] is None:
        return f"it is updated by task {task}, which has not run yet", False
    return (
        f"it is updated by task {task} (last: {p['last_state']} in run {p['last_run_id']})",
        False,
    )


def alias_entry(
    name: str,
    queued: QueuedEvents | None,
    *,
    satisfied: bool,
    assets: list[str],
    producers: list[ProducerFacts],
) -> dict[str, Any]:
    entries = [producer_entry(p) for p in producers]
    if entries:
        cause, problem = _producer_cause(entries)
        cause = cause.replace("it is updated by", "events are attached to it by")
    else:
        cause, problem = "no task attaches events through it (outlets)", True
    return {
        "name": name,
        "satisfied": satisfied,
        "queued": queued_entry(queued),
        "assets": assets,
        "producers": entries,
        "cause": cause,
        "cause_is_problem": problem,
    }


# --- findings and verdict -------------------------------------------------------------------


def findings(view: dict[str, Any]) -> list[dict[str, str]]:
    """What stops or delays the DAG's next run, most decisive first (see the module doc)."""
    dag, runs, schedule = view["dag"], view["runs"], view["schedule"]
    dag_id = view["dag_id"]
    scheduler = view["engine"]["schedulers_alive"] > 0
    found: list[dict[str, str]] = []
    if not dag["active"]:
        found.append(
            _finding(
                "dag_inactive",
                BLOCKER,
                f"DAG {dag_id} is in no DAG file any more (inactive; it was in "
                f"{dag['fileloc']}): it gets no runs",
            )
        )
    if dag["paused"]:
        message = f"paused: no run starts until `sluice dags unpause {dag_id}`"
        found.append(_finding("dag_paused", BLOCKER, message))
    if runs["queued"] and runs["running"] >= runs["max_active_runs"]:
        running = [r["run_id"] for r in runs["active"] if r["state"] == "running"]
        message = (
            f"{runs['queued']} run(s) queued: max_active_runs ({runs['max_active_runs']}) "
            f"reached by {', '.join(running)}"
        )
        found.append(_finding("runs_queued", WAITING, message))
    found += _asset_findings(view, scheduler=scheduler)
    found += _time_findings(view, scheduler=scheduler)
    if schedule["kind"] == "none":
        message = f"schedule=None: only manual/API triggers (`sluice dags trigger {dag_id}`)"
        found.append(_finding("manual_only", WAITING, message))
    if not scheduler and not any(f["code"] in ("condition_met", "time_due") for f in found):
        message = (
            "no live scheduler: no run is created or started (`sluice scheduler` or `sluice run`)"
        )
        found.append(_finding("no_scheduler", BLOCKER, message))
    if dag["parse_error"] is not None:
        error = dag["parse_error"]
        where = dag["fileloc"] if error["line"] is None else f"{dag['fileloc']}:{error['line']}"
        message = (
            f"its file fails to parse ({where}: {first_line(error['error'])}); its last good "
            "version is scheduled"
        )
        found.append(_finding("parse_error", NOTE, message))
    running_runs = [r for r in runs["active"] if r["state"] == "running"]
    if running_runs:
        run = running_runs[-1]
        message = f"run {run['run_id']} is running (started {run['start_date']})"
        found.append(_finding("running", NOTE, message))
    return sorted(found, key=lambda f: _RANK[f["severity"]])


def verdict(found: list[dict[str, str]]) -> str:
    """One line: the first finding (they come most decisive first)."""
    return found[0]["message"] if found else "nothing stops its next run"


def _finding(code: str, severity: str, message: str) -> dict[str, str]:
    return {"code": code, "severity": severity, "message": message}


def _asset_findings(view: dict[str, Any], *, scheduler: bool) -> list[dict[str, str]]:
    section = view["schedule"]["assets"]
    if section is None:
        return []
    if section["error"]:
        message = f"{section['error']}; no asset-triggered runs until its file parses again"
        return [_finding("condition_unreadable", BLOCKER, message)]
    if section["met"]:
        queued = sum(a["queued"]["count"] for a in view["assets"])
        head = f"the asset condition is met ({queued} event(s) queued)"
        if view["dag"]["paused"]:
            return [_finding("condition_met", NOTE, f"{head}: it runs once unpaused")]
        if scheduler:
            message = f"{head}: the scheduler creates an asset-triggered run at its next loop"
            return [_finding("condition_met", NOTE, message)]
        message = (
            f"{head}, but no live scheduler creates the run (`sluice scheduler` or `sluice run`)"
        )
        return [_finding("condition_met", BLOCKER, message)]
    leaf, entry = _decisive_leaf(view, section["condition"])
    label = f"{leaf['type']} {leaf['name']}"
    since = _since(entry, section["last_asset_run"])
    missing = section["missing"]
    if missing in (leaf["name"], label):
        message = f"waiting for {label} ({since})"
    else:
        message = f"waiting for {missing}; {label}: {since}"
    if entry["cause"]:
        message += f"; {entry['cause']}"
    time = view["schedule"]["time"]
    if time is not None and time["next_run"] is not None and not time["next_run"]["due"]:
        message += f"; or the time run at {time['next_run']['run_after']}"
    severity = BLOCKER if entry["cause_is_problem"] else WAITING
    return [_finding("assets_missing", severity, message)]


def _decisive_leaf(
    view: dict[str, Any], condition: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The missing asset or alias to explain: the first whose updater has a problem, else
    the first missing one; with its entry in ``assets`` / ``aliases``."""
    leaves = []
    for leaf in _missing_leaves(condition):
        entries = view["assets"] if leaf["type"] == "asset" else view["aliases"]
        leaves.append((leaf, next(e for e in entries if e["name"] == leaf["name"])))
    return next((pair for pair in leaves if pair[1]["cause_is_problem"]), leaves[0])


def _missing_leaves(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The assets and aliases of an unmet tree that would help meet it, in order."""
    if node["satisfied"]:
        return []
    if "objects" not in node:
        return [node]
    return [leaf for item in node["objects"] for leaf in _missing_leaves(item)]


def _since(entry: dict[str, Any], last_run: dict[str, Any] | None) -> str:
    if last_run is not None:
        text = f"no event since the last asset-triggered run, queued at {last_run['queued_at']}"
    else:
        text = "no event queued for this DAG yet"
    if entry.get("last_event_at"):
        text += f"; its last event was at {entry['last_event_at']}"
    return text


def _time_findings(view: dict[str, Any], *, scheduler: bool) -> list[dict[str, str]]:
    time = view["schedule"]["time"]
    if time is None:
        return []
    if time["error"]:
        return [_finding("timetable_unreadable", BLOCKER, f"{time['error']}; no time runs")]
    following = time["next_run"]
    if following is None:
        last = time["last_scheduled_run"]
        after = "" if last is None else f" after {last['logical_date']}"
        message = f"no further time run: the timetable ({time['summary']}) has none{after}"
        return [_finding("time_no_more_runs", BLOCKER, message)]
    logical = following["logical_date"]
    if time["held"]:
        runs = view["runs"]
        active = ", ".join(r["run_id"] for r in runs["active"]) or "-"
        message = (
            f"the time run for {logical} is due but held: max_active_runs "
            f"({runs['max_active_runs']}) reached by {active}"
        )
        return [_finding("time_held", WAITING, message)]
    if following["due"]:
        head = f"the time run for {logical} is due (since {following['run_after']})"
        if view["dag"]["paused"]:
            return [_finding("time_due", NOTE, f"{head}: it is created once unpaused")]
        if scheduler:
            return [
                _finding("time_due", NOTE, f"{head}: the scheduler creates it at its next tick")
            ]
        message = f"{head}, but no live scheduler creates it (`sluice scheduler` or `sluice run`)"
        return [_finding("time_due", BLOCKER, message)]
    prefix = "or " if view["schedule"]["kind"] == "assets_or_time" else ""
    message = (
        f"{prefix}next time run at {following['run_after']} ({time['summary']}; logical date "
        f"{logical})"
    )
    return [_finding("time_next", WAITING, message)]
