"""Trigger rows as shown: class, kind, what each serves (the deferred tasks it resumes, the
watchers it backs), its owner triggerer (host, alive?, claimed at), age, failures and the
last error. Never the kwargs: they are stored encrypted and hold secrets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from engine.db.queries import inspection
from engine.db.queries.jobs import age_s, is_alive
from engine.db.queries.triggers import LOAD_FAILURE_PREFIX
from engine.views.common import Page, check_page, page

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy import Row
    from sqlalchemy.orm import Session

    from engine.config import Config
    from engine.db.models import Job


class TriggerItem(TypedDict):
    id: int
    classpath: str
    kind: str  # task (a deferred task) or watcher (an asset watcher)
    triggerer_id: int | None
    owner_alive: bool | None  # None: no owner
    age_s: float | None
    serves: str | None  # the deferred task(s) or watcher(s) it serves
    failures: int
    last_failure_age_s: float | None
    load_failed: bool  # its class or kwargs could not be loaded
    last_error: str | None
    owner_hostname: str | None
    claimed_at: str | None
    created_date: str


def list_triggers(
    session: Session,
    *,
    now: datetime,
    config: Config,
    kind: str | None = None,
    triggerer_id: int | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> Page[TriggerItem]:
    """A page of triggers by id: class path, kind, owner triggerer (host, alive?, claimed
    at), age, what it serves, failures and the last error. Never the kwargs."""
    check_page(limit, offset)
    rows, total = trigger_page(
        session,
        now=now,
        threshold_s=config.triggerer.health_check_threshold_s,
        kind=kind,
        triggerer_id=triggerer_id,
        limit=limit,
        offset=offset,
    )
    return page(rows, total, limit, offset)


def all_triggers(session: Session, *, now: datetime, threshold_s: float) -> list[TriggerItem]:
    """Every trigger row (``trigger_page``'s rows)."""
    return trigger_page(session, now=now, threshold_s=threshold_s)[0]


def trigger_page(
    session: Session,
    *,
    now: datetime,
    threshold_s: float,
    kind: str | None = None,
    triggerer_id: int | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[TriggerItem], int]:
    """A page of triggers by id (of one ``kind``, task / watcher, or one triggerer) and the
    total; an owner is alive within ``threshold_s`` of its last heartbeat."""
    jobs = inspection.jobs_by_id(session)
    serves = _served(session)
    found, total = inspection.trigger_page(
        session, kind=kind, triggerer_id=triggerer_id, limit=limit, offset=offset
    )
    rows = [
        _trigger(trig, _owner(jobs, trig.triggerer_id), serves.get(trig.id), now, threshold_s)
        for trig in found
    ]
    return rows, total


def _owner(jobs: dict[int, Job], triggerer_id: int | None) -> Job | None:
    return None if triggerer_id is None else jobs.get(triggerer_id)


def _trigger(
    trig: Row[Any], owner: Job | None, serves: str | None, now: datetime, threshold_s: float
) -> TriggerItem:
    error = trig.last_error
    claimed = None if owner is None or trig.claimed_at is None else trig.claimed_at.isoformat()
    return {
        "id": trig.id,
        "classpath": trig.classpath,
        "kind": trig.kind,
        "triggerer_id": trig.triggerer_id,
        "owner_alive": None if owner is None else is_alive(owner, now, threshold_s),
        "age_s": age_s(now, trig.created_date),
        "serves": serves,
        "failures": trig.failure_count,
        "last_failure_age_s": age_s(now, trig.last_failure_date),
        "load_failed": bool(error and error.startswith(LOAD_FAILURE_PREFIX)),
        "last_error": error,
        "owner_hostname": None if owner is None else owner.hostname or None,
        "claimed_at": claimed,
        "created_date": trig.created_date.isoformat(),
    }


def _served(session: Session) -> dict[int, str]:
    """trigger id -> what it serves: the deferred task(s) it resumes, else the watcher(s)
    it backs."""
    tasks: dict[int, str] = {}
    for trigger_id, dag_id, run_id, task_id in inspection.deferred_trigger_tasks(session):
        if trigger_id is not None:
            _append(tasks, trigger_id, f"task {dag_id}/{run_id}/{task_id}")
    watchers: dict[int, str] = {}
    for trigger_id, asset, name in inspection.watcher_triggers(session):
        _append(watchers, int(trigger_id), f"watcher {asset}/{name}")
    return {**watchers, **tasks}


def _append(into: dict[int, str], key: int, text: str) -> None:
    into[key] = f"{into[key]}, {text}" if key in into else text
