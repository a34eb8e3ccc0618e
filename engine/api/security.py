"""Who is calling, and what they may do: the FastAPI dependencies of every route.

A request authenticates with ``Authorization: Bearer <token>`` (API clients) or with the UI
session cookie (browsers); both are looked up in the metadata database by the SHA-256 of
their value (``engine.db.queries.users``), so any API process serves any client.

- REST routes depend on ``require_reader`` (any user; nobody at all with ``[api]
  open_read``), ``require_operator`` (op or admin) or ``require_admin``. Missing, unknown,
  expired or revoked credentials give 401; a role too low gives 403.
- UI pages depend on ``ui_reader`` / ``ui_operator``: a visitor who is not logged in is
  redirected to ``/login?next=<page>`` instead.
- CSRF: a request authenticated by the session cookie that changes something (not GET,
  HEAD or OPTIONS) must carry the session's CSRF token, in the form field ``csrf_token`` or
  the header ``X-CSRF-Token``; ``require_*`` and ``ui_operator`` check it, ``verify_csrf``
  checks it for other form posts. A bearer-token request needs none: a browser never adds
  that header on its own. Templates get the token from ``csrf_token(request)``.

Route modules do not use ``from __future__ import annotations``: FastAPI reads their
parameter annotations at run time.
"""

import logging
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Annotated, Any, Final
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPBearer

from engine.api.credentials import ADMIN, OPERATOR, VIEWER, digest, role_at_least
from engine.api.deps import get_config, get_database
from engine.db.models import utcnow
from engine.db.queries import users as users_sql
from engine.exceptions import DatabaseError

logger = logging.getLogger(__name__)

SESSION_COOKIE: Final = "sluice_session"
LOGIN_CSRF_COOKIE: Final = "sluice_login_csrf"
CSRF_FIELD: Final = "csrf_token"
CSRF_HEADER: Final = "X-CSRF-Token"
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
TOKEN_TOUCH_INTERVAL: Final = timedelta(minutes=5)  # how stale a token's last_used_at may get
AUTH_TOKEN: Final = "token"
AUTH_SESSION: Final = "session"
AUTH_ANONYMOUS: Final = "anonymous"
LOGIN_HINT: Final = (
    "log in, or send 'Authorization: Bearer <token>' (make one with `sluice tokens create "
    "--user USER`)"
)
_TOKEN_PROBLEMS: Final = {
    users_sql.TOKEN_UNKNOWN: "invalid API token",
    users_sql.TOKEN_EXPIRED: "the API token has expired; make a new one: `sluice tokens create`",
    users_sql.TOKEN_REVOKED: "the API token was revoked",
}
_PRINCIPAL_STATE: Final = "sluice_principal"
_NOT_LOOKED_UP: Final = object()

# Declares the bearer scheme in the OpenAPI document; the header is parsed below.
_bearer_scheme = HTTPBearer(auto_error=False, description="An API token: `sluice tokens create`")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as: a user (by token or session), or nobody (``open_read``)."""

    username: str
    role: str
    auth: str = AUTH_ANONYMOUS
    csrf: str | None = field(default=None, repr=False)  # the session's CSRF token
    session_id: int | None = None
    token_id: int | None = None
    #: With a token: when it expires (None: never); a token it makes may not outlive it.
    token_expires: datetime | None = None

    @property
    def is_authenticated(self) -> bool:
        return self.auth != AUTH_ANONYMOUS

    def can(self, role: str) -> bool:
        """Whether this principal has ``role`` or a higher one."""
        return self.is_authenticated and role_at_least(self.role, role)


ANONYMOUS: Final = Principal(username="anonymous", role=VIEWER, auth=AUTH_ANONYMOUS)


class LoginRequiredError(Exception):
    """A UI page needs a logged-in user; the application redirects to the login page."""

    def __init__(self, next_url: str) -> None:
        super().__init__(next_url)
        self.next_url = next_url

    @property
    def location(self) -> str:
        return f"/login?next={quote(self.next_url, safe='/')}"


def unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": 'Bearer realm="sluice"'})


def forbidden(detail: str) -> HTTPException:
    return HTTPException(403, detail)


# --- looking up the caller --------------------------------------------------------------


async def current_principal(request: Request) -> Principal | None:
    """The user of ``request`` (bearer token first, else the session cookie), looked up once
    per request; None when it carries neither. A bearer token that is not valid is a 401."""
    cached = getattr(request.state, _PRINCIPAL_STATE, _NOT_LOOKED_UP)
    if cached is not _NOT_LOOKED_UP:
        return cached if isinstance(cached, Principal) else None
    header = request.headers.get("authorization")
    if header is not None:
        principal: Principal | None = await _token_principal(request, header)
    else:
        principal = await _session_principal(request)
    setattr(request.state, _PRINCIPAL_STATE, principal)
    return principal


def principal_of(request: Request) -> Principal | None:
    """The principal ``current_principal`` found for ``request`` (None if not looked up)."""
    cached = getattr(request.state, _PRINCIPAL_STATE, None)
    return cached if isinstance(cached, Principal) else None


async def _token_principal(request: Request, header: str) -> Principal:
    scheme, _, value = header.partition(" ")
    token = value.strip()
    if scheme.lower() != "bearer" or not token:
        raise unauthorized("the Authorization header must be 'Bearer <token>'")
    db, now = get_database(request), utcnow()
    check = await db.read(partial(users_sql.check_token, token_hash=digest(token), now=now))
    if check.state != users_sql.TOKEN_ACTIVE or check.identity is None:
        raise unauthorized(_TOKEN_PROBLEMS.get(check.state, "invalid API token"))
    assert check.token_id is not None
    if check.last_used_at is None or now - check.last_used_at > TOKEN_TOUCH_INTERVAL:
        await _touch_token(request, check.token_id)
    identity = check.identity
    return Principal(
        identity.username,
        identity.role,
        AUTH_TOKEN,
        token_id=check.token_id,
        token_expires=check.expires_at,
    )


async def _touch_token(request: Request, token_id: int) -> None:
    """Record that a token was used (at most every few minutes: it is a write)."""
    try:
        await get_database(request).run(
            partial(users_sql.touch_token, token_id=token_id, now=utcnow())
        )
    except DatabaseError as exc:  # bookkeeping only: the request goes on
        logger.warning(
            "Could not record the use of API token %s: %s",
            token_id,
            exc,
            extra={"action": "token_touch_failed", "token_id": token_id},
        )


async def _session_principal(request: Request) -> Principal | None:
    cookie = request.cookies.get(SESSION_COOKIE)
    if not cookie:
        return None
    lookup = partial(users_sql.check_session, session_hash=digest(cookie), now=utcnow())
    found = await get_database(request).read(lookup)
    if found is None:
        return None
    identity = found.identity
    return Principal(
        identity.username,
        identity.role,
        AUTH_SESSION,
        csrf=found.csrf_token,
        session_id=found.session_id,
    )


# --- CSRF ---------------------------------------------------------------------------------


async def _submitted_csrf(request: Request) -> str:
    header = request.headers.get(CSRF_HEADER)
    if header:
        return header
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form()  # cached on the request: the route reads it again
        value = form.get(CSRF_FIELD)
        return value if isinstance(value, str) else ""
    return ""


async def check_csrf(request: Request, principal: Principal) -> None:
    """403 unless ``request`` carries ``principal``'s session CSRF token."""
    submitted = await _submitted_csrf(request)
    expected = principal.csrf or ""
    if not expected or not secrets.compare_digest(submitted.encode(), expected.encode()):
        raise forbidden(
            f"missing or invalid CSRF token: send the form field {CSRF_FIELD!r} or the header "
            f"{CSRF_HEADER!r} with the token of your session (reload the page and try again)"
        )


