"""The application: REST routers at ``/api/v1`` (the OpenAPI document at
``/api/v1/openapi.json``, for readers like every other route), the UI's pages at ``/`` and
its static files at ``/static``, problem-JSON errors, the body limit and security headers
(``engine.api.problems``).

There is no Swagger UI / ReDoc page: FastAPI's load their scripts from a CDN (which needs a
looser Content-Security-Policy and the internet); tools read the document instead."""

from __future__ import annotations

import contextlib
from importlib.metadata import version as dist_version
from typing import TYPE_CHECKING, Final

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from engine.api import openapi, problems, proxies
from engine.api.login_guard import LoginGuard
from engine.api.rest import ROUTERS
from engine.api.security import require_reader
from engine.api.ui import router as ui_router
from engine.api.ui.templating import STATIC_DIR
from engine.db.database import Database

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from engine.config import Config

API_PREFIX: Final = "/api/v1"


def create_app(config: Config, database: Database | None = None) -> FastAPI:
    """The API and UI on ``database`` (by default a new one on ``[core] sql_alchemy_conn``,
    disposed of when the application shuts down)."""
    owned = database is None
    db = Database(config.core.sql_alchemy_conn) if database is None else database

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if owned:
                db.dispose()

    app = FastAPI(
        title="Sluice",
        version=dist_version("sluice"),
        description="The REST API of the Sluice engine. Authenticate with "
        "`Authorization: Bearer <token>` (`sluice tokens create --user USER`).",
        openapi_url=None,  # served below, behind authentication
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.database = db
    app.state.login_guard = LoginGuard()
    for router in ROUTERS:
        app.include_router(router, prefix=API_PREFIX)
    app.include_router(ui_router)

    @app.get(
        f"{API_PREFIX}/openapi.json",
        include_in_schema=False,
        dependencies=[Depends(require_reader)],
    )
    async def openapi_document() -> JSONResponse:
        return JSONResponse(app.openapi())

    openapi.install(app)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    problems.install_error_handlers(app)
    # add_middleware wraps: the last added is the outermost.
    app.add_middleware(problems.BodyLimit, limit=config.api.max_body_bytes)
    app.add_middleware(problems.RefuseNul)
    app.add_middleware(problems.UnexpectedErrors)
    app.add_middleware(problems.SecurityHeaders)
    trusted = proxies.parse_networks(config.api.trusted_proxies)
    app.add_middleware(proxies.ForwardedClient, trusted=trusted)  # first: the real client
    return app
