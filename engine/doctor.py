"""``sluice doctor``: the "task stuck deferred" debugging guide as one pure function.

``diagnose(facts)`` takes what ``engine.views.doctor.doctor_facts`` read in one transaction and
returns findings (severity, what is wrong naming the culprit, what to do); it does no I/O
and reads no clock, so every rule is tested with plain dictionaries. The rules, in the
order of the guide: does the deferred task's trigger row exist, is it assigned, is its
owner alive, is triggerer capacity exhausted, has the deferral timeout passed; then the
engine as a whole: a live triggerer / scheduler / executor, DAG parse errors, watchers
whose trigger cannot be loaded, watchers that keep failing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

ERROR: Final = "error"
WARNING: Final = "warning"
DEAD_JOB_WINDOW_S: Final = 3600.0
#: Findings of one check beyond this many are summed up in one line (a dead triggerer with
#: 10,000 deferred tasks is one problem, not 10,000).
MAX_FINDINGS_PER_CHECK: Final = 5
REQUIRED_PARTS: Final = (
    ("triggerer", "sluice triggerer"),
    ("scheduler", "sluice scheduler"),
    ("executor", "sluice executor"),
)


@dataclass(frozen=True, slots=True)
class Finding:
    severity: Literal["error", "warning"]
    check: str
    problem: str
    action: str


def diagnose(facts: Mapping[str, Any], *, claim_grace_s: float) -> list[Finding]:
    """Every problem ``facts`` show; ``claim_grace_s``: how long a claim may normally take."""
    jobs = facts["jobs"]
    findings = _missing_parts(jobs) + _no_dag_processor(jobs) + _dead_jobs(jobs)
    findings += _capacity(facts, jobs)
    for ti in facts["deferred"]:
        finding = _stuck_deferral(ti, jobs, facts["now"], claim_grace_s)
        if finding is not None:
            findings.append(finding)
    findings += _parse_errors(facts["parse_errors"]) + _failed_watchers(facts["failed_watchers"])
    findings += _failing_watchers(facts["failing_watchers"])
    findings += _stream_splits(facts["stream_splits"])
    return _summed_up(findings)


def _summed_up(findings: list[Finding]) -> list[Finding]:
    """At most ``MAX_FINDINGS_PER_CHECK`` per check and severity, then one line with the rest."""
    kept: list[Finding] = []
    rest: dict[tuple[str, str], list[Finding]] = {}
    for finding in findings:
        key = (finding.check, finding.severity)
        group = rest.setdefault(key, [])
        if len(group) < MAX_FINDINGS_PER_CHECK:
            kept.append(finding)
        group.append(finding)
    for (check, _), group in rest.items():
        more = len(group) - MAX_FINDINGS_PER_CHECK
        if more > 0:
            last = group[-1]
            kept.append(Finding(last.severity, check, f"{more} more like the above", last.action))
    return kept


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == ERROR for f in findings)


def _live(jobs: list[dict[str, Any]], job_type: str) -> list[dict[str, Any]]:
    return [j for j in jobs if j["type"] == job_type and j["alive"]]


def _spare(job: dict[str, Any]) -> int:
    if job["capacity"] is None:
        return 1
    return int(job["capacity"]) - int(job["load"] or 0)


def _missing_parts(jobs: list[dict[str, Any]]) -> list[Finding]:
    return [
        Finding(
            ERROR,
            f"live_{job_type}",
            f"no live {job_type}: no {job_type} job has heartbeated within its health threshold",
            f"start one: `sluice run` (every part) or `{command}` (this part alone), "
            "with the same [core] sql_alchemy_conn",
        )
        for job_type, command in REQUIRED_PARTS
        if not _live(jobs, job_type)
    ]


def _no_dag_processor(jobs: list[dict[str, Any]]) -> list[Finding]:
    """Runs go on without one; only changes to DAG files are not picked up."""
    if _live(jobs, "dag_processor"):
        return []
    return [
        Finding(
            WARNING,
            "live_dag_processor",
            "no live dag_processor: new or edited DAG files are not parsed (what was parsed "
            "last keeps running)",
            "start one: `sluice run` (every part) or `sluice dag-processor` (this part alone)",
        )
    ]


def _dead_jobs(jobs: list[dict[str, Any]]) -> list[Finding]:
    """Jobs that stopped heartbeating within the last hour (a crash leaves its row behind
    for good: reported for an hour, then only ``sluice jobs list`` shows it)."""
    return [
        Finding(
            WARNING,
            "dead_job",
            f"{job['type']} job {job['id']} ({job['hostname']}, pid {job['pid']}) is marked "
            f"running but last heartbeated {job['heartbeat_age_s']:.0f}s ago",
            "it crashed or hangs: live parts take over its work; if the process still exists, "
            "kill it and look at its log",
        )
        for job in jobs
        if not job["alive"] and (job["heartbeat_age_s"] or 0) < DEAD_JOB_WINDOW_S
    ]


def _capacity(facts: Mapping[str, Any], jobs: list[dict[str, Any]]) -> list[Finding]:
    live = _live(jobs, "triggerer")
    waiting = int(facts["unassigned_triggers"])
    if not live or not waiting or any(_spare(j) > 0 for j in live):
        return []
    used = ", ".join(f"job {j['id']}: {j['load']}/{j['capacity']}" for j in live)
    return [
        Finding(
            ERROR,
            "triggerer_capacity",
            f"triggerer capacity exhausted ({used}); {waiting} trigger(s) wait for a triggerer",
            "raise [triggerer] capacity or start another triggerer (`sluice triggerer`)",
        )
    ]


def _task(ti: dict[str, Any]) -> str:
    return f"task {ti['dag_id']}/{ti['run_id']}/{ti['task_id']}"


def _stuck_deferral(
    ti: dict[str, Any], jobs: list[dict[str, Any]], now: datetime, claim_grace_s: float
) -> Finding | None:
    """The guide's steps for one deferred task, first failing one wins."""
    timeout = ti["trigger_timeout"]
    if timeout is not None and timeout <= now:
        return _timed_out(ti, jobs, (now - timeout).total_seconds())
    if ti["trigger_row"] is None:
        return Finding(
            ERROR,
            "trigger_missing",
            f"{_task(ti)} is deferred but its trigger row "
            f"{ti['trigger_id'] if ti['trigger_id'] is not None else '(none)'} is gone: "
            "nothing will resume it",
            "look in the triggerer log for that trigger id; re-run the work with "
            f"`sluice dags trigger {ti['dag_id']}`",
        )
    owner = ti["triggerer_id"]
    live = _live(jobs, "triggerer")
    if owner is None:
        return _unassigned(ti, live, now, claim_grace_s)
    if any(j["id"] == owner for j in live):
        return None
    return _dead_owner(ti, live)