def csrf_token(request: Request) -> str:
    """The CSRF token to put in the forms of a page: the session's, or on the login page
    the one of its login-form cookie; empty when there is neither."""
    principal = principal_of(request)
    if principal is not None and principal.csrf:
        return principal.csrf
    login: str | None = getattr(request.state, "login_csrf", None)
    return login or request.cookies.get(LOGIN_CSRF_COOKIE, "")


async def verify_csrf(request: Request) -> Principal:
    """For a UI form post: the logged-in user, after checking the form's CSRF token (403
    without a session or a valid token)."""
    principal = await current_principal(request)
    if principal is None or principal.auth != AUTH_SESSION:
        raise forbidden("this form needs a logged-in session: log in and try again")
    await check_csrf(request, principal)
    return principal


# --- REST dependencies ------------------------------------------------------------------


async def require_reader(
    request: Request, _bearer: Annotated[Any, Depends(_bearer_scheme)] = None
) -> Principal:
    """Any logged-in user; nobody at all for reading when ``[api] open_read`` is on."""
    principal = await current_principal(request)
    if principal is not None:
        return principal
    if request.method in SAFE_METHODS and get_config(request).api.open_read:
        return ANONYMOUS
    raise unauthorized(f"authentication required: {LOGIN_HINT}")


def _require(role: str) -> Any:
    async def dependency(
        request: Request, _bearer: Annotated[Any, Depends(_bearer_scheme)] = None
    ) -> Principal:
        principal = await current_principal(request)
        if principal is None:
            raise unauthorized(f"authentication required: {LOGIN_HINT}")
        _check_role(principal, role)
        if principal.auth == AUTH_SESSION and request.method not in SAFE_METHODS:
            await check_csrf(request, principal)
        return principal

    dependency.__name__ = f"require_{role}"
    return dependency


def _check_role(principal: Principal, role: str) -> None:
    if not principal.can(role):
        needed = "admin" if role == ADMIN else f"{role} or admin" if role == OPERATOR else role
        raise forbidden(
            f"user {principal.username!r} has role {principal.role!r}; this needs {needed}"
        )


require_user = _require(VIEWER)
"""Any logged-in user (never anonymous); CSRF-checked like the others."""
require_operator = _require(OPERATOR)
require_admin = _require(ADMIN)


# --- UI dependencies ----------------------------------------------------------------------


def _next_url(request: Request) -> str:
    if request.method not in SAFE_METHODS:
        return "/"
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


async def ui_reader(request: Request) -> Principal:
    """A page anyone logged in may see (anyone at all with ``open_read``); otherwise a
    redirect to the login page."""
    principal = await current_principal(request)
    if principal is not None:
        return principal
    if request.method in SAFE_METHODS and get_config(request).api.open_read:
        return ANONYMOUS
    raise LoginRequiredError(_next_url(request))


async def ui_operator(request: Request) -> Principal:
    """A page or form action for op and admin users (403 for a viewer); a form post must
    carry the session's CSRF token."""
    principal = await current_principal(request)
    if principal is None:
        raise LoginRequiredError(_next_url(request))
    _check_role(principal, OPERATOR)
    if principal.auth == AUTH_SESSION and request.method not in SAFE_METHODS:
        await check_csrf(request, principal)
    return principal


ReaderDep = Annotated[Principal, Depends(require_reader)]
UserDep = Annotated[Principal, Depends(require_user)]
OperatorDep = Annotated[Principal, Depends(require_operator)]
AdminDep = Annotated[Principal, Depends(require_admin)]
UiReaderDep = Annotated[Principal, Depends(ui_reader)]
UiOperatorDep = Annotated[Principal, Depends(ui_operator)]
