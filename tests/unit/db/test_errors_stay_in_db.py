"""SQLAlchemy's exceptions stay inside ``engine.db``: it raises the engine's own
(``DatabaseUnavailable``, ``DatabaseError``) with SQLAlchemy's as ``__cause__``, so no other
part catches or tells apart a driver's error. import-linter cannot forbid a submodule of an
external package (``sqlalchemy.exc``), hence this test over the source tree."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError

from engine.db.database import database_error, translated_errors
from engine.exceptions import DatabaseError, DatabaseUnavailable

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("engine", "triggers", "shared_stream", "producers")
#: config reads its URLs (``[core] sql_alchemy_conn``, the Celery broker's) with SQLAlchemy's
#: URL parser and turns its ``ArgumentError`` into the setting's own error: it talks to no
#: database.
ALLOWED = {"engine/config/urls.py"}


def _imports_sqlalchemy_exc(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            alias.name.startswith("sqlalchemy.exc") for alias in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.startswith("sqlalchemy.exc"):
                return True
            if node.module == "sqlalchemy" and any(a.name == "exc" for a in node.names):
                return True
    return False


def test_no_module_outside_engine_db_imports_sqlalchemy_exc() -> None:
    offenders = [
        relative
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if not (relative := path.relative_to(ROOT).as_posix()).startswith("engine/db/")
        and relative not in ALLOWED
        and _imports_sqlalchemy_exc(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert offenders == []


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (OperationalError("SELECT 1", {}, Exception("connection refused")), DatabaseUnavailable),
        (
            DBAPIError("SELECT 1", {}, Exception("server closed"), connection_invalidated=True),
            DatabaseUnavailable,
        ),
        (IntegrityError("INSERT", {}, Exception("duplicate key")), DatabaseError),
    ],
)
def test_sqlalchemy_errors_come_out_as_the_engines(error: SQLAlchemyError, kind: type) -> None:
    assert type(database_error(error)) is kind
    with pytest.raises(kind) as raised, translated_errors():
        raise error
    assert raised.value.__cause__ is error
