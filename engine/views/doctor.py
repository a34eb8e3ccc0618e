"""What ``sluice doctor`` judges, read in one transaction (``engine.doctor.diagnose`` judges
it: a pure function of these facts): the running jobs, the deferred task instances and
their triggers, watchers that cannot be loaded or keep failing, DAG files that fail to
parse, trigger rows no triggerer holds, and shared-stream groups held by more than one
live triggerer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypedDict

from engine.db.queries import claims, inspection
from engine.db.queries.dags import list_parse_errors
from engine.db.queries.jobs import TRIGGERER_JOB, age_s
from engine.views.jobs import JobItem, Thresholds, all_jobs

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

    from engine.db.queries.inspection import DeferredRow

#: A watcher that failed this recently is reported by the doctor (the runner's restart
#: backoff is at most 60 s, so one that keeps failing fails well within it).
FAILING_WATCHER_WINDOW_S: Final = 300.0


class DeferredTask(TypedDict):
    """A deferred task instance with its trigger row (None fields when it is missing)."""

    dag_id: str
    run_id: str
    task_id: str
    trigger_id: int | None
    trigger_timeout: datetime | None
    trigger_row: int | None
    trigger_created: datetime | None
    triggerer_id: int | None
    last_error: str | None


class FailedWatcher(TypedDict):
    """A watcher whose trigger could not be loaded (bad classpath, kwargs, key, ...)."""

    asset: str
    watcher: str
    trigger_id: int
    error: str | None


class FailingWatcher(TypedDict):
    """A watcher whose trigger runs but failed lately (a broker that is down, a filter that
    raises), with its latest error."""

    asset: str
    watcher: str
    trigger_id: int
    failures: int
    last_failure_age_s: float | None
    error: str


class ParseError(TypedDict):
    file: str
    line: int | None
    error: str


class StreamSplit(TypedDict):
    """A shared-stream group held by more than one live triggerer."""

    digest: str
    holders: dict[int, int]  # triggerer id -> the group's rows it holds
    trigger_ids: list[int]


class DoctorFacts(TypedDict):
    jobs: list[JobItem]
    deferred: list[DeferredTask]
    failed_watchers: list[FailedWatcher]
    failing_watchers: list[FailingWatcher]
    parse_errors: list[ParseError]
    unassigned_triggers: int
    stream_splits: list[StreamSplit]
    now: datetime


def doctor_facts(
    session: Session, *, now: datetime, thresholds: Thresholds, default_threshold_s: float
) -> DoctorFacts:
    """Everything the doctor judges, read in one transaction."""
    jobs = all_jobs(
        session, now=now, thresholds=thresholds, default_threshold_s=default_threshold_s
    )
    return {
        "jobs": jobs,
        "deferred": [_deferred(row) for row in inspection.deferred_tasks(session)],
        "failed_watchers": [
            {"asset": asset, "watcher": watcher, "trigger_id": trigger_id, "error": error}
            for asset, watcher, trigger_id, error in inspection.failed_watchers(session)
        ],
        "failing_watchers": _failing_watchers(session, now),
        "parse_errors": [
            {"file": e.fileloc, "line": e.lineno, "error": e.error}
            for e in list_parse_errors(session)
        ],
        "unassigned_triggers": inspection.unassigned_trigger_count(session),
        "stream_splits": _stream_splits(session, jobs),
        "now": now,
    }


def _deferred(row: DeferredRow) -> DeferredTask:
    dag_id, run_id, task_id, trigger_id, timeout, trigger_row, created, owner, error = row
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "task_id": task_id,
        "trigger_id": trigger_id,
        "trigger_timeout": timeout,
        "trigger_row": trigger_row,
        "trigger_created": created,
        "triggerer_id": owner,
        "last_error": error,
    }


def _failing_watchers(session: Session, now: datetime) -> list[FailingWatcher]:
    rows = inspection.failing_watchers(session, now=now, since_s=FAILING_WATCHER_WINDOW_S)
    return [
        {
            "asset": asset,
            "watcher": watcher,
            "trigger_id": trigger_id,
            "failures": failures,
            "last_failure_age_s": age_s(now, last),
            "error": error or "",
        }
        for asset, watcher, trigger_id, failures, last, error in rows
    ]


def _stream_splits(session: Session, jobs: list[JobItem]) -> list[StreamSplit]:
    """Shared-stream groups held by more than one live triggerer, with their trigger ids."""
    alive = {j["id"] for j in jobs if j["type"] == TRIGGERER_JOB and j["alive"]}
    splits = claims.stream_splits(session, alive=alive)
    ids = claims.group_trigger_ids(session, digests=splits)
    return [
        {"digest": digest, "holders": holders, "trigger_ids": ids.get(digest, [])}
        for digest, holders in sorted(splits.items())
    ]
