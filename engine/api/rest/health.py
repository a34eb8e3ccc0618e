"""Health of the API process and of the engine behind it; no login needed (load balancers
and orchestrators call these).

- ``GET /health``: liveness; this process answers.
- ``GET /health/ready``: readiness; the metadata database answers and its schema is the one
  this code expects (503 otherwise), with how many jobs of each engine part are alive.
"""

import logging
from typing import Any, Final

import anyio.to_thread
from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import Engine

from engine.api.deps import ConfigDep, DatabaseDep
from engine.config import Config
from engine.db.models import utcnow
from engine.db.queries.jobs import DAG_PROCESSOR_JOB, TRIGGERER_JOB
from engine.db.schema import current_revision, head_revision
from engine.views import jobs as jobs_view

logger = logging.getLogger(__name__)

#: The engine's job types, as ``sluice jobs`` shows them.
PART_JOBS: Final = (DAG_PROCESSOR_JOB, "scheduler", "executor", TRIGGERER_JOB, "api")

router = APIRouter(tags=["health"])


@router.get("/health", summary="Liveness: this API process answers")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/health/ready",
    summary="Readiness: the database answers at the expected schema; live jobs per part",
    responses={503: {"description": "Not ready: the database or its schema is not usable"}},
)
async def ready(database: DatabaseDep, config: ConfigDep) -> JSONResponse:
    body: dict[str, Any] = {"status": "ready", "database": "ok", "schema": "current"}
    try:
        revision, head = await anyio.to_thread.run_sync(_revisions, database.engine)
    except Exception as exc:  # noqa: BLE001 - any failure to connect means not ready
        logger.warning(
            "Readiness: the metadata database does not answer: %s",
            exc,
            extra={"action": "ready_check_failed"},
        )
        body.update(status="not ready", database="unreachable", schema="unknown")
        return JSONResponse(body, status_code=503)
    if revision != head:
        body.update(status="not ready", schema=f"at {revision or 'empty'}, expected {head}")
        return JSONResponse(body, status_code=503)
    body["parts"] = await database.read(lambda s: _alive_jobs(s, config))
    return JSONResponse(body)


def _revisions(engine: Engine) -> tuple[str | None, str]:
    """The database's schema revision and the code's (read once, then cached)."""
    return current_revision(engine), head_revision()


def _alive_jobs(session: Any, config: Config) -> dict[str, int]:
    thresholds, default_s = jobs_view.liveness(config)
    jobs = jobs_view.all_jobs(
        session, now=utcnow(), thresholds=thresholds, default_threshold_s=default_s
    )
    alive = dict.fromkeys(PART_JOBS, 0)
    for job in jobs:
        if job["alive"]:
            alive[job["type"]] = alive.get(job["type"], 0) + 1
    return alive
