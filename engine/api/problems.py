"""Errors as problem JSON (RFC 9457), request limits and security headers.

Every error the API answers is ``application/problem+json`` with ``type``, ``title``,
``status`` and ``detail`` (a validation error adds ``errors``: where and what, never the
value sent, which may be a secret). A browser asking for a UI page gets the same error as a
small HTML page instead (the 500 too). An unexpected exception is logged with its traceback
and answered with a 500 that says nothing about it.

The middlewares are plain ASGI (they do not buffer responses, so streamed logs stream):
``RefuseNul`` refuses a NUL character in the path or query with 422; ``BodyLimit`` refuses a
body over ``[api] max_body_bytes`` with 413 (from its
``Content-Length`` at once, or while it is read); ``UnexpectedErrors`` turns an exception
into the 500; ``SecurityHeaders`` adds ``nosniff``, no framing, a same-origin referrer
policy, ``no-store`` caching of API answers and a Content-Security-Policy that allows only
this origin's scripts (no inline script: put JavaScript in ``engine/api/ui/static``).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final

from fastapi import HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from engine.api.security import LoginRequiredError
from engine.api.ui.templating import render

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fastapi import FastAPI
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

PROBLEM_JSON: Final = "application/problem+json"
API_PREFIX: Final = "/api/"
STATIC_PREFIX: Final = "/static/"  # the UI's files: the only responses a browser may cache
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'self'; object-src 'none'"
)
INTERNAL_ERROR_DETAIL: Final = "an unexpected error occurred; the server's log has the details"


class BodyTooLargeError(HTTPException):
    """A request body over ``[api] max_body_bytes`` (raised while it is read)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413, f"the request body is larger than {limit} bytes ([api] max_body_bytes)"
        )


def problem(status: int, detail: str, **extra: Any) -> dict[str, Any]:
    """The body of a problem response."""
    title = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    return {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}


def problem_response(
    status: int, detail: str, *, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse(
        jsonable_encoder(problem(status, detail, **extra)),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def _wants_html(request: Request) -> bool:
    path = request.url.path
    return not path.startswith(API_PREFIX) and "text/html" in request.headers.get("accept", "")


def error_response(
    request: Request,
    status: int,
    detail: str,
    *,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> Response:
    """A problem JSON response, or an HTML error page for a browser on a UI page."""
    if _wants_html(request):
        body = problem(status, detail)
        return render(request, "error.html", {"problem": body}, status_code=status)
    return problem_response(status, detail, headers=headers, **extra)


#: The methods a 405 answer's ``Allow`` header may list.
METHODS: Final = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route answers at ``request``'s path. Starlette's own 405 lists
    only the first route that matched the path, though a path (``/asset-events``: GET and
    POST) may be served by one route per method."""
    routes = request.app.router.routes
    return [
        method
        for method in METHODS
        if any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in routes)
    ]


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    headers = exc.headers
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
    return error_response(request, exc.status_code, detail, headers=headers)


def _where(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(part) for part in loc) or "request"


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    # The value sent ("input") and the validator's context are left out: they may hold a
    # password or a connection's secrets.
    errors = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
        for e in exc.errors()
    ]
    detail = "; ".join(f"{_where(e['loc'])}: {e['msg']}" for e in errors) or "invalid request"
    return error_response(request, 422, detail, errors=errors)


async def _login_required(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LoginRequiredError)
    return RedirectResponse(exc.location, status_code=303)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(LoginRequiredError, _login_required)


# --- ASGI middlewares ---------------------------------------------------------------------


class BodyLimit:
    """413 for a request body over ``limit`` bytes."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            error = BodyTooLargeError(self.limit)
            response = problem_response(413, str(error.detail), headers={"Connection": "close"})
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLargeError(self.limit)
            return message

        await self.app(scope, limited, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class RefuseNul:
    """422 for a NUL character in the path or query (``%00``): PostgreSQL cannot compare
    text holding one (it would be a 500), and no name or filter the engine keeps has one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            where = _nul_in(scope)
            if where is not None:
                detail = f"the {where} may not hold a NUL character (%00)"
                await error_response(Request(scope), 422, detail)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _nul_in(scope: Scope) -> str | None:
    if "\x00" in scope.get("path", ""):
        return "path"
    query: bytes = scope.get("query_string", b"")
    if b"%00" in query or b"\x00" in query:
        return "query"
    return None


class UnexpectedErrors:
    """An exception no handler took: logged with its traceback, answered with a bare 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            logger.exception(
                "Unexpected error answering %s %s",
                scope.get("method"),
                scope.get("path"),
                extra={"action": "api_error", "path": scope.get("path")},
            )
            if started:  # too late for an error response: the server drops the connection
                raise
            await _internal_error(scope)(scope, receive, send)


def _internal_error(scope: Scope) -> Response:
    """The 500: problem JSON, or the error page for a browser on a UI page (falling back
    to problem JSON should the page itself fail to render)."""
    try:
        return error_response(Request(scope), 500, INTERNAL_ERROR_DETAIL)
    except Exception:  # noqa: BLE001 - the page is the extra; the answer must go out
        logger.warning("Could not render the error page", extra={"action": "api_error_page"})
        return problem_response(500, INTERNAL_ERROR_DETAIL)


class SecurityHeaders:
    """Headers that keep browsers from sniffing, framing, leaking and caching."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += _security_headers(path)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def _security_headers(path: str) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"same-origin"),
        (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    ]
    if not path.startswith(STATIC_PREFIX):  # API answers and pages: user data, CSRF tokens
        headers.append((b"cache-control", b"no-store"))
    return headers
