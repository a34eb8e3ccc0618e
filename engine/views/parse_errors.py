"""DAG files that failed to parse (Airflow's import errors): what ``sluice dags errors``,
the DAG list's banner and the UI's ``/import-errors`` page show.

The DAG processor keeps one row per failing file (``engine.db.queries.dags``); a DAG of
that file keeps running from its last good version meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from engine.db.queries import dags as dags_sql
from engine.db.queries import why as why_sql
from engine.views.common import iso

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


class ParseErrorItem(TypedDict):
    file: str
    line: int | None
    error: str
    stacktrace: str | None
    at: str | None  # when the processor last tried the file (ISO)


def list_parse_errors(session: Session) -> list[ParseErrorItem]:
    """Every failing DAG file, by path, with the error's line, message and stack trace."""
    return [
        {
            "file": e.fileloc,
            "line": e.lineno,
            "error": e.error,
            "stacktrace": e.stacktrace,
            "at": iso(e.timestamp),
        }
        for e in dags_sql.list_parse_errors(session)
    ]


def parse_error_count(session: Session) -> int:
    """How many DAG files fail to parse (the DAG list's banner)."""
    return why_sql.parse_error_count(session)
