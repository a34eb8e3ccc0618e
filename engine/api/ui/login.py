"""Logging in and out of the UI.

``GET /login`` shows the form; ``POST /login`` checks the password (Argon2id, in a worker
thread, a few at once, with a backoff after repeated failures: ``engine.api.login_guard``)
and starts a session: a random cookie value, of which the database keeps only the
SHA-256, with its own CSRF token and an expiry (``[api] session_hours``). The cookie is
``HttpOnly``, ``SameSite=Lax`` and ``Secure`` with ``[api] cookie_secure``. The login form
itself is protected by a double-submit token (a cookie of its own and the same value in the
form), so that another site cannot log a browser in as someone else. ``POST /logout`` ends
the session in the database: every API process forgets it at once.
"""

import logging
import secrets
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Annotated, Final

import anyio.to_thread
from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session

from engine.api import credentials
from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.security import (
    AUTH_SESSION,
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    check_csrf,
    current_principal,
    forbidden,
)
from engine.api.ui.templating import render
from engine.config import Config
from engine.db.models import utcnow
from engine.db.queries import users as users_sql

if TYPE_CHECKING:
    from engine.api.login_guard import LoginGuard

logger = logging.getLogger(__name__)

LOGIN_CSRF_MAX_AGE_S: Final = 3600
LOGIN_FAILED: Final = "Invalid username or password."

router = APIRouter(include_in_schema=False)


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path of this site only (never another host)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


def _login_page(
    request: Request,
    config: Config,
    *,
    next_url: str,
    error: str | None = None,
    username: str | None = None,
    status_code: int = 200,
) -> Response:
    token = request.cookies.get(LOGIN_CSRF_COOKIE) or credentials.new_secret()
    request.state.login_csrf = token
    context = {"next": next_url, "error": error, "username": username}
    response = render(request, "login.html", context, status_code=status_code)
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        token,
        max_age=LOGIN_CSRF_MAX_AGE_S,
        path="/login",
        httponly=True,
        samesite="lax",
        secure=config.api.cookie_secure,
    )
    return response


@router.get("/login")
async def login_form(request: Request, config: ConfigDep, next: str = "/") -> Response:
    principal = await current_principal(request)
    if principal is not None and principal.auth == AUTH_SESSION:
        return RedirectResponse(safe_next(next), status_code=303)
    return _login_page(request, config, next_url=safe_next(next))


@router.post("/login")
async def login(
    request: Request,
    config: ConfigDep,
    database: DatabaseDep,
    username: Annotated[str, Form(max_length=250)],
    password: Annotated[str, Form(max_length=credentials.MAX_PASSWORD_LENGTH)],
    csrf_token: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/",
) -> Response:
    expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not expected or not secrets.compare_digest(csrf_token.encode(), expected.encode()):
        raise forbidden("the login form expired or did not come from this site; reload it")
    guard: LoginGuard = request.app.state.login_guard
    keys = guard.keys(username, request.client.host if request.client else None)
    wait_s = guard.retry_after(keys)
    if wait_s is not None:
        logger.warning(
            "UI login for %r refused for %ss after repeated failures",
            username,
            wait_s,
            extra={"action": "login_throttled", "username": username},
        )
        refused = _login_page(
            request,
            config,
            next_url=safe_next(next),
            error=f"Too many failed logins: try again in {wait_s} seconds.",
            username=username,
            status_code=429,
        )
        refused.headers["Retry-After"] = str(wait_s)
        return refused
    found = await database.read(partial(users_sql.user_login, username=username))
    ok = await guard.check_password(None if found is None else found[1], password)
    if found is None or not ok:
        guard.failed(keys)
        logger.warning(
            "Failed UI login for %r",
            username,
            extra={"action": "login_failed", "username": username},
        )
        return _login_page(
            request,
            config,
            next_url=safe_next(next),
            error=LOGIN_FAILED,
            username=username,
            status_code=401,
        )
    guard.succeeded(username)
    identity, stored = found
    cookie = await _start_session(database, config, identity.user_id)
    if credentials.needs_rehash(stored):
        await _rehash(database, identity.username, password)
    logger.info("UI login of %r", username, extra={"action": "login", "username": username})
    response = RedirectResponse(safe_next(next), status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=int(config.api.session_hours * 3600),
        path="/",
        httponly=True,
        samesite="lax",
        secure=config.api.cookie_secure,
    )
    response.delete_cookie(LOGIN_CSRF_COOKIE, path="/login")
    return response


async def _start_session(database: DatabaseDep, config: Config, user_id: int) -> str:
    """A new session of ``user_id`` (expired ones are swept on the way); its cookie value."""
    cookie, now = credentials.new_secret(), utcnow()

    def write(session: Session) -> None:
        users_sql.delete_expired_sessions(session, now=now)
        users_sql.add_session(
            session,
            user_id=user_id,
            session_hash=credentials.digest(cookie),
            csrf_token=credentials.new_secret(),
            now=now,
            expires_at=now + timedelta(hours=config.api.session_hours),
        )

    await database.run(write)
    return cookie


async def _rehash(database: DatabaseDep, username: str, password: str) -> None:
    new_hash = await anyio.to_thread.run_sync(credentials.hash_password, password)
    await database.run(
        partial(
            users_sql.set_password_hash,
            username=username,
            password_hash=new_hash,
            now=utcnow(),
            end_sessions=False,
        )
    )


@router.post("/logout")
async def logout(request: Request, config: ConfigDep, database: DatabaseDep) -> Response:
    principal = await current_principal(request)
    if principal is not None and principal.auth == AUTH_SESSION:
        await check_csrf(request, principal)
        cookie = request.cookies.get(SESSION_COOKIE, "")
        await database.run(partial(users_sql.end_session, session_hash=credentials.digest(cookie)))
        logger.info(
            "UI logout of %r",
            principal.username,
            extra={"action": "logout", "username": principal.username},
        )
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(
        SESSION_COOKIE, path="/", secure=config.api.cookie_secure, httponly=True, samesite="lax"
    )
    return response
