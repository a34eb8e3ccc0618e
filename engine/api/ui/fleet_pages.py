"""The engine's own pages: triggers grouped by the triggerer that runs them (with the jobs'
heartbeats), and the shared-stream groups with their lag per lane and a sparkline of their
recent backlog.

Reads through ``engine.db.views.ops`` (what ``GET /api/v1/triggers``, ``/jobs`` and
``/sharedStreams`` answer).
"""

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
from engine.db.views import ops as ops_view
from engine.db.views.common import MAX_LIMIT

#: These pages describe a live engine: they reload themselves this often.
REFRESH_S: Final = 5

router = APIRouter(include_in_schema=False)


def by_triggerer(
    triggers: list[dict[str, Any]], jobs: list[dict[str, Any]]
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


@router.get("/triggers", response_class=HTMLResponse)
async def triggers_page(
    request: Request, _principal: UiReaderDep, database: DatabaseDep, config: ConfigDep
) -> HTMLResponse:
    now = utcnow()

    def read(session: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        found = ops_view.list_triggers(session, now=now, config=config, limit=MAX_LIMIT)
        jobs = ops_view.list_jobs(
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
    read = partial(ops_view.list_stream_groups, now=utcnow(), config=config, limit=MAX_LIMIT)
    found = await database.read(read)
    groups = [
        {**group, "spark": sparkline([s["outstanding"] for s in group.get("history") or []])}
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
