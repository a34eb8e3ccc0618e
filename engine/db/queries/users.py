"""SQL of users, API tokens and UI sessions (the API part's credentials).

Hashes come in already made (``engine.api.credentials``); nothing here hashes, verifies or
decides who may do what. Listings never include a password hash, a token hash or a
session's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import delete, func, select, update

from engine.db.database import rowcount
from engine.db.models import ApiToken, UiSession, User
from engine.exceptions import SluiceError

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy.orm import Session

TOKEN_ACTIVE: Final = "active"
TOKEN_EXPIRED: Final = "expired"
TOKEN_REVOKED: Final = "revoked"
TOKEN_UNKNOWN: Final = "unknown"


class UserError(SluiceError):
    """A user that exists already, or does not exist; the message names it."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a credential belongs to."""

    user_id: int
    username: str
    role: str


@dataclass(frozen=True, slots=True)
class TokenCheck:
    """What a bearer token is: ``state`` active, expired, revoked or unknown (then no
    identity)."""

    state: str
    identity: Identity | None = None
    token_id: int | None = None
    last_used_at: datetime | None = None
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class SessionCheck:
    """A live UI session: its user and the CSRF token of its forms."""

    session_id: int
    identity: Identity
    csrf_token: str
    expires_at: datetime


def _identity(user: User) -> Identity:
    return Identity(user_id=user.id, username=user.username, role=user.role)


def _user(session: Session, username: str) -> User | None:
    return session.execute(select(User).where(User.username == username)).scalar_one_or_none()


def _existing_user(session: Session, username: str) -> User:
    user = _user(session, username)
    if user is None:
        raise UserError(f"no user named {username!r} (`sluice users list` shows them)")
    return user


# --- users -------------------------------------------------------------------------------


def add_user(
    session: Session, *, username: str, role: str, password_hash: str, now: datetime
) -> int:
    if _user(session, username) is not None:
        raise UserError(f"a user named {username!r} exists already")
    user = User(
        username=username, role=role, password_hash=password_hash, created_at=now, updated_at=now
    )
    session.add(user)
    session.flush()
    return int(user.id)


def user_login(session: Session, username: str) -> tuple[Identity, str] | None:
    """The identity and stored password hash of ``username`` (for a login only)."""
    user = _user(session, username)
    return None if user is None else (_identity(user), user.password_hash)


def count_users(session: Session) -> int:
    return int(session.execute(select(func.count()).select_from(User)).scalar_one())


def list_users(session: Session, *, now: datetime) -> list[dict[str, Any]]:
    """Every user: name, role, dates and how many of its tokens are active."""
    active = (
        select(ApiToken.user_id, func.count().label("n"))
        .where(ApiToken.revoked_at.is_(None))
        .where((ApiToken.expires_at.is_(None)) | (ApiToken.expires_at > now))
        .group_by(ApiToken.user_id)
        .subquery()
    )
    rows = session.execute(
        select(User, func.coalesce(active.c.n, 0))
        .outerjoin(active, active.c.user_id == User.id)
        .order_by(User.username)
    )
    return [
        {
            "username": user.username,
            "role": user.role,
            "created": user.created_at.isoformat(),
            "updated": user.updated_at.isoformat(),
            "active_tokens": int(count),
        }
        for user, count in rows
    ]


def delete_user(session: Session, username: str) -> None:
    """Delete ``username`` with its tokens and sessions."""
    user = _existing_user(session, username)
    session.execute(delete(ApiToken).where(ApiToken.user_id == user.id))
    session.execute(delete(UiSession).where(UiSession.user_id == user.id))
    session.delete(user)


def set_password_hash(
    session: Session, username: str, password_hash: str, *, now: datetime, end_sessions: bool = True
) -> None:
    """Change the stored hash; with ``end_sessions`` (a new password) the user's UI sessions
    end too (tokens stay: revoke them apart)."""
    user = _existing_user(session, username)
    user.password_hash, user.updated_at = password_hash, now
    if end_sessions:
        session.execute(delete(UiSession).where(UiSession.user_id == user.id))


def set_role(session: Session, username: str, role: str, *, now: datetime) -> None:
    user = _existing_user(session, username)
    user.role, user.updated_at = role, now


