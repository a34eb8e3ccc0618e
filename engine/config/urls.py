"""The URLs of the configuration (the metadata database, the Celery broker and backend),
read with SQLAlchemy's URL parser, which talks to no database: checking one, redacting it,
and the secrets it holds. The one module of the configuration that knows that parser.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

REDACTED: Final = "***"


def check_url(value: str) -> bool:
    """True for a URL the parser reads; a ``ValueError`` otherwise."""
    try:
        make_url(value)
    except ArgumentError as exc:
        raise ValueError(str(exc)) from exc
    return True


def redact_url(value: str) -> str:
    try:
        url = make_url(value)
    except ArgumentError:
        return REDACTED
    hidden = {name: REDACTED for name in url.query if "password" in name.lower()}
    return url.update_query_dict(hidden).render_as_string(hide_password=True)


def url_secrets(text: str) -> list[str]:
    """The password of a URL and its ``?password=`` style parameters (psycopg's, say)."""
    if not text:
        return []
    try:
        url = make_url(text)
    except ArgumentError:
        return []
    values = [str(url.password)] if url.password else []
    for name, value in url.query.items():
        if "password" in name.lower():
            values += [value] if isinstance(value, str) else list(value)
    return values
