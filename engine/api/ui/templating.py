"""Rendering the UI's pages: the Jinja2 templates of ``templates/`` (autoescaped) and the
static files of ``static/`` (served at ``/static``).

Every page gets ``principal`` (who is logged in, or None) and ``csrf_token`` (the value for
the hidden ``csrf_token`` field of its forms) besides what its route passes. Pages extend
``base.html``.
"""

from pathlib import Path
from typing import Any, Final

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from engine.api.security import csrf_token, principal_of

TEMPLATES_DIR: Final = Path(__file__).parent / "templates"
STATIC_DIR: Final = Path(__file__).parent / "static"


def _page_context(request: Request) -> dict[str, Any]:
    return {"principal": principal_of(request), "csrf_token": csrf_token(request)}


templates: Final = Jinja2Templates(directory=TEMPLATES_DIR, context_processors=[_page_context])


def render(
    request: Request,
    name: str,
    context: dict[str, Any] | None = None,
    *,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    """The page ``name`` rendered with ``context``."""
    return templates.TemplateResponse(
        request, name, context or {}, status_code=status_code, headers=headers
    )