# --- API tokens ------------------------------------------------------------------------


def add_token(
    session: Session,
    *,
    username: str,
    token_hash: str,
    prefix: str,
    name: str | None,
    expires_at: datetime | None,
    now: datetime,
) -> int:
    user = _existing_user(session, username)
    token = ApiToken(
        user_id=user.id,
        name=name,
        token_hash=token_hash,
        prefix=prefix,
        created_at=now,
        expires_at=expires_at,
    )
    session.add(token)
    session.flush()
    return int(token.id)


def check_token(session: Session, token_hash: str, *, now: datetime) -> TokenCheck:
    row = session.execute(
        select(ApiToken, User)
        .join(User, User.id == ApiToken.user_id)
        .where(ApiToken.token_hash == token_hash)
    ).one_or_none()
    if row is None:
        return TokenCheck(TOKEN_UNKNOWN)
    token, user = row
    state = _token_state(token, now)
    return TokenCheck(state, _identity(user), token.id, token.last_used_at, token.expires_at)


def _token_state(token: ApiToken, now: datetime) -> str:
    if token.revoked_at is not None:
        return TOKEN_REVOKED
    if token.expires_at is not None and token.expires_at <= now:
        return TOKEN_EXPIRED
    return TOKEN_ACTIVE


def touch_token(session: Session, token_id: int, *, now: datetime) -> None:
    session.execute(update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=now))


def list_tokens(
    session: Session, *, now: datetime, username: str | None = None
) -> list[dict[str, Any]]:
    """Tokens (of ``username``, or everyone's), newest first; never the token or its hash."""
    query = select(ApiToken, User.username).join(User, User.id == ApiToken.user_id)
    if username is not None:
        query = query.where(User.username == username)
    rows = session.execute(query.order_by(ApiToken.id.desc()))
    return [_token_row(token, owner, now) for token, owner in rows]


def _token_row(token: ApiToken, owner: str, now: datetime) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat()

    return {
        "id": token.id,
        "user": owner,
        "name": token.name,
        "prefix": token.prefix,
        "state": _token_state(token, now),
        "created": iso(token.created_at),
        "expires": iso(token.expires_at),
        "last_used": iso(token.last_used_at),
        "revoked": iso(token.revoked_at),
    }


def token_owner(session: Session, token_id: int) -> str | None:
    """The username of token ``token_id``; None when there is no such token."""
    query = select(User.username).join(ApiToken, ApiToken.user_id == User.id)
    return session.execute(query.where(ApiToken.id == token_id)).scalar_one_or_none()


def revoke_token(session: Session, token_id: int, *, now: datetime) -> bool:
    """Revoke token ``token_id`` (once: the first revocation's time is kept); False when
    there is no such token."""
    if session.get(ApiToken, token_id) is None:
        return False
    session.execute(
        update(ApiToken)
        .where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    return True


# --- UI sessions -----------------------------------------------------------------------


def add_session(
    session: Session,
    *,
    user_id: int,
    session_hash: str,
    csrf_token: str,
    now: datetime,
    expires_at: datetime,
) -> None:
    session.add(
        UiSession(
            user_id=user_id,
            session_hash=session_hash,
            csrf_token=csrf_token,
            created_at=now,
            expires_at=expires_at,
        )
    )


def check_session(session: Session, session_hash: str, *, now: datetime) -> SessionCheck | None:
    """The live session whose cookie hashes to ``session_hash``; None if unknown or expired."""
    row = session.execute(
        select(UiSession, User)
        .join(User, User.id == UiSession.user_id)
        .where(UiSession.session_hash == session_hash, UiSession.expires_at > now)
    ).one_or_none()
    if row is None:
        return None
    ui_session, user = row
    return SessionCheck(
        ui_session.id, _identity(user), ui_session.csrf_token, ui_session.expires_at
    )


def end_session(session: Session, session_hash: str) -> bool:
    return (
        rowcount(session.execute(delete(UiSession).where(UiSession.session_hash == session_hash)))
        > 0
    )


def delete_expired_sessions(session: Session, *, now: datetime) -> int:
    return rowcount(session.execute(delete(UiSession).where(UiSession.expires_at <= now)))