def _timed_out(ti: dict[str, Any], jobs: list[dict[str, Any]], overdue_s: float) -> Finding:
    live = bool(_live(jobs, "triggerer"))
    return Finding(
        ERROR if not live or overdue_s > 60 else WARNING,
        "deferral_timeout",
        f"{_task(ti)} (trigger {ti['trigger_id']}) passed its deferral timeout "
        f"{overdue_s:.0f}s ago and is still deferred",
        "a live triggerer fails timed-out deferrals each claim round: "
        + ("check its log for claim-loop errors" if live else "start one (`sluice triggerer`)"),
    )


def _unassigned(
    ti: dict[str, Any], live: list[dict[str, Any]], now: datetime, claim_grace_s: float
) -> Finding | None:
    created = ti["trigger_created"]
    if live and any(_spare(j) > 0 for j in live):
        if created is None or (now - created).total_seconds() < claim_grace_s:
            return None  # a claim round will take it
        return Finding(
            WARNING,
            "trigger_unclaimed",
            f"trigger {ti['trigger_id']} of {_task(ti)} is unassigned although triggerers "
            "have spare capacity",
            "check the triggerer log for claim-loop errors (database errors, lock timeouts)",
        )
    why = "every live triggerer is at capacity" if live else "no triggerer is alive"
    return Finding(
        ERROR,
        "trigger_unassigned",
        f"trigger {ti['trigger_id']} of {_task(ti)} is not assigned to any triggerer: {why}",
        "raise [triggerer] capacity or start another triggerer (`sluice triggerer`)"
        if live
        else "start a triggerer: `sluice run` or `sluice triggerer`",
    )


