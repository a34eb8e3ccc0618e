"""Connections and variables (``engine.authoring.connections``, ``variables``): their secret
parts are stored only as Fernet tokens.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from engine.db.models.base import Base, UtcDateTime, utcnow


class StoredConnection(Base):
    """A named connection; ``password`` and ``extra`` (JSON text) are Fernet tokens."""

    __tablename__ = "connection"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    conn_id: Mapped[str] = mapped_column(String(250), unique=True)
    conn_type: Mapped[str] = mapped_column(String(500))
    description: Mapped[str | None] = mapped_column(Text)
    host: Mapped[str | None] = mapped_column(String(500))
    schema: Mapped[str | None] = mapped_column(String(500))
    login: Mapped[str | None] = mapped_column(Text)
    password: Mapped[str | None] = mapped_column(Text)
    port: Mapped[int | None] = mapped_column(Integer)
    extra: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class StoredVariable(Base):
    """A named variable; ``val`` is a Fernet token of its text."""

    __tablename__ = "variable"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(250), unique=True)
    val: Mapped[str] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
