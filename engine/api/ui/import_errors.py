"""``/import-errors``: the DAG files that failed to parse, each with its error (file, line,
message, the stack trace in a bounded box), as ``sluice dags errors`` lists them; the DAG
list's banner links here. A DAG of a failing file keeps running from its last good version.
"""

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from engine.api.deps import DatabaseDep
from engine.api.security import UiReaderDep
from engine.api.ui.rendering import page
from engine.views import parse_errors as parse_errors_view

router = APIRouter(include_in_schema=False)


@router.get("/import-errors", response_class=HTMLResponse)
async def import_errors(
    request: Request, _principal: UiReaderDep, database: DatabaseDep
) -> HTMLResponse:
    errors = await database.read(parse_errors_view.list_parse_errors)
    return page(request, "import_errors.html", "/dags", errors=errors)