def _dead_owner(ti: dict[str, Any], live: list[dict[str, Any]]) -> Finding:
    problem = (
        f"trigger {ti['trigger_id']} of {_task(ti)} belongs to triggerer "
        f"{ti['triggerer_id']}, which is not alive"
    )
    if any(_spare(j) > 0 for j in live):
        return Finding(
            WARNING,
            "trigger_owner_dead",
            problem,
            "a live triggerer takes it over within [triggerer] health_check_threshold; "
            "if this persists, check the live triggerers' logs",
        )
    return Finding(
        ERROR,
        "trigger_owner_dead",
        problem + ("; every live triggerer is at capacity" if live else " and none is"),
        "raise [triggerer] capacity or start another triggerer (`sluice triggerer`)"
        if live
        else "start a triggerer (`sluice run` or `sluice triggerer`): it takes over the "
        "triggers of dead triggerers",
    )


def _parse_errors(errors: list[dict[str, Any]]) -> list[Finding]:
    return [
        Finding(
            ERROR,
            "dag_parse_error",
            f"DAG file {e['file']}{'' if e['line'] is None else ':' + str(e['line'])} "
            f"failed to load: {_first_line(e['error'])}",
            "fix the file (its DAGs keep their last good version meanwhile); "
            "`sluice dags errors` shows every error",
        )
        for e in errors
    ]


def _failed_watchers(watchers: list[dict[str, Any]]) -> list[Finding]:
    return [
        Finding(
            ERROR,
            "watcher_load_failed",
            f"watcher {w['watcher']!r} of asset {w['asset']!r} (trigger {w['trigger_id']}) "
            f"does not run: {_first_line(w['error'])}",
            "fix the watcher's trigger in its DAG file (class path, arguments) or "
            "[triggerer] allowed_trigger_modules / [core] fernet_key; it is retried every 30s",
        )
        for w in watchers
    ]


def _failing_watchers(watchers: list[dict[str, Any]]) -> list[Finding]:
    return [
        Finding(
            WARNING,
            "watcher_failing",
            f"watcher {w['watcher']!r} of asset {w['asset']!r} (trigger {w['trigger_id']}) "
            f"failed {w['last_failure_age_s']:.0f}s ago ({w['failures']} failure(s) in all): "
            f"{_first_line(w['error'])}",
            "it restarts with backoff and nothing it read is lost; fix what the error names "
            "(a broker that is down, a filter that raises); the triggerer log has the traceback",
        )
        for w in watchers
    ]


def _stream_splits(splits: list[dict[str, Any]]) -> list[Finding]:
    return [
        Finding(
            ERROR,
            "stream_split",
            f"shared-stream group {split['digest'][:12]} (triggers "
            f"{', '.join(map(str, split['trigger_ids']))}) is served by "
            f"{len(split['holders'])} live triggerers (jobs "
            f"{', '.join(f'{job}: {n} trigger(s)' for job, n in sorted(split['holders'].items()))}"
            "): each consumes part of the upstream and acknowledges what only its own "
            "watchers saw",
            "the triggerers repair this within a claim round; if it persists, a triggerer of "
            "an older Sluice version is running: upgrade or stop it",
        )
        for split in splits
    ]


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= 300 else line[:297] + "..."
