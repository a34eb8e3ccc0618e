"""Who may use the API and UI (``engine.api``): users, their API tokens and UI sessions (only
hashes of the secrets are stored).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from engine.db.models.base import Base, UtcDateTime, utcnow


class User(Base):
    """Who may use the API and UI; ``role`` is admin, op or viewer. ``password_hash`` is an
    Argon2id hash (``engine.api.credentials``) and never leaves the API process."""

    __tablename__ = "users"  # "user" is a reserved word in PostgreSQL

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(250), unique=True)
    role: Mapped[str] = mapped_column(String(20))
    password_hash: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ApiToken(Base):
    """A bearer token of a user: only its SHA-256 is stored, and a short prefix to tell
    tokens apart in listings. Revoked tokens are kept (``revoked_at``) so a listing says so."""

    __tablename__ = "api_token"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str | None] = mapped_column(String(250))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class UiSession(Base):
    """A UI login: the SHA-256 of the session cookie's value, the CSRF token of its forms and
    its expiry. In the database, so any API process behind a load balancer serves it and a
    logout ends it everywhere."""

    __tablename__ = "ui_session"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    session_hash: Mapped[str] = mapped_column(String(64), unique=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
