"""The findings of ``engine.views.why`` (what stops or delays a DAG's next run) and its
one-line verdict.

Pure: the view's answer in (``engine.views.why`` composes it, ``why_entries`` judges its
watchers and assets), findings out. Findings, most decisive first, with their severity:

- ``dag_inactive`` (blocker): no DAG file defines the DAG any more;
- ``dag_paused`` (blocker): nothing starts until it is unpaused;
- ``runs_queued`` (waiting): runs are queued and ``max_active_runs`` is reached;
- ``condition_unreadable`` / ``timetable_unreadable`` (blocker): a stored schedule this
  version cannot read;
- ``assets_missing`` (blocker when what should update the first missing asset has a
  problem: a watcher not claimed, held by a dead triggerer, failing or not loadable, a
  producing task failed or its DAG paused, nothing updates it; else waiting);
- ``condition_met`` / ``time_due`` (note; blocker without a live scheduler): a run is due
  (for a DAG that runs per partition key: the condition is met for some key);
- ``partitions_waiting`` (waiting; blocker when an asset it needs has an updater with a
  problem): partition keys with queued events wait, the newest named with what it lacks
  (a rollup's missing upstream keys); ``partition_events_refused`` (note): queued events
  its mappers refuse, dropped at the scheduler's next loop;
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
from typing import TYPE_CHECKING, Final

from engine.views.why_entries import first_line

if TYPE_CHECKING:
    from engine.views.why_records import (
        Finding,
        LeafNode,
        Node,
        PartitionSchedule,
        Run,
        Severity,
        WhyAnswer,
    )

BLOCKER: Final = "blocker"
WAITING: Final = "waiting"
NOTE: Final = "note"
_RANK: Final = {BLOCKER: 0, WAITING: 1, NOTE: 2}


# --- findings and verdict -------------------------------------------------------------------


def findings(view: WhyAnswer) -> list[Finding]:
    """What stops or delays the DAG's next run, most decisive first (see the module doc)."""
    dag, runs, schedule = view["dag"], view["runs"], view["schedule"]
    dag_id = view["dag_id"]
    scheduler = view["engine"]["schedulers_alive"] > 0
    found: list[Finding] = []
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
            f"reached by {_names(running, runs['running'])}"
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


def verdict(found: list[Finding]) -> str:
    """One line: the first finding (they come most decisive first)."""
    return found[0]["message"] if found else "nothing stops its next run"


def _names(run_ids: list[str], total: int, *, shown: int = 3) -> str:
    """``r1, r2, r3 and 4 more``."""
    text = ", ".join(run_ids[:shown]) or "-"
    return text if total <= shown else f"{text} and {total - shown} more"


def _finding(code: str, severity: Severity, message: str) -> Finding:
    return {"code": code, "severity": severity, "message": message}


def _asset_findings(view: WhyAnswer, *, scheduler: bool) -> list[Finding]:
    section = view["schedule"]["assets"]
    if section is None:
        return []
    if section["error"]:
        message = f"{section['error']}; no asset-triggered runs until its file parses again"
        return [_finding("condition_unreadable", BLOCKER, message)]
    partitions = view["schedule"]["partitions"]
    if partitions is not None and partitions["queued_events"]:
        return _partition_findings(view, partitions, scheduler=scheduler)
    if section["met"]:
        queued = sum(a["queued"]["count"] for a in view["assets"])
        head = f"the asset condition is met ({queued} event(s) queued)"
        return _met(view, head, scheduler=scheduler)
    assert section["condition"] is not None  # read, or ``error`` says why not
    leaf, entry = _decisive_leaf(view, section["condition"])
    label = f"{leaf['type']} {leaf['name']}"
    since = _since(entry, section["last_asset_run"])
    missing = section["missing"]
    if missing in (leaf["name"], label):
        message = f"waiting for {label} ({since})"
    else:
        message = f"waiting for {missing}; {label}: {since}"
    if entry.cause:
        message += f"; {entry.cause}"
    time = view["schedule"]["time"]
    if time is not None and time["next_run"] is not None and not time["next_run"]["due"]:
        message += f"; or the time run at {time['next_run']['run_after']}"
    severity: Severity = BLOCKER if entry.cause_is_problem else WAITING
    return [_finding("assets_missing", severity, message)]


