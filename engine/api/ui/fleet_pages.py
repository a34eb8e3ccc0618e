"""The engine's own pages: its parts and Celery workers with their heartbeats (and the
Celery queues), triggers grouped by the triggerer that runs them, and the shared-stream
groups with their lag per lane and a sparkline of their recent backlog.

Reads through ``engine.views.jobs``, ``triggers`` and ``streams`` (what ``GET
/api/v1/jobs``, ``/queues``, ``/triggers`` and ``/streams`` answer).
"""

from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import partial
from typing import Any, Final

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.security import UiReaderDep
from engine.api.ui.rendering import page
from engine.api.ui.sparkline import sparkline
from engine.db.models import utcnow
from engine.db.queries.jobs import TRIGGERER_JOB
from engine.views import jobs as jobs_view
from engine.views import streams as streams_view
from engine.views import triggers as triggers_view
from engine.views.common import MAX_LIMIT
from engine.views.common import Page as ViewPage

#: These pages describe a live engine: they reload themselves this often.
REFRESH_S: Final = 5

#: The jobs page also lists the parts that ended this recently.
RECENTLY_ENDED_S: Final = 3600.0

#: How each job type is named on the jobs page (an unknown one by its type).
PART_NAMES: Final = {
    "scheduler": "scheduler",
    "executor": "executor",
    "triggerer": "triggerer",
    "dag_processor": "DAG processor",
    "api": "API server",
}

router = APIRouter(include_in_schema=False)


def by_triggerer(
    triggers: Sequence[Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One group per triggerer job (live ones first, by id), then the unclaimed triggers;
    each ``{"job": job | None, "triggers": [...]}``. A trigger whose owner is not a listed
    job (ended) is grouped under its owner id with no job."""
    groups: dict[int | None, dict[str, Any]] = {
        job["id"]: {"job": job, "owner_id": job["id"], "triggers": []} for job in jobs
    }
    for trigger in triggers:
        owner = trigger.get("triggerer_id")
        group = groups.setdefault(owner, {"job": None, "owner_id": owner, "triggers": []})
        group["triggers"].append(trigger)
    owned = [g for key, g in groups.items() if key is not None]
    owned.sort(key=lambda g: (not (g["job"] and g["job"]["alive"]), g["owner_id"]))
    return owned + ([groups[None]] if None in groups else [])


def job_status(job: Mapping[str, Any]) -> str:
    """``alive`` (heartbeating within the health threshold), ``dead`` (still marked running
    but silent: killed, or its host lost) or ``ended`` (it stopped and said so)."""
    if job["alive"]:
        return "alive"
    return "dead" if job["ended"] is None else "ended"


def is_celery_worker(job: Mapping[str, Any]) -> bool:
    """A ``sluice celery worker``: the one kind of job that records the queues it consumes."""
    return bool(job.get("queues"))


def shown_jobs(
    jobs: Sequence[Mapping[str, Any]], *, celery: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(Celery workers, every other part), each job with its ``status`` and ``part`` name;
    live ones first, then dead, then ended, by type and id. With ``celery`` (the executor
    kind) an executor that is no worker is the sender of the tries."""
    order = {"alive": 0, "dead": 1, "ended": 2}
    shown = [
        {**job, "status": job_status(job), "part": _part_name(job, celery=celery)} for job in jobs
    ]
    shown.sort(key=lambda j: (order[j["status"]], j["type"], j["id"]))
    workers = [j for j in shown if is_celery_worker(j)]
    return workers, [j for j in shown if not is_celery_worker(j)]


def _part_name(job: Mapping[str, Any], *, celery: bool) -> str:
    if celery and job["type"] == "executor" and not is_celery_worker(job):
        return "executor (sends tries to Celery)"
    kind = str(job["type"])
    return PART_NAMES.get(kind, kind)


@router.get("/jobs", response_class=HTMLResponse)
async def jobs_page(
    request: Request, _principal: UiReaderDep, database: DatabaseDep, config: ConfigDep
) -> HTMLResponse:
    now = utcnow()

    def read(session: Any) -> tuple[ViewPage[jobs_view.JobItem], jobs_view.Queues]:
        jobs = jobs_view.list_jobs(
            session,
            now=now,
            config=config,
            ended_since=now - timedelta(seconds=RECENTLY_ENDED_S),
            limit=MAX_LIMIT,
        )
        return jobs, jobs_view.list_queues(session, now=now, config=config)

    jobs, queues = await database.read(read)
    workers, parts = shown_jobs(jobs["items"], celery=queues["executor_kind"] == "celery")
    thresholds, default_s = jobs_view.liveness(config)
    return page(
        request,
        "jobs.html",
        "/jobs",
        workers=workers,
        parts=parts,
        total=jobs["total"],
        shown=len(jobs["items"]),
        live=sum(1 for j in jobs["items"] if j["alive"]),
        queues=queues["items"],
        celery=queues["executor_kind"] == "celery" or bool(workers),
        threshold_s=default_s,
        triggerer_threshold_s=thresholds[TRIGGERER_JOB],
        recently_s=RECENTLY_ENDED_S,
        refresh_s=REFRESH_S,
    )


@router.get("/triggers", response_class=HTMLResponse)
async def triggers_page(
    request: Request, _principal: UiReaderDep, database: DatabaseDep, config: ConfigDep
) -> HTMLResponse:
    now = utcnow()

    def read(
        session: Any,
    ) -> tuple[ViewPage[triggers_view.TriggerItem], ViewPage[jobs_view.JobItem]]:
        found = triggers_view.list_triggers(session, now=now, config=config, limit=MAX_LIMIT)
        jobs = jobs_view.list_jobs(
            session, now=now, config=config, job_type=TRIGGERER_JOB, limit=MAX_LIMIT
        )
        return found, jobs

    triggers, jobs = await database.read(read)
    return page(
        request,
        "triggers.html",
        "/triggers",
        groups=by_triggerer(triggers["items"], jobs["items"]),
        total=triggers["total"],
        shown=len(triggers["items"]),
        refresh_s=REFRESH_S,
    )


@router.get("/streams", response_class=HTMLResponse)
async def streams_page(
    request: Request, _principal: UiReaderDep, database: DatabaseDep, config: ConfigDep
) -> HTMLResponse:
    read = partial(streams_view.list_stream_groups, now=utcnow(), config=config, limit=MAX_LIMIT)
    found = await database.read(read)
    groups = [
        {**group, "spark": sparkline([s["outstanding"] for s in group["history"] or []])}
        for group in found["items"]
    ]
    return page(
        request,
        "streams.html",
        "/streams",
        groups=groups,
        total=found["total"],
        refresh_s=REFRESH_S,
    )
