"""The "why (not)" page of a DAG: ``engine.views.why.explain_dag`` drawn as HTML (the
same dict ``sluice dags why`` prints and ``GET /api/v1/dags/{dag_id}/why`` returns)."""

from functools import partial
from typing import Final

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.security import UiReaderDep
from engine.api.ui.rendering import not_found, page
from engine.db.models import utcnow
from engine.views.why import UnknownDagError, explain_dag

#: The page reloads itself: the answer changes as events arrive and watchers recover.
REFRESH_S: Final = 10

router = APIRouter(include_in_schema=False)


@router.get("/dags/{dag_id}/why", response_class=HTMLResponse)
async def why_page(
    request: Request,
    dag_id: str,
    _principal: UiReaderDep,
    database: DatabaseDep,
    config: ConfigDep,
) -> HTMLResponse:
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
        raise not_found(str(exc)) from exc
    return page(request, "why.html", "/dags", why=answer, refresh_s=REFRESH_S)