def _met(view: WhyAnswer, head: str, *, scheduler: bool) -> list[Finding]:
    if view["dag"]["paused"]:
        return [_finding("condition_met", NOTE, f"{head}: it runs once unpaused")]
    if scheduler:
        message = f"{head}: the scheduler creates an asset-triggered run at its next loop"
        return [_finding("condition_met", NOTE, message)]
    message = f"{head}, but no live scheduler creates the run (`sluice scheduler` or `sluice run`)"
    return [_finding("condition_met", BLOCKER, message)]


def _partition_findings(
    view: WhyAnswer, partitions: PartitionSchedule, *, scheduler: bool
) -> list[Finding]:
    """A DAG that runs per key with events queued: the keys ready, the newest waiting
    key and what it lacks, the events its mappers refuse."""
    found: list[Finding] = []
    ready = partitions["ready"]
    if ready:
        head = f"the asset condition is met for partition key(s) {_names(ready, len(ready))}"
        found += _met(view, head, scheduler=scheduler)
    if partitions["waiting"]:
        first = partitions["waiting"][0]
        message = first["message"]
        more = partitions["waiting_total"] - 1
        if more:
            message += f" (and {more} other partition key(s) waiting)"
        problems = [
            a
            for a in view["assets"]
            if a["name"] in first["missing_assets"] and a["cause_is_problem"]
        ]
        severity: Severity = BLOCKER if problems else WAITING
        if problems:
            message += f"; asset {problems[0]['name']}: {problems[0]['cause']}"
        found.append(_finding("partitions_waiting", severity, message))
    refused = partitions["refused"]
    if refused:
        message = (
            f"{len(refused)} queued event(s) cannot make a partitioned run and are dropped at "
            f"the scheduler's next loop, e.g. {refused[0]['reason']}"
        )
        found.append(_finding("partition_events_refused", NOTE, message))
    return found


@dataclass(frozen=True, slots=True)
class _Updater:
    """What the entry of a missing asset or alias says of what updates it."""

    cause: str | None
    cause_is_problem: bool
    last_event_at: str | None  # an asset's; None for an alias


def _decisive_leaf(view: WhyAnswer, condition: Node) -> tuple[LeafNode, _Updater]:
    """The missing asset or alias to explain: the first whose updater has a problem, else
    the first missing one; with what its entry in ``assets`` / ``aliases`` says."""
    leaves = [(leaf, _updater(view, leaf)) for leaf in _missing_leaves(condition)]
    return next((pair for pair in leaves if pair[1].cause_is_problem), leaves[0])


def _updater(view: WhyAnswer, leaf: LeafNode) -> _Updater:
    if leaf["type"] == "asset":
        a = next(e for e in view["assets"] if e["name"] == leaf["name"])
        return _Updater(a["cause"], a["cause_is_problem"], a["last_event_at"])
    alias = next(e for e in view["aliases"] if e["name"] == leaf["name"])
    return _Updater(alias["cause"], alias["cause_is_problem"], None)


def _missing_leaves(node: Node) -> list[LeafNode]:
    """The assets and aliases of an unmet tree that would help meet it, in order."""
    if node["satisfied"]:
        return []
    if node["type"] == "asset" or node["type"] == "alias":
        return [node]
    return [leaf for item in node["objects"] for leaf in _missing_leaves(item)]


def _since(entry: _Updater, last_run: Run | None) -> str:
    if last_run is not None:
        text = f"no event since the last asset-triggered run, queued at {last_run['queued_at']}"
    else:
        text = "no event queued for this DAG yet"
    if entry.last_event_at:
        text += f"; its last event was at {entry.last_event_at}"
    return text


def _time_findings(view: WhyAnswer, *, scheduler: bool) -> list[Finding]:
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
        active = [r["run_id"] for r in runs["active"]]
        message = (
            f"the time run for {logical} is due but held: max_active_runs "
            f"({runs['max_active_runs']}) reached by "
            f"{_names(active, runs['running'] + runs['queued'])}"
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
