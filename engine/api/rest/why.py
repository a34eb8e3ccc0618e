"""Why did a DAG not run: ``GET /dags/{dag_id}/why``.

Answers ``engine.views.why.explain_dag`` as it is (the same record ``sluice dags why
--json`` prints; its shape is ``engine.views.why_records.WhyAnswer``): the verdict, the
findings, the schedule (asset condition tree with each asset's queued events and what is
missing, or the next tick), the watchers behind the assets (trigger class, claim, owner
heartbeat, last event, last error, shared-stream lag; never trigger kwargs), the producing
tasks, the runs. An unknown DAG is a 404 problem.
"""

from functools import partial
from typing import Any

from fastapi import APIRouter, HTTPException

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.security import ReaderDep
from engine.db.models import utcnow
from engine.views.why import UnknownDagError, explain_dag

router = APIRouter(tags=["dags"])


@router.get(
    "/dags/{dag_id}/why",
    summary="Why a DAG did not run: schedule, missing asset events, watchers, triggerers",
    responses={404: {"description": "No DAG has this id"}},
)
async def why(
    dag_id: str, _reader: ReaderDep, database: DatabaseDep, config: ConfigDep
) -> dict[str, Any]:
    explain = partial(
        explain_dag,
        dag_id=dag_id,
        now=utcnow(),
        triggerer_threshold_s=config.triggerer.health_check_threshold_s,
        scheduler_threshold_s=config.scheduler.health_check_threshold_s,
    )
    try:
        answer = await database.read(explain)
    except UnknownDagError as exc:
        raise HTTPException(404, str(exc)) from exc
    return dict(answer)  # no response model: FastAPI answers the dict as it is
