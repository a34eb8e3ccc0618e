"""Who am I, and API tokens over the API (the CLI has ``sluice tokens`` for the same).

- ``GET /me``: the caller's username, role and how it authenticated (with a session: its
  CSRF token, for scripts of the UI; no other origin can read it);
- ``GET /tokens``: the caller's tokens (an admin: everyone's, or ``?user=``), never a
  token's value or hash;
- ``POST /tokens``: a new token for the caller (an admin: for ``user``), shown once; only
  an admin may make one that never expires, and a token made with a (non-admin) token
  expires no later than that token;
- ``DELETE /tokens/{id}``: revoke one of the caller's tokens (an admin: anyone's);
- ``GET /users``: the users (admins only), never a password hash.
"""

from datetime import datetime, timedelta
from functools import partial
from typing import Annotated, Any, Final

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, Field

from engine.api import credentials
from engine.api.deps import ConfigDep, DatabaseDep
from engine.api.rest.common import Offset, RequestBody, RowId
from engine.api.security import AUTH_TOKEN, AdminDep, Principal, ReaderDep, UserDep
from engine.db.models import utcnow
from engine.db.queries import users as users_sql

router = APIRouter(tags=["auth"])

#: What ``credentials.parse_duration`` reads (a number and a unit), for the document.
DURATION_PATTERN: Final = r"^\s*[0-9]+(\.[0-9]+)?\s*[smhdw]\s*$"


class Me(BaseModel):
    username: str
    role: str
    auth: str = Field(description="token, session, or anonymous (with [api] open_read)")
    csrf_token: str | None = Field(
        default=None,
        description="With a session: the token to send as X-CSRF-Token with changes",
    )


class TokenRequest(RequestBody):
    name: str | None = Field(default=None, max_length=250, description="What the token is for")
    expires_in: str | None = Field(
        default=None,
        pattern=DURATION_PATTERN,
        description="Lifetime like 30d or 12h (at most 10 years); default [api] token_expiry_days",
    )
    no_expiry: bool = Field(default=False, description="A token that never expires (admins only)")
    user: str | None = Field(default=None, description="Whose token (admins only)")


class NewToken(BaseModel):
    id: int
    token: str = Field(description="The token; shown this once, stored only hashed")
    user: str
    name: str | None
    expires: datetime | None


@router.get("/me", response_model=Me)
async def me(principal: ReaderDep) -> Me:
    return Me(
        username=principal.username,
        role=principal.role,
        auth=principal.auth,
        csrf_token=principal.csrf,
    )


@router.get("/tokens")
async def list_tokens(
    principal: UserDep,
    database: DatabaseDep,
    user: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> dict[str, Any]:
    if user is not None and user != principal.username and not principal.can(credentials.ADMIN):
        raise HTTPException(403, "only an admin may list another user's tokens")
    owner = user if user is not None or principal.can(credentials.ADMIN) else principal.username
    rows = await database.read(partial(users_sql.list_tokens, now=utcnow(), username=owner))
    return {
        "items": rows[offset : offset + limit],
        "total": len(rows),
        "limit": limit,
        "offset": offset,
    }


def _expiry(request: TokenRequest, principal: Principal, default_days: float) -> datetime | None:
    """When the new token expires. Only an admin may make one that never expires; a token
    made with a token by anyone else may not outlive that token (its expiry is capped at
    the caller's); from a UI session the lifetime asked or the default applies."""
    if request.no_expiry and request.expires_in is not None:
        raise HTTPException(422, "give expires_in or no_expiry, not both")
    admin = principal.can(credentials.ADMIN)
    if request.no_expiry:
        if not admin:
            raise HTTPException(
                403, "only an admin may make a token that never expires: give expires_in"
            )
        return None
    try:
        lifetime = (
            credentials.parse_duration(request.expires_in)
            if request.expires_in is not None
            else timedelta(days=default_days)
        )
    except credentials.CredentialError as exc:
        raise HTTPException(422, f"expires_in: {exc}") from exc
    expires = utcnow() + lifetime
    caller_expires = principal.token_expires
    if not admin and principal.auth == AUTH_TOKEN and caller_expires is not None:
        expires = min(expires, caller_expires)
    return expires


@router.post("/tokens", status_code=201, response_model=NewToken)
async def create_token(
    body: TokenRequest, principal: UserDep, database: DatabaseDep, config: ConfigDep
) -> NewToken:
    owner = body.user or principal.username
    if owner != principal.username and not principal.can(credentials.ADMIN):
        raise HTTPException(403, "only an admin may make a token for another user")
    expires = _expiry(body, principal, config.api.token_expiry_days)
    token = credentials.new_token()
    add = partial(
        users_sql.add_token,
        username=owner,
        token_hash=credentials.digest(token),
        prefix=credentials.shown_prefix(token),
        name=body.name,
        expires_at=expires,
        now=utcnow(),
    )
    try:
        token_id = await database.run(add)
    except users_sql.UserError as exc:
        raise HTTPException(404, str(exc)) from exc
    return NewToken(id=token_id, token=token, user=owner, name=body.name, expires=expires)


@router.delete("/tokens/{token_id}", status_code=204)
async def revoke_token(token_id: RowId, principal: UserDep, database: DatabaseDep) -> Response:
    owner = await database.read(partial(users_sql.token_owner, token_id=token_id))
    if owner is None or not _may_manage(principal, owner):
        raise HTTPException(404, f"no token {token_id} of yours")
    await database.run(partial(users_sql.revoke_token, token_id=token_id, now=utcnow()))
    return Response(status_code=204)


def _may_manage(principal: Principal, owner: str) -> bool:
    return owner == principal.username or principal.can(credentials.ADMIN)


@router.get("/users")
async def list_users(principal: AdminDep, database: DatabaseDep) -> dict[str, Any]:
    rows = await database.read(partial(users_sql.list_users, now=utcnow()))
    return {"items": rows, "total": len(rows)}
